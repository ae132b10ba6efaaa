"""A daily update, warm: each system's change applied, flushed and exported in a
process that keeps running.

    python -m benchmarks.update_warm --round DIR --statements N [--seed S] [--peer-first]

``DIR`` is a round folder (``round-1``) that ``benchmarks.update --peer --keep``
left: both systems' lakes hold the same base, fully exported, and the same 1%
change flushed and exported. Here each system gets one long-lived Python
process, as a tenant's application that writes, flushes and exports through
the system's Python API in one process would: it applies a first 1% change
(seed ``S``), flushes and exports it, not timed (its imports done,
followthemoney's model loaded, the lake's files read once), then a second one
(seed ``S + 1``, other entities), each step timed inside the process. The same
two changes, by the same entity ids, for both systems, one system after the
other (``--peer-first`` to swap the order).

"Warm" here is a warm Python process, not a Spark server: neither our flush
of such a change nor our incremental export starts Spark (the driver paths),
so a Spark Connect server changes nothing for them (``update.py --warm``
measures that). The peer (ftm-lakehouse, DuckDB) has no server either; its
warm figure is the same kind of process, through its own Python API
(``add_many`` and ``delete_entity``, then its repository's ``flush`` and
``operation.export``, what its CLI's ``maintenance flush`` and ``export``
call). Prints a Markdown table; nothing is asserted but both systems ending
with the same number of entities and our export being incremental.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.data import write as write_data
from benchmarks.peer import (
    DATASET,
    OURS,
    PEER,
    PEER_VENV,
    PEER_VERSION,
    MiB,
    count_lines,
    git_version,
    ours,
    peer,
    run,
    say,
)
from benchmarks.update import ORIGIN, change

#: Our worker: the Python API of ``lakehouse_assets`` on the lake and journal its
#: environment names (``peer.ours``); argv: dataset, origin, the changes as JSON
#: [[entities file, deleted ids file], ...].
OURS_WARM = """
import json, sys, time
from lakehouse_assets.lake import Lakehouse
name, origin, plan = sys.argv[1:4]
ds = Lakehouse().dataset(name)
out = []
for changed, deleted in json.loads(plan):
    ids = json.loads(open(deleted).read())
    t0 = time.perf_counter()
    with open(changed, "rb") as fh:
        ds.write_entities(fh, origin=origin)
    ds.delete_entities(ids)
    t1 = time.perf_counter()
    ds.flush()
    t2 = time.perf_counter()
    result = ds.export(["statements", "entities", "statistics", "index"])
    t3 = time.perf_counter()
    out.append({"apply": t1 - t0, "flush": t2 - t1, "exports": t3 - t2, "mode": result.mode})
print(json.dumps(out))
"""

#: The peer's worker: its Python API; argv: dataset, origin, the changes as JSON.
PEER_WARM = """
import json, sys, time
from ftmq.io import smart_read_proxies
from ftm_lakehouse import get_entities
from ftm_lakehouse import operation as op
from ftm_lakehouse.lake import get_lakehouse
name, origin, plan = sys.argv[1:4]
uri = get_lakehouse(None).dataset_uri(name)
entities = get_entities(name, uri)
out = []
for changed, deleted in json.loads(plan):
    ids = json.loads(open(deleted).read())
    t0 = time.perf_counter()
    entities.add_many(smart_read_proxies(changed), origin=origin)
    for entity_id in ids:
        entities.delete_entity(entity_id)
    t1 = time.perf_counter()
    entities.flush()
    t2 = time.perf_counter()
    op.export(name, uri, force=False)
    t3 = time.perf_counter()
    out.append({"apply": t1 - t0, "flush": t2 - t1, "exports": t3 - t2, "mode": "its export"})
