"""A collection's build beside nomenklatura's own route, and a 1% change of a child (issue 51).

Input: ../shared/data/kek.ftm.json scaled to about ``--statements`` (each
replica its own ids, :mod:`.data`), replica ``r`` in leaf ``r % --datasets``,
and judgements in nomenklatura's dump format that merge each of a share
(``--merged``) of the base entities with its twin of the next replica (a
leaf apart): clusters of two ids under an ``NK-`` id, references to them
rewritten. The leaves are created, written, flushed and exported once (not
timed); their ``statements.csv`` are nomenklatura's input, their tables ours.

Timed, each a fresh process, the systems alternating in each round:

- **ours**: ``lakehouse -d coll resolver load dump.json`` then ``lakehouse -d
  coll make --force`` (the build on Spark: union, resolution, both tables;
  then statements.csv, entities.ftm.json, statistics.json, index.json and
  the first version);
- **nomenklatura's route**, its own Python API in one process: the dump
  loaded into a SQLite resolver (``Resolver.load``), its ``Linker`` applied
  to every leaf's statements (``apply_statement``, as ``nomenklatura
  apply-statements``), the statements sorted by canonical id in memory, and
  aggregated (followthemoney's ``StatementEntity.from_statements``, as ``ftm
  aggregate-statements``) into entities.ftm.json — fewer files than ours;
- then **a 1% change**: ``--change`` of one leaf's entities written again
  with a new value, that leaf flushed, and the collection's ``make`` (its
  build, and the exports incremental through the collection's change feed).

Each step's seconds and peak RSS (the process and its children) are
printed, with the entity counts of both entities.ftm.json (equal, or the
script says so), the load, the commit and the date.

    python -m benchmarks.collections --statements 1000000 --datasets 4 --rounds 2
    python -m benchmarks.collections --statements 10000000 --datasets 20 --rounds 1 --no-nomenklatura
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shutil
import statistics as stats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson
from followthemoney import model

from benchmarks import data
from benchmarks.peer import Run, clean_env, git_version, lakehouse_cli, run

HERE = Path(__file__).resolve().parent
COLLECTION = "coll"
ORIGIN = "crawl"

#: nomenklatura's route, in one process of its own (argv: resolver URL, dump,
#: output, the leaves' statements.csv); prints its phases' seconds
NOMENKLATURA_ROUTE = r"""
import sys, time
from pathlib import Path
from followthemoney.cli.util import write_entity
from followthemoney.dataset import Dataset
from followthemoney.statement import read_path_statements
from followthemoney.statement.entity import StatementEntity
from nomenklatura.db import Session, close_db, get_engine
from nomenklatura.resolver import Resolver

url, dump, out, *csvs = sys.argv[1:]
clock = time.perf_counter()
with Session(get_engine(url)) as session:
    resolver = Resolver(session, create=True)
    resolver.load(Path(dump))
    session.commit()
    linker = resolver.get_linker()
close_db(url)
loaded = time.perf_counter()
statements = [
    linker.apply_statement(stmt)
    for path in csvs
    for stmt in read_path_statements(Path(path), format="csv")
]
applied = time.perf_counter()
statements.sort(key=lambda s: s.canonical_id)
ordered = time.perf_counter()
meta = Dataset.make({"name": "coll"})
entities = 0
with open(out, "wb") as fh:
    group = []
    for stmt in statements:
        if group and group[0].canonical_id != stmt.canonical_id:
            write_entity(fh, StatementEntity.from_statements(meta, group))
            entities += 1
            group = []
        group.append(stmt)
    if group:
        write_entity(fh, StatementEntity.from_statements(meta, group))
        entities += 1
done = time.perf_counter()
print(f"load resolver {loaded - clock:.2f} s, apply {applied - loaded:.2f} s "
      f"({len(statements)} statements), sort {ordered - applied:.2f} s, "
      f"aggregate {done - ordered:.2f} s ({entities} entities)")
