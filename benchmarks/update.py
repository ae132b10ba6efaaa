"""A daily update of a dataset: a 1% change after a full export, flushed and exported.

    python -m benchmarks.update --statements 1000000

Builds a base of N statements of scaled kek data (``benchmarks/data.py``) in a
fresh lake: write, flush, export (the full pass, which leaves the state an
incremental export starts from). Then the change of issue 34, by entities of
the base: 0.5% new entities (copies of base entities under new ids), 0.3%
written again with one more value, 0.2% deleted, each through the CLI (the
user's API). Then, timed, each its own process (cold: every step that runs
Spark starts its own JVM, unless ``LAKEHOUSE_SPARK_REMOTE`` points at a warm
server; a small flush and a small change's incremental export run none):

1. write + delete of the change;
2. flush (the change feed recorded with it);
3. all exports: incremental, from the last export and the change feed;
4. all exports again with ``--force``: the full pass over the same snapshot,
   what every export cost before incremental exports (the reference the
   byte-identity tests compare with; its files are compared here too).

Prints the figures as a Markdown table. Numbers only; nothing is asserted
but the byte identity of step 3's and step 4's files.

Side by side with the peer (ftm-lakehouse 0.9.0, installed as
``benchmarks/peer.py`` installs it)::

    python -m benchmarks.update --peer --statements 1000000 [--rounds 2] [--warm]

Both systems, each in a fresh lake of its own, get the same base and the same
change (the same entity ids), each through its own API: ours through the CLI
(``entities write``, then ``entities delete`` of the ids), the peer through its
Python API in one process (``add_many`` of the change file, then
``delete_entity`` of each id: its CLI has no journal write and no delete).
Every step is a fresh process, timed from here with the peak resident set of
its whole process tree (``peer.py``'s sampler); the systems alternate step by
step (round 1: ours, then the peer; round 2: the peer, then ours). The base
(write, flush, the first full export) is timed too; then the change, its
flush and all exports (ours: incremental; the peer: its ``export``, which
writes every export again), and ours once more with ``export --force``, the
full rebuild of the same snapshot. ``--warm`` runs ours on a Spark Connect
server started first (not counted; ours' peak memory then includes the
server's); the peer has no server, so its steps are the same cold processes
and the table labels them so. Checks that both ended with the same number of
entities and that our incremental files equal our full rebuild's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.data import KEK_STATEMENTS
from benchmarks.data import write as write_data
from benchmarks.peer import DATASET as SIDE_BY_SIDE_DATASET
from benchmarks.peer import (
    DUCKDB_VERSION,
    OURS,
    PEER,
    PEER_VENV,
    PEER_VERSION,
    SYSTEMS,
    MiB,
    SparkServer,
    System,
    class_archive,
    count_lines,
    ensure_peer,
    git_version,
    median,
    on_signal,
    ours,
    peer,
    run,
    say,
)

DATASET = "update_bench"
ORIGIN = "bench"
FILES = ("exports/statements.csv", "entities.ftm.json", "exports/statistics.json")
DATA_DIR = Path(__file__).resolve().parent / ".data"


def lakehouse() -> str:
    beside = Path(sys.executable).with_name("lakehouse")
    return str(beside) if beside.exists() else "lakehouse"


def timed(args: list[str], env: dict[str, str], log: Path) -> float:
    start = time.monotonic()
    with log.open("ab") as out:
        done = subprocess.run(args, env=env, stdout=out, stderr=out, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:6])} ... failed (exit {done.returncode}); see {log}")
    return seconds


def digests(dataset: Path) -> dict[str, str]:
    """The sha256 of each of the three exports of the dataset folder ``dataset``."""
    return {f: hashlib.sha256((dataset / f).read_bytes()).hexdigest() for f in FILES}


def change(base: Path, out: Path, seed: int, scale: float = 1.0) -> tuple[list[str], int, int]:
    """The change file (new and re-written entities) and the ids to delete: 0.5%
    new, 0.3% re-written with one more value, 0.2% deleted, ``scale`` times that."""
    entities = [json.loads(line) for line in base.open("rb")]
    rng = random.Random(seed)
    rng.shuffle(entities)
    n = len(entities)
    new, again, gone = (max(1, int(n * share * scale / 1000)) for share in (5, 3, 2))
    with out.open("w") as fh:
        for e in entities[:new]:
            fh.write(json.dumps({**e, "id": f"{e['id']}-new"}) + "\n")
        for e in entities[new : new + again]:
            props = {k: list(v) for k, v in e.get("properties", {}).items()}
            props.setdefault("summary", []).append("updated today")
            fh.write(json.dumps({**e, "properties": props}) + "\n")
    return [str(e["id"]) for e in entities[new + again : new + again + gone]], new, again


def ours_only(args: argparse.Namespace) -> None:
    data = write_data(DATA_DIR / f"kek-{args.statements}.ftm.json", args.statements)
    root = args.base or Path(tempfile.mkdtemp(prefix="update-bench-", dir=args.workdir))
    lake, log = root / "lake", root / "steps.log"
    url = f"sqlite:///{root / 'journal.sqlite'}"
    env = {**os.environ, "LAKEHOUSE_LAKE_URI": str(lake), "LAKEHOUSE_JOURNAL_URL": url}
    cli = [lakehouse(), "--lake", str(lake), "--journal-url", url]
    on = [*cli, "-d", DATASET]
    figures: dict[str, float] = {}
    try:
        if args.base is None:
            timed([*cli, "datasets", "create", DATASET], env, log)
            load = [*on, "entities", "write", "-i", str(data), "-o", ORIGIN]
            figures["base write"] = timed(load, env, log)
            figures["base flush"] = timed([*on, "flush"], env, log)
            figures["base exports (full)"] = timed([*on, "export"], env, log)
        changed = root / f"change-{args.seed}.ftm.json"
        deleted, new, again = change(data, changed, seed=args.seed)
        write = timed([*on, "entities", "write", "-i", str(changed), "-o", ORIGIN], env, log)
        figures["apply the change (write + delete)"] = write + timed(
            [*on, "entities", "delete", *deleted], env, log
        )
        figures["flush"] = timed([*on, "flush"], env, log)
        figures["all exports (incremental)"] = timed([*on, "export"], env, log)
        incremental = digests(lake / DATASET)
        figures["all exports (full rebuild, --force)"] = timed([*on, "export", "--force"], env, log)
        same = incremental == digests(lake / DATASET)
    finally:
        if not args.keep and args.base is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{args.statements:,} statements; change: {new} new, {again} written again, "
        f"{len(deleted)} deleted entities; incremental files identical to the full "
        f"rebuild: {same}\n"
    )
    print("| step | seconds |\n|---|---|")
    for step, seconds in figures.items():
        print(f"| {step} | {seconds:.1f} |")
    total = figures["flush"] + figures["all exports (incremental)"]
    print(f"| **flush + exports (incremental)** | **{total:.1f}** |")
    print(
        f"| flush + exports (full rebuild) | "
        f"{figures['flush'] + figures['all exports (full rebuild, --force)']:.1f} |"
    )


# --- side by side with the peer -------------------------------------------------------------

#: The peer's way to apply a change, as its users would: its Python API, one process
#: (its CLI has no journal write and no delete). argv: dataset, change file, origin,
#: a JSON list of the ids to delete.
PEER_APPLY = """
import json, sys
from ftmq.io import smart_read_proxies
from ftm_lakehouse import get_entities
entities = get_entities(sys.argv[1])
entities.add_many(smart_read_proxies(sys.argv[2]), origin=sys.argv[3])
for entity_id in json.loads(open(sys.argv[4]).read()):
    entities.delete_entity(entity_id)