print(json.dumps(out))
"""

STEPS = ("apply", "flush", "exports")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--round", type=Path, required=True, help="a kept round-N folder")
    parser.add_argument("--statements", type=int, required=True, help="the base's N")
    parser.add_argument("--seed", type=int, default=200, help="the first change; +1 the timed one")
    parser.add_argument("--peer-first", action="store_true")
    args = parser.parse_args()
    data = write_data(
        Path(__file__).resolve().parent / ".data" / f"kek-{args.statements}.ftm.json",
        args.statements,
    )
    work = args.round / f"warm-{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    plan = []
    sizes = []
    for seed in (args.seed, args.seed + 1):
        changed = work / f"change-{seed}.ftm.json"
        gone, new, again = change(data, changed, seed=seed)
        ids = work / f"deleted-{seed}.json"
        ids.write_text(json.dumps(gone))
        plan.append([str(changed), str(ids)])
        sizes.append((new, again, len(gone)))
    unused = Path(os.devnull)
    systems = {
        OURS: ours(args.round / OURS, data, unused, work / "cache", None),
        PEER: peer(args.round / PEER, data, unused),
    }
    commands = {
        OURS: [sys.executable, "-c", OURS_WARM, DATASET, ORIGIN, json.dumps(plan)],
        PEER: [
            str(PEER_VENV / "bin" / "python"),
            "-c",
            PEER_WARM,
            DATASET,
            ORIGIN,
            json.dumps(plan),
        ],
    }
    load = os.getloadavg()
    started = datetime.now(UTC)
    figures: dict[str, list[dict[str, float | str]]] = {}
    memory: dict[str, int] = {}
    for name in (PEER, OURS) if args.peer_first else (OURS, PEER):
        system = systems[name]
        done = run(commands[name], env=system.env, cwd=system.cwd, logs=work / name, name="warm")
        if not done.ok:
            sys.exit(f"{name}: exit {done.returncode}\n{done.stderr_tail()}")
        figures[name] = json.loads(done.stdout.read_text().strip().splitlines()[-1])
        memory[name] = done.peak_rss
        say(f"{name}: {figures[name]}")
    entities = {name: count_lines(system.entities_json) for name, system in systems.items()}
    end = os.getloadavg()
    new, again, deleted = sizes[1]
    print(
        f"\n{started:%Y-%m-%d %H:%M} UTC, commit {git_version()}, peer ftm-lakehouse "
        f"{PEER_VERSION}, {args.statements:,} statements, load {load[0]:.1f} at the start, "
        f"{end[0]:.1f} at the end; the timed change: {new} new, {again} written again, "
        f"{deleted} deleted entities; order: {'peer, ours' if args.peer_first else 'ours, peer'}\n"
    )
    print("| step (warm: one process per system, its second change) | peer | ours | ours/peer |")
    print("|---|---|---|---|")
    timed = {name: figures[name][1] for name in figures}
    for step in STEPS:
        p, o = float(timed[PEER][step]), float(timed[OURS][step])
        print(f"| {step} | {p:.2f} s | {o:.2f} s | {o / p:.2f} |")
    p = sum(float(timed[PEER][s]) for s in ("flush", "exports"))
    o = sum(float(timed[OURS][s]) for s in ("flush", "exports"))
    print(f"| **flush + exports** | **{p:.2f} s** | **{o:.2f} s** | **{o / p:.2f}** |")
    print(
        f"| peak RSS of the whole process | {memory[PEER] / MiB:,.0f} MiB | "
        f"{memory[OURS] / MiB:,.0f} MiB | |"
    )
    first = {name: figures[name][0] for name in figures}
    print(
        "\nThe first (warming) change, for comparison: flush + exports "
        f"peer {float(first[PEER]['flush']) + float(first[PEER]['exports']):.2f} s, "
        f"ours {float(first[OURS]['flush']) + float(first[OURS]['exports']):.2f} s. "
        f"Our exports: {', '.join(str(f['mode']) for f in figures[OURS])}. "
        f"Entities at the end: peer {entities[PEER]}, ours {entities[OURS]}."
    )
    if entities[PEER] != entities[OURS] or any(f["mode"] != "incremental" for f in figures[OURS]):
        sys.exit(1)


if __name__ == "__main__":
    main()