"""


def twin(replica: int, entity_id: str) -> str:
    return data._new_id(replica, entity_id)  # noqa: SLF001 - the data's own id rule


def prepare(root: Path, statements: int, datasets: int, merged: float) -> tuple[list[Path], Path]:
    """The leaves' entity files and the judgements' dump."""
    base = [orjson.loads(x) for x in data.KEK.read_bytes().splitlines() if x.strip()]
    replicas = max(1, round(statements / data.KEK_STATEMENTS))
    files = [root / f"leaf_{i}.ftm.json" for i in range(datasets)]
    outs = [path.open("wb") for path in files]
    try:
        for i, line in enumerate(data.scaled_entities(statements)):
            outs[(i // len(base)) % datasets].write(line)
    finally:
        for out in outs:
            out.close()
    every = max(1, round(1 / merged)) if merged > 0 else 0
    dump = root / "resolver.json"
    with dump.open("w") as fh:
        for replica in range(0, replicas - 1, 2):
            for n, entity in enumerate(base):
                if not every or n % every:
                    continue
                ids = [twin(replica, entity["id"]), twin(replica + 1, entity["id"])]
                nk = "NK-" + hashlib.sha1("|".join(ids).encode()).hexdigest()[:22]
                for member in ids:
                    row = [nk, member, "positive", None, "bench", "2026-12-02T00:00:00"]
                    fh.write(orjson.dumps(row).decode() + "\n")
    return files, dump


def count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def changed_entities(source: Path, target: Path, share: float, mark: str) -> int:
    """``share`` of a leaf's entities with one more value (a 1% change)."""
    every = max(1, round(1 / share))
    n = 0
    with source.open("rb") as src, target.open("wb") as out:
        for i, line in enumerate(src):
            if i % every == 0:
                entity = orjson.loads(line)
                props = model.get(entity["schema"]).properties  # type: ignore[union-attr]
                text = next(p for p in ("notes", "summary", "description") if p in props)
                entity["properties"][text] = [mark]
                out.write(orjson.dumps(entity) + b"\n")
                n += 1
    return n


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--datasets", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--merged", type=float, default=0.1, help="share of entities merged")
    parser.add_argument("--change", type=float, default=0.01, help="share of a leaf changed")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument(
        "--no-nomenklatura",
        dest="nomenklatura",
        action="store_false",
        help="ours only: at 10M nomenklatura's route holds every statement in memory",
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="lakehouse-collections-bench-"))
    try:
        report(root, args)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def report(root: Path, args: argparse.Namespace) -> None:
    load_before = os.getloadavg()[0]
    files, dump = prepare(root, args.statements, args.datasets, args.merged)
    lake, url = root / "lake", f"sqlite:///{root / 'journal.sqlite'}"
    env = clean_env()
    env.update(
        LAKEHOUSE_CACHE_DIR=str(root / "cache"),
        PYTHONPATH=str(HERE.parent),
        LAKEHOUSE_SOURCE_ROOTS=str(root),
    )
    cli = [lakehouse_cli(), "--lake", str(lake), "--journal-url", url]
    logs = root / "logs"

    def step(name: str, command: Sequence[str], **extra: str) -> Run:
        done = run(command, env={**env, **extra}, cwd=root, logs=logs, name=name)
        if done.returncode != 0:
            sys.exit(f"{name} failed ({done.returncode}): {done.stderr.read_text()[-3000:]}")
        return done

    leaves = [f"leaf_{i}" for i in range(args.datasets)]
    print(f"setting up {len(leaves)} leaves of about {args.statements:,} statements in all")
    for name, path in zip(leaves, files, strict=True):
        step(f"create-{name}", [*cli, "datasets", "create", name])
        step(
            f"write-{name}", [*cli, "-d", name, "entities", "write", "-i", str(path), "-o", ORIGIN]
        )
        step(f"make-{name}", [*cli, "-d", name, "make"])
    step("create", [*cli, "datasets", "create", COLLECTION, "--children", ",".join(leaves)])
    csvs = [str(lake / name / "exports" / "statements.csv") for name in leaves]
    edges = count_lines(dump)

    figures: dict[str, list[Run]] = {"ours": [], "nomenklatura": [], "change": []}
    entities: dict[str, int] = {}
    for round_no in range(1, args.rounds + 1):
        order = ["ours", "nomenklatura"] if round_no % 2 else ["nomenklatura", "ours"]
        if not args.nomenklatura:
            order.remove("nomenklatura")
        for system in order:
            if system == "ours":
                loaded = step(
                    f"resolver-{round_no}", [*cli, "-d", COLLECTION, "resolver", "load", str(dump)]
                )
                made = step(f"ours-{round_no}", [*cli, "-v", "-d", COLLECTION, "make", "--force"])
                print(
                    f"round {round_no}: resolver load {loaded.seconds:.1f} s, make {made.seconds:.1f} s"
                )
                made.seconds += loaded.seconds
                made.peak_rss = max(made.peak_rss, loaded.peak_rss)
                figures["ours"].append(made)
                entities["ours"] = count_lines(lake / COLLECTION / "entities.ftm.json")
            else:
                nk_db = root / f"nomenklatura-{round_no}.db"
                out = root / "nomenklatura.ftm.json"
                figures["nomenklatura"].append(
                    step(
                        f"nomenklatura-{round_no}",
                        [
                            sys.executable,
                            "-c",
                            NOMENKLATURA_ROUTE,
                            f"sqlite:///{nk_db}",
                            str(dump),
                            str(out),
                            *csvs,
                        ],
                    )
                )
                entities["nomenklatura"] = count_lines(out)
        changed = root / f"change-{round_no}.ftm.json"
        n = changed_entities(files[0], changed, args.change, f"round {round_no}")
        step(
            f"change-write-{round_no}",
            [*cli, "-d", leaves[0], "entities", "write", "-i", str(changed), "-o", ORIGIN],
        )
        flushed = step(f"change-flush-{round_no}", [*cli, "-d", leaves[0], "flush"])
        made = step(f"change-make-{round_no}", [*cli, "-v", "-d", COLLECTION, "make"])
        made.seconds += flushed.seconds
        figures["change"].append(made)
        print(
            f"round {round_no}: "
            + ", ".join(f"{k} {v[-1].seconds:.1f} s" for k, v in figures.items() if v)
            + f" ({n:,} entities of {leaves[0]} changed)"
        )

    def line(label: str, runs: list[Run]) -> str:
        if not runs:
            return f"| {label} | - | - | - |"
        seconds = [r.seconds for r in runs]
        peak = max(r.peak_rss for r in runs) / 2**20
        return f"| {label} | {min(seconds):.1f} | {stats.median(seconds):.1f} | {peak:,.0f} |"

    ours_best = min(r.seconds for r in figures["ours"])
    theirs_best = min((r.seconds for r in figures["nomenklatura"]), default=None)
    print()
    print(
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {git_version()}, load "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; {args.statements:,} "
        f"statements in {args.datasets} leaves, {edges:,} judgement edges, {args.rounds} rounds"
    )
    print("| step | best s | median s | peak RSS MiB |")
    print("|---|---|---|---|")
    print(line("ours: resolver load + make --force (build, 4 exports, version)", figures["ours"]))
    print(
        line("nomenklatura: load, apply, sort, aggregate (entities only)", figures["nomenklatura"])
    )
    print(line(f"ours: a {args.change:.0%} change of {leaves[0]}: flush + make", figures["change"]))
    if theirs_best is not None:
        print(f"full build ours / nomenklatura's (best): {ours_best / theirs_best:.2f}")
        print(
            f"entities: ours {entities['ours']:,}, nomenklatura {entities['nomenklatura']:,}"
            + ("" if entities["ours"] == entities["nomenklatura"] else "  DIFFERENT")
        )
    else:
        print(f"entities: ours {entities['ours']:,} (nomenklatura's route not run)")
    for label, runs in (("full build", figures["ours"]), ("change", figures["change"])):
        for done in runs[-1:]:
            phases = [
                x
                for x in done.stderr.read_text().splitlines()
                if "collection" in x or "export" in x or "graph" in x or "done in" in x
            ]
            print(f"last {label}'s steps:\n  " + "\n  ".join(phases[-14:]))
    for done in figures["nomenklatura"][-1:]:
        print("nomenklatura's phases: " + done.stdout.read_text().strip())


if __name__ == "__main__":
    main()