"""

#: Each step of the workload, in order; a step may be several processes.
STEPS = ("base_write", "base_flush", "base_exports", "apply", "flush", "exports", "rebuild")
CHANGE_STEPS = ("apply", "flush", "exports")


@dataclass
class StepFigures:
    """One step of one system: its processes' seconds added up, the highest peak."""

    seconds: float
    memory: int  # peak RSS of the process tree (warm ours: plus the server's tree)
    ok: bool


@dataclass
class UpdateRound:
    number: int
    order: tuple[str, ...]
    steps: dict[str, dict[str, StepFigures]] = field(default_factory=dict)
    entities: dict[str, int | None] = field(default_factory=dict)
    identical: bool | None = None  # our incremental files == our full rebuild's
    export_mode: str = "?"  # what our export of the change said it did
    failures: list[str] = field(default_factory=list)


def update_commands(
    system: System, data: Path, changed: Path, deleted: list[str], deleted_json: Path
) -> dict[str, list[list[str]]]:
    """The workload's processes for ``system`` (``peer.py``'s ours() or peer())."""
    if system.name == OURS:
        on = system.cli
        return {
            "base_write": [[*on, "entities", "write", "-i", str(data), "-o", ORIGIN]],
            "base_flush": [[*on, "flush"]],
            "base_exports": [[*on, "export"]],
            "apply": [
                [*on, "entities", "write", "-i", str(changed), "-o", ORIGIN],
                [*on, "entities", "delete", *deleted],
            ],
            "flush": [[*on, "flush"]],
            "exports": [[*on, "export", "--json"]],
            "rebuild": [[*on, "export", "--force"]],
        }
    python = str(PEER_VENV / "bin" / "python")
    apply = [
        python,
        "-c",
        PEER_APPLY,
        SIDE_BY_SIDE_DATASET,
        str(changed),
        ORIGIN,
        str(deleted_json),
    ]
    return {
        "base_write": [system.commands["write"]],
        "base_flush": [system.commands["flush"]],
        "base_exports": [[*system.cli, "export"]],  # its default: what its users run
        "apply": [apply],
        "flush": [system.commands["flush"]],
        "exports": [[*system.cli, "export"]],
    }


def export_mode(stdout: Path) -> str:
    """'incremental, N entities touched, B bytes carried over' or 'full: why', from
    what ``lakehouse export --json`` printed."""
    try:
        report = json.loads(stdout.read_text().strip().splitlines()[-1])
        mode, reason, written = report["mode"], report.get("reason"), report["written"]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return "? (the export printed no report)"
    if mode != "incremental":
        return f"{mode}: {reason}"
    touched = written.get("entities", {}).get("entities_touched", "?")
    carried = sum(int(w.get("bytes_carried", 0)) for w in written.values())
    return f"incremental, {touched} entities touched, {carried:,} bytes carried over"


def update_round(
    number: int,
    root: Path,
    data: Path,
    changed: Path,
    deleted: list[str],
    cache: Path,
    server: SparkServer | None,
    timeout: float,
) -> UpdateRound:
    order = SYSTEMS if number % 2 == 1 else SYSTEMS[::-1]
    result = UpdateRound(number, order)
    deleted_json = root / "deleted.json"
    root.mkdir(parents=True, exist_ok=True)
    deleted_json.write_text(json.dumps(deleted))
    unused_ids = Path(os.devnull)  # peer.py's get step: not part of this workload
    systems = {
        OURS: ours(root / OURS, data, unused_ids, cache, server.url if server else None),
        PEER: peer(root / PEER, data, unused_ids),
    }
    commands = {
        name: update_commands(system, data, changed, deleted, deleted_json)
        for name, system in systems.items()
    }
    watch = [server.pid] if server and server.pid else []
    broken: set[str] = set()
    for name in order:  # not timed: an empty dataset to write into
        system = systems[name]
        system.cwd.mkdir(parents=True, exist_ok=True)  # clean: the peer reads a .env here
        done = run(system.create, env=system.env, cwd=system.cwd, logs=system.logs, name="create")
        if not done.ok:
            broken.add(name)
            result.failures.append(f"round {number} {name} create: {done.stderr_tail()}")
    ours_incremental: dict[str, str] | None = None
    for step in STEPS:
        for name in order:
            if step not in commands[name] or name in broken:
                continue
            system = systems[name]
            seconds, memory, ok = 0.0, 0, True
            for index, command in enumerate(commands[name][step]):
                done = run(
                    command,
                    env=system.env,
                    cwd=system.cwd,
                    logs=system.logs,
                    name=f"{step}-{index}",
                    watch=watch,
                    timeout=timeout,
                )
                seconds += done.seconds
                memory = max(memory, done.peak_rss_with_others if name == OURS else done.peak_rss)
                if not done.ok:
                    ok = False
                    broken.add(name)
                    result.failures.append(
                        f"round {number} {name} {step}: exit {done.returncode}"
                        + (" (timed out)" if done.timed_out else "")
                        + f"; {done.stderr}:\n{done.stderr_tail()}"
                    )
                    break
                if name == OURS and step == "exports":
                    result.export_mode = export_mode(done.stdout)
            result.steps.setdefault(name, {})[step] = StepFigures(seconds, memory, ok)
            say(
                f"round {number}: {name:<4} {step:<12} {seconds:8.2f} s "
                f"{memory / MiB:8.0f} MiB  {'ok' if ok else 'FAILED'}"
            )
        if step == "exports":
            for name, system in systems.items():
                result.entities[name] = count_lines(system.entities_json)
            if OURS not in broken:
                ours_incremental = digests(systems[OURS].entities_json.parent)
        if step == "rebuild" and OURS not in broken and ours_incremental is not None:
            result.identical = ours_incremental == digests(systems[OURS].entities_json.parent)
    return result


def step_label(step: str, deleted: int) -> str:
    return {
        "base_write": "base: write (journal)",
        "base_flush": "base: flush",
        "base_exports": "base: all exports (the first, full)",
        "apply": f"apply the change (write + {deleted:,} deletes)¹",
        "flush": "flush",
        "exports": "all exports (ours: incremental)",
        "rebuild": "ours: full rebuild of the same snapshot (`export --force`)",
    }[step]


def seconds_of(rounds: Sequence[UpdateRound], name: str, *steps: str) -> float | None:
    """The median over rounds of the steps' seconds added up (rounds where all ran)."""
    values: list[float | None] = []
    for r in rounds:
        found = [r.steps.get(name, {}).get(s) for s in steps]
        ok = all(f is not None and f.ok for f in found)
        values.append(sum(f.seconds for f in found if f is not None) if ok else None)
    return median(values)


def memory_of(rounds: Sequence[UpdateRound], name: str, *steps: str) -> float | None:
    values: list[float | None] = []
    for r in rounds:
        found = [r.steps.get(name, {}).get(s) for s in steps]
        ok = all(f is not None and f.ok for f in found)
        values.append(max(f.memory for f in found if f is not None) / MiB if ok else None)
    return median(values)


def cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def side_by_side_report(
    rounds: Sequence[UpdateRound],
    *,
    statements: int,
    base_entities: int,
    new: int,
    again: int,
    deleted: int,
    server: SparkServer | None,
    load: tuple[float, float, float],
    started: datetime,
) -> bool:
    """Print the Markdown report; False if a check failed."""
    end = os.getloadavg()
    warm = server is not None
    peer_head = "peer (cold: it has no server)" if warm else "peer (cold)"
    ours_head = "ours (warm: Spark Connect server)" if warm else "ours (cold)"
    print()
    print(f"### A daily update: {statements:,} statements, 1% change, side by side")
    print()
    print(f"- date: {started.strftime('%Y-%m-%d %H:%M')}–{datetime.now(UTC).strftime('%H:%M')} UTC")
    print(
        f"- load average (1/5/15 min, {os.cpu_count()} CPUs): start "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}"
    )
    print(
        f"- commit: {git_version()}; peer: ftm-lakehouse {PEER_VERSION} (duckdb {DUCKDB_VERSION})"
    )
    print(
        f"- N = {statements:,} statements requested: {base_entities:,} entities in the base; the "
        f"change (the same ids for both): {new:,} new, {again:,} written again with one more "
        f"value, {deleted:,} deleted"
    )
    if warm:
        assert server is not None
        print(
            f"- warm: ours on a Spark Connect server (start {server.start_seconds:.1f} s, not "
            "counted); ours' peak RSS is its client tree plus the server's tree. The peer has no "
            "server: its steps are the same cold processes as in a cold run."
        )
    else:
        print(
            "- cold: every step a fresh process; each of ours that runs Spark starts its own "
            "JVM (a flush of a small batch and an incremental export of a small change run "
            "no Spark job: they start none)"
        )
    orders = "; ".join(f"round {r.number}: {' then '.join(r.order)}" for r in rounds)
    print(f"- rounds: {len(rounds)}" + (" (medians)" if len(rounds) > 1 else "") + f"; {orders}")
    print()
    print(
        f"| step | {peer_head} [s] | {ours_head} [s] | ours/peer | peak RSS peer [MiB] "
        "| peak RSS ours [MiB] |"
    )
    print("|---|---|---|---|---|---|")

    def line(label: str, steps: tuple[str, ...], bold: bool = False) -> None:
        p, o = seconds_of(rounds, PEER, *steps), seconds_of(rounds, OURS, *steps)
        ratio = f"{o / p:.2f}" if p and o is not None else "–"
        cells = [cell(p, "{:.2f}"), cell(o, "{:.2f}"), ratio]
        if bold:
            label, cells = f"**{label}**", [f"**{c}**" if c != "–" else c for c in cells]
        rss = [cell(memory_of(rounds, n, *steps), "{:.0f}") for n in (PEER, OURS)]
        print(f"| {label} | " + " | ".join(cells + rss) + " |")

    for step in CHANGE_STEPS:
        line(step_label(step, deleted), (step,))
    line("flush + all exports", ("flush", "exports"), bold=True)
    line(step_label("rebuild", deleted), ("rebuild",))
    line("ours: flush + full rebuild", ("flush", "rebuild"))
    for step in ("base_write", "base_flush", "base_exports"):
        line(step_label(step, deleted), (step,))
    print()
    incremental = seconds_of(rounds, OURS, "flush", "exports")
    full = seconds_of(rounds, OURS, "flush", "rebuild")
    exports, rebuild = seconds_of(rounds, OURS, "exports"), seconds_of(rounds, OURS, "rebuild")
    if incremental and full and exports and rebuild:
        print(
            f"Ours against its own full rebuild: flush + incremental exports "
            f"{incremental / full:.0%} of flush + full rebuild; the incremental exports "
            f"{exports / rebuild:.0%} of the full rebuild's."
        )
    print(
        f"¹ ours: the CLI, `entities write` of the change file, then `entities delete` of the "
        f"{deleted:,} ids (2 processes); the peer: its Python API in 1 process, `add_many` of "
        f"the change file, then `delete_entity` of each id (its CLI has neither)."
    )
    print(
        "Both exports write statements.csv, entities.ftm.json, statistics.json and "
        "index.json; the peer's also documents.csv and parents.csv. Neither system "
        "optimizes in these steps."
    )
    expected = base_entities + new - deleted
    good = True
    for r in rounds:
        counts = {n: r.entities.get(n) for n in SYSTEMS}
        print(
            f"Round {r.number}: entities after the change (entities.ftm.json lines): ours "
            f"{counts[OURS]}, peer {counts[PEER]} (base + new − deleted = {expected:,}); "
            f"our export of the change: {r.export_mode}; our incremental files identical "
            f"to the full rebuild's: {r.identical}."
        )
        if counts[OURS] is None or counts[OURS] != counts[PEER] or r.identical is not True:
            good = False
    if not good:
        print(
            "\n**WARNING: a check failed** (entity counts differ or are missing, or our "
            "incremental files differ from the full rebuild's)."
        )
    failures = [f for r in rounds for f in r.failures]
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for failure in failures:
            print("--- " + failure.rstrip())
    return good and not failures


def side_by_side(args: argparse.Namespace) -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    ensure_peer(args.peer_python)
    started = datetime.now(UTC)
    data = write_data(DATA_DIR / f"kek-{args.statements}.ftm.json", args.statements)
    with data.open("rb") as fh:
        base_entities = sum(1 for _ in fh)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="update-peer-bench-", dir=args.workdir))
    changed = work / f"change-{args.seed}.ftm.json"
    deleted, new, again = change(data, changed, seed=args.seed)
    cache = work / "cache"
    if args.class_archive:
        say(f"the JVM's class archive (as `make` prepares it): {class_archive(cache)}")
    load = os.getloadavg()
    server: SparkServer | None = None
    rounds: list[UpdateRound] = []
    good = False
    try:
        if args.warm:
            server = SparkServer(cache, work / "spark", timeout=600)
            say(f"starting our Spark Connect server on port {server.port}")
            try:
                server.start()
            except RuntimeError as exc:
                sys.exit(f"--warm: {exc}")
            say(f"server up in {server.start_seconds:.1f} s (pid {server.pid})")
        for number in range(1, args.rounds + 1):
            rounds.append(
                update_round(
                    number,
                    work / f"round-{number}",
                    data,
                    changed,
                    deleted,
                    cache,
                    server,
                    args.step_timeout,
                )
            )
        good = side_by_side_report(
            rounds,
            statements=args.statements,
            base_entities=base_entities,
            new=new,
            again=again,
            deleted=len(deleted),
            server=server,
            load=load,
            started=started,
        )
    finally:
        if server is not None:
            say("stopping our Spark Connect server")
            server.stop()
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if good else 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--statements", type=int, default=KEK_STATEMENTS)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--base", type=Path, default=None, help="a kept run's folder: its lake is the base"
    )
    parser.add_argument("--seed", type=int, default=42, help="which entities the change picks")
    side = parser.add_argument_group("side by side with the peer")
    side.add_argument("--peer", action="store_true", help="both systems, alternating")
    side.add_argument("--rounds", type=int, default=1, help="repeat with fresh lakes; medians")
    side.add_argument("--warm", action="store_true", help="ours on a Spark Connect server")
    side.add_argument(
        "--no-class-archive",
        dest="class_archive",
        action="store_false",
        help="ours without the JVM's class archive that `make java` prepares",
    )
    side.add_argument("--peer-python", default=None, help="a Python 3.12 for the peer venv")
    side.add_argument(
        "--step-timeout", type=float, default=4 * 3600, help="kill a step after this many s"
    )
    args = parser.parse_args()
    if not args.peer:
        if args.warm or args.rounds != 1:
            parser.error("--warm and --rounds go with --peer (ours alone: LAKEHOUSE_SPARK_REMOTE)")
        ours_only(args)
        return
    if args.base is not None:
        parser.error("--base re-uses a kept lake of ours alone; not with --peer")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    side_by_side(args)


if __name__ == "__main__":
    main()
