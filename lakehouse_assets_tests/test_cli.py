"""The ``lakehouse`` CLI end to end, and every kind of bad input it must refuse."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
from click.testing import CliRunner, Result

from lakehouse_assets import Lakehouse
from lakehouse_assets import conventions as cv
from lakehouse_assets.cli import cli
from lakehouse_assets.entities import STATEMENT_COLUMNS
from lakehouse_assets_tests.conftest import REPO, free_port, run_python, sample_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SAMPLE = REPO / "lakehouse_assets" / "sample"


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    lake_dir = tmp_path / "lake"
    journal = f"sqlite:///{tmp_path / 'journal.sqlite'}"

    def invoke(*args: str, input: bytes | None = None) -> Result:
        return CliRunner().invoke(
            cli, ["--lake", str(lake_dir), "--journal-url", journal, *args], input=input
        )

    invoke.lake = Lakehouse(lake_dir, journal_url=journal)  # type: ignore[attr-defined]
    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def test_full_tenant_session(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo", "--title", "Demo"))
    assert ok(run("datasets", "list")).stdout.split() == ["demo"]
    doc = SAMPLE / "documents" / "notes.md"
    meta = json.loads(ok(run("-d", "demo", "archive", "add", "--document", str(doc))).stdout)
    assert meta["checksum"] == hashlib.sha256(doc.read_bytes()).hexdigest()
    got = json.loads(ok(run("-d", "demo", "archive", "get", meta["checksum"])).stdout)
    assert got["file_id"] == meta["file_id"]
    assert (
        ok(run("-d", "demo", "archive", "cat", meta["checksum"])).stdout_bytes == doc.read_bytes()
    )
    assert len(ok(run("-d", "demo", "archive", "ls")).stdout.splitlines()) == 1
    res = ok(
        run(
            "-d",
            "demo",
            "entities",
            "write",
            "-i",
            str(SAMPLE / "entities.ftm.json"),
            "-o",
            "sample",
        )
    )
    assert "wrote 13 entities" in res.stderr
    from followthemoney import model
    from followthemoney.statement import Statement

    target = next(e for e in sample_entities() if e["id"] == "own-li-blue")
    n = len(list(Statement.from_entity(model.get_proxy(target, cleaned=False), "demo")))
    res = ok(run("-d", "demo", "entities", "delete", "own-li-blue"))
    assert f"own-li-blue: {n} statements tombstoned" in res.stderr
    tags = dict(
        line.split("\t") for line in ok(run("-d", "demo", "tags", "ls")).stdout.splitlines()
    )
    assert set(tags) == {cv.ARCHIVE_LAST_UPDATED, cv.JOURNAL_LAST_UPDATED}
    ok(run("-d", "demo", "archive", "delete", meta["file_id"]))
    assert ok(run("-d", "demo", "archive", "ls")).stdout == ""
    lake: Lakehouse = run.lake
    assert lake.journal.count("demo") > 0
    assert json.loads(lake.store.read_text(cv.CATALOG_INDEX))["datasets"][0]["name"] == "demo"


def test_entities_from_stdin(run) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    data = (SAMPLE / "entities.ftm.json").read_bytes()
    res = ok(run("-d", "demo", "entities", "write", input=data))
    assert "wrote 13 entities" in res.stderr


def test_statements_csv_roundtrip(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from followthemoney.statement import Statement

    ok(run("datasets", "create", "demo"))
    stmts = [
        Statement(entity_id="p1", prop="name", schema="Person", value="Ann", dataset="demo"),
        Statement(entity_id="p1", prop="id", schema="Person", value="p1", dataset="demo"),
    ]
    path = tmp_path / "s.csv"
    from lakehouse_assets.entities import write_statements_csv

    with path.open("w", newline="") as fh:
        write_statements_csv(fh, stmts)
    assert path.read_text().splitlines()[0] == ",".join(f'"{c}"' for c in STATEMENT_COLUMNS)
    res = ok(run("-d", "demo", "statements", "write", "-i", str(path), "-o", "csv"))
    assert "wrote 2 statements" in res.stderr
    lake: Lakehouse = run.lake
    stored = lake.journal.live_entity_statements("demo", "p1")
    assert {s.id for s in stored} == {s.id for s in stmts}


def bad_entities(tmp_path: Path, lines: list[bytes]) -> Path:
    good = [orjson.dumps(e) for e in sample_entities()[:4]]
    path = tmp_path / "in.ftm.json"
    path.write_bytes(b"\n".join(good + lines + good))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "x", "schema": "Person", "properties": {', "line 5] malformed JSON"),
        (
            b'{"id": "x", "schema": "Unicorn", "properties": {}}',
            "line 5] entity 'x': unknown schema 'Unicorn'",
        ),
        (
            b'{"id": "x", "schema": "Person", "properties": {"wings": ["2"]}}',
            "line 5] entity 'x': schema Person has no property 'wings'",
        ),
        (b'{"schema": "Person", "properties": {"name": ["No Id"]}}', "line 5] entity has no id"),
        (
            b'{"id": "x", "schema": "Thing", "properties": {}}',
            "line 5] entity 'x': schema 'Thing' is abstract",
        ),
        (
            b'{"id": "x", "schema": "Person", "properties": {"name": ["M\xfcller"]}}',
            "line 5] not UTF-8",
        ),
        (b'["not", "an", "object"]', "line 5] expected a JSON object"),
    ],
)
def test_bad_entity_lines_commit_nothing(run, tmp_path: Path, line: bytes, message: str) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    path = bad_entities(tmp_path, [line])
    res = run("-d", "demo", "entities", "write", "-i", str(path))
    assert res.exit_code == 1
    assert f"Error: [dataset 'demo', file '{path}', {message}" in res.stderr
    lake: Lakehouse = run.lake
    assert lake.journal.count("demo") == 0
    assert lake.dataset("demo").core_tags.get(cv.JOURNAL_LAST_UPDATED) is None


def test_bad_statement_csv(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    path = tmp_path / "s.csv"
    path.write_text("entity_id,prop,schema,value\np1,name,Person,Ann\np1,wings,Person,2\n")
    res = run("-d", "demo", "statements", "write", "-i", str(path))
    assert res.exit_code == 1
    assert (
        f"[dataset 'demo', file '{path}', line 3] schema Person has no property 'wings'"
        in res.stderr
    )
    path.write_text("entity,value\nx,y\n")
    res = run("-d", "demo", "statements", "write", "-i", str(path))
    assert "lacks columns ['entity_id', 'prop', 'schema']" in res.stderr
    path.write_bytes(b"entity_id,prop,schema,value\np1,name,Person,M\xfcller\n")
    res = run("-d", "demo", "statements", "write", "-i", str(path))
    assert res.exit_code == 1 and "not UTF-8" in res.stderr
    lake: Lakehouse = run.lake
    assert lake.journal.count("demo") == 0


def test_archive_errors(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    res = run("-d", "demo", "archive", "add", str(tmp_path / "missing.pdf"))
    assert (
        res.exit_code == 1 and "Source file not found" in res.stderr and "missing.pdf" in res.stderr
    )
    res = run("-d", "demo", "archive", "add", f"http://127.0.0.1:{free_port()}/a.pdf")
    assert res.exit_code == 1 and "Cannot reach" in res.stderr
    doc = SAMPLE / "documents" / "notes.md"
    res = run("-d", "demo", "archive", "add", "--checksum", "0" * 64, str(doc))
    assert res.exit_code == 1 and "checksum mismatch" in res.stderr and "notes.md" in res.stderr
    res = run("-d", "demo", "archive", "get", "f" * 64)
    assert res.exit_code == 1 and "No file with checksum" in res.stderr
    res = run("-d", "demo", "archive", "delete", "../../config.yml")
    assert res.exit_code == 1 and "Invalid file id" in res.stderr
    lake: Lakehouse = run.lake
    assert lake.store.exists("demo/config.yml")
    assert not [p for p in lake.store.list("demo/archive/")]


@pytest.mark.parametrize("name", ["../etc", "Demo", "a/b", "..", "x\x00"])
def test_invalid_dataset_names(run, name: str) -> None:  # type: ignore[no-untyped-def]
    res = run("datasets", "create", name)
    assert res.exit_code == 1 and "Invalid dataset name" in res.stderr
    res = run("-d", name, "tags", "ls")
    assert res.exit_code == 1 and "Invalid dataset name" in res.stderr


def test_invalid_tenant_and_unknown_dataset(run) -> None:  # type: ignore[no-untyped-def]
    res = run("--tenant", "../root", "datasets", "list")
    assert res.exit_code == 1 and "Invalid tenant name" in res.stderr
    res = run("-d", "nope", "archive", "ls")
    assert res.exit_code == 1 and "Dataset 'nope' does not exist" in res.stderr
    ok(run("datasets", "create", "demo"))
    res = run("-d", "demo", "tags", "ls", "--tenant", "../../x")
    assert res.exit_code == 1 and "Invalid tenant name" in res.stderr


def test_installed_entry_point(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "lakehouse"
    res = subprocess.run(
        [str(exe), "--lake", str(tmp_path / "lake"), "datasets", "create", "cli_demo"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "created cli_demo" in res.stderr
    assert (tmp_path / "lake" / "journal.sqlite").exists() is False  # journal opens lazily
    res = subprocess.run(
        [
            str(exe),
            "--lake",
            str(tmp_path / "lake"),
            "-d",
            "cli_demo",
            "entities",
            "write",
            "-i",
            str(SAMPLE / "entities.ftm.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "lake" / "journal.sqlite").exists()  # the durable default


def test_the_lake_must_be_named_and_a_read_never_creates_it(tmp_path: Path) -> None:
    """No --lake, LAKEHOUSE_LAKE_URI or ./lakehouse.env: a usage error (exit 2); a lake
    folder that does not exist: exit 1 and still no folder; only `datasets create`
    makes one. ./lakehouse.env names the lake of a working folder."""
    import os

    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    work = tmp_path / "work"
    work.mkdir()

    def lakehouse(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *args], capture_output=True, text=True, cwd=work, env=env, timeout=120
        )

    res = lakehouse("datasets", "list")
    assert res.returncode == 2 and "no lake given" in res.stderr
    assert list(work.iterdir()) == []  # no ./lake appeared
    missing = tmp_path / "missing"
    for args in (["datasets", "list"], ["-d", "x", "get", "e1"], ["-d", "x", "versions"]):
        res = lakehouse("--lake", str(missing), *args)
        assert res.returncode == 1, res.stderr
        assert res.stderr.count("\n") == 1 and f"no lake at {missing}" in res.stderr
        assert not missing.exists()
    assert lakehouse("--lake", str(missing), "datasets", "create", "made").returncode == 0
    (work / "lakehouse.env").write_text(f"LAKEHOUSE_LAKE_URI={missing}\n")
    res = lakehouse("datasets", "list")
    assert res.returncode == 0 and res.stdout.split() == ["made"]
    # the environment overrides the file
    env["LAKEHOUSE_LAKE_URI"] = str(tmp_path / "other")
    assert lakehouse("datasets", "list").returncode == 1


def test_every_option_has_help_every_command_an_example_and_the_cli_a_version() -> None:
    import click

    from lakehouse_assets.cli import cli as root

    missing: list[tuple[str, list[str]]] = []
    without_example: list[str] = []

    def walk(cmd: click.Command, path: str) -> None:
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.help and "--version" not in param.opts:
                missing.append((path, param.opts))
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")
        elif not re.search(r"Examples?:\n\s+lakehouse ", cmd.help or ""):
            without_example.append(path)

    walk(root, "lakehouse")
    assert missing == []
    assert without_example == []
    shown = CliRunner().invoke(root, ["query", "--help"])
    assert "Example:\n    lakehouse -d my_dataset query -s Company" in shown.output  # as written
    result = CliRunner().invoke(root, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("lakehouse, version ")


def test_archive_by_checksum_prefix_and_jobs_listing(tmp_path: Path) -> None:
    from lakehouse_assets.cli import cli as root

    lake = tmp_path / "lake"
    base = ["--lake", str(lake), "-d", "prefixes"]
    runner = CliRunner()
    assert (
        runner.invoke(root, ["--lake", str(lake), "datasets", "create", "prefixes"]).exit_code == 0
    )
    files = []
    for i in range(2):
        path = tmp_path / f"f{i}.txt"
        path.write_text(f"file {i}")
        files.append(hashlib.sha256(path.read_bytes()).hexdigest())
        assert runner.invoke(root, [*base, "archive", "add", str(path)]).exit_code == 0
    got = runner.invoke(root, [*base, "archive", "get", files[0][:12]])
    assert got.exit_code == 0 and json.loads(got.stdout)["checksum"] == files[0]
    cat = runner.invoke(root, [*base, "archive", "cat", files[1][:8]])
    assert cat.exit_code == 0 and cat.stdout == "file 1"
    short = runner.invoke(root, [*base, "archive", "get", "ab"])
    assert short.exit_code == 1 and "at least 4 hex characters" in short.stderr
    none = runner.invoke(
        root,
        [*base, "archive", "get", "0000"]
        if not any(f.startswith("0000") for f in files)
        else [*base, "archive", "get", "ffff0000"],
    )
    assert none.exit_code == 1 and "No file with a checksum starting" in none.stderr
    listing = runner.invoke(root, [*base, "jobs"])
    assert listing.exit_code == 0
    empty = runner.invoke(root, [*base, "jobs", "flush"])
    assert empty.exit_code == 0 and "no 'flush' runs" in empty.stderr


def test_status_says_what_is_stale_and_why(spark: SparkSession, tmp_path: Path) -> None:
    from lakehouse_assets.cli import cli as root

    lake = Lakehouse(tmp_path / "lake")
    ds = lake.create_dataset("stat")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    base = ["--lake", str(tmp_path / "lake"), "-d", "stat"]
    report = json.loads(CliRunner().invoke(root, [*base, "status", "--json"]).stdout)
    assert report["journal_pending"] == 2  # the id and the name statement
    assert not report["exports"]["entities"]["fresh"]
    assert "journal rows wait" in report["exports"]["entities"]["why"]
    assert report["lock"] == "free"
    ds.make()
    report = json.loads(CliRunner().invoke(root, [*base, "status", "--json"]).stdout)
    assert report["journal_pending"] == 0
    never_made = report["exports"].pop("graph_cypher")  # make builds the index, not these
    assert (never_made["fresh"], never_made["built"]) == (False, False)
    assert all(e["fresh"] for e in report["exports"].values()), report["exports"]
    assert report["statements_version"]["published"] is not None
    assert "flush" in report["jobs"]
    text = CliRunner().invoke(root, [*base, "status"])
    assert text.exit_code == 0 and "entities    fresh" in text.stdout
    assert report["version"]["sequence"] == 1 and "published: version 1" in text.stdout
    assert "graph_cypher not built" in text.stdout and "stale" not in text.stdout
    # the whole catalog at once: status without -d, datasets list --json
    head = ds.version()
    assert head is not None
    lake.create_dataset("empty", title="Nothing yet")
    ds.add_entity({"id": "p3", "schema": "Person", "properties": {"name": ["Cy"]}})
    lake_only = ["--lake", str(tmp_path / "lake")]
    catalog = json.loads(CliRunner().invoke(root, [*lake_only, "status", "--json"]).stdout)
    by_name = {d["name"]: d for d in catalog["datasets"]}
    assert sorted(by_name) == ["empty", "stat"]
    assert (by_name["stat"]["version"], by_name["stat"]["version_hash"]) == (1, head.hash)
    assert by_name["stat"]["pending"] == 2 and "entities" in by_name["stat"]["stale"]
    assert by_name["empty"] == {
        "name": "empty",
        "title": "Nothing yet",
        "version": None,
        "version_hash": None,
        "published_at": None,
        "pending": 0,
        "stale": ["entities", "index", "statements", "statistics"],
    }
    listed = CliRunner().invoke(root, [*lake_only, "datasets", "list", "--json"]).stdout
    assert [json.loads(line) for line in listed.splitlines()] == catalog["datasets"]
    table = CliRunner().invoke(root, [*lake_only, "status"]).stdout  # not a terminal: the table
    assert "Nothing yet" in table and "all exports" in table
    ds.flush()
    # with a graph index (make built it): its freshness, and the Cypher export's
    from lakehouse_assets import graph

    graph.rebuild(ds)
    ds.add_entity({"id": "p2", "schema": "Person", "properties": {"name": ["Bo"]}})
    ds.flush()
    # a tenant's operation lock, held by this live process: listed
    with ds.operation_lock("export"):
        report = json.loads(CliRunner().invoke(root, [*base, "status", "--json"]).stdout)
    assert report["exports"]["graph"]["fresh"] is False
    assert "tables changed since" in report["exports"]["graph"]["why"]
    assert report["exports"]["graph_cypher"]["fresh"] is False
    (held,) = report["operation_locks"]
    assert held == "lakehouse/export" and "pid" in report["operation_locks"][held]
    graph.update(ds)
    report = json.loads(CliRunner().invoke(root, [*base, "status", "--json"]).stdout)
    assert report["exports"]["graph"]["fresh"] is True and report["operation_locks"] == {}


def test_long_commands_say_what_they_do_and_spark_stays_quiet(
    spark: SparkSession, tmp_path: Path
) -> None:
    """make prints its stages with counts on stderr; the result is JSON on a pipe and
    a short summary for a person; an in-process Spark's JVM warnings go to a log
    file unless -v."""
    import os

    from lakehouse_assets.cli import cli as root
    from lakehouse_assets.cli.output import _human

    lake = Lakehouse(tmp_path / "lake")
    ds = lake.create_dataset("talk")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    ds.delete_entity("p1")
    ds.add_entity({"id": "p2", "schema": "Person", "properties": {"name": ["Bo"]}})
    made = CliRunner().invoke(root, ["--lake", str(tmp_path / "lake"), "-d", "talk", "make"])
    assert made.exit_code == 0, made.output
    stages = made.stderr
    assert "flush talk: 6 journal rows in 1 batch(es)" in stages
    assert "flush talk: batch 1/1 done" in stages and "so far 2 new" in stages
    assert "export talk: exports/statements.csv written (2 statements" in stages
    assert "make talk: done in" in stages and "published version 1" in stages
    result = json.loads(made.stdout)  # not a terminal: JSON
    assert result["flushed"]["superseded"] == 2 and result["flushed"]["ignored_tombstones"] == 2
    lines = _human(result)
    assert lines[0].startswith("flushed    6 journal rows, 2 new, 0 duplicates, 0 tombstones")
    assert any(line.startswith("published  version 1") for line in lines)
    assert any("exports/statements.csv" in line and "2 statements" in line for line in lines)

    # a real process: a flush this small runs on the driver and starts no JVM
    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {k: v for k, v in os.environ.items() if k != "LAKEHOUSE_SPARK_REMOTE"}
    env["LAKEHOUSE_CACHE_DIR"] = str(tmp_path / "cache")

    def flush() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, "--lake", str(tmp_path / "lake"), "-d", "talk", "flush"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    ds.add_entity({"id": "p4", "schema": "Person", "properties": {"name": ["Di"]}})
    small = flush()
    assert small.returncode == 0, small.stderr
    assert json.loads(small.stdout)["new"] == 2
    assert not (tmp_path / "cache" / "spark-driver.log").exists()  # no JVM started
    # with Spark doing the flush (as for a larger batch into stored buckets: a new
    # name of p4; a new entity's bucket of nothing stored would take the worker
    # processes), an in-process Spark: no JVM noise on stderr, unless -v
    env["LAKEHOUSE_FLUSH_DRIVER_ROWS"] = "0"
    ds.add_entity({"id": "p4", "schema": "Person", "properties": {"name": ["Dee"]}})
    quiet = flush()
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["new"] == 1
    noise = [line for line in quiet.stderr.splitlines() if "WARN" in line or "WARNING" in line]
    assert noise == [], quiet.stderr
    assert all(line.split()[0].endswith("s") for line in quiet.stderr.splitlines())
    log = (tmp_path / "cache" / "spark-driver.log").read_text()
    assert "WARN" in log or "WARNING" in log  # the JVM's own start-up lines went here


def test_make_reports_the_commands_wall_time_and_its_parts(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A ``make`` process's total is its wall time (measured here, around the
    process), not the export pass's: the parts it names (startup, flush,
    exports, index, other) add up to the total, and the person's summary names
    the same parts as the JSON. A consistency check of the reported numbers,
    not of speed. A dataset this small starts no Spark (its flush and exports
    run on the driver), so Spark's start is not among the parts."""
    import os
    import time

    from lakehouse_assets.cli.output import _human

    lake = Lakehouse(tmp_path / "lake")
    ds = lake.create_dataset("timed")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {**os.environ, "LAKEHOUSE_CACHE_DIR": str(tmp_path / "cache")}
    clock = time.monotonic()
    made = subprocess.run(
        [exe, "--lake", str(tmp_path / "lake"), "-d", "timed", "make", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    wall = time.monotonic() - clock
    assert made.returncode == 0, made.stderr
    result = json.loads(made.stdout)
    parts = result["parts"]
    assert {"startup", "flush", "exports", "index", "other"} <= set(parts)
    assert "spark start" not in parts
    assert all(seconds >= 0 for seconds in parts.values())
    total = result["seconds"]
    assert sum(parts.values()) <= total + 0.01  # rounding
    assert total <= wall
    # what is left out: the fork before the process, the summary, the exit
    assert wall - total <= max(1.5, 0.1 * wall), (wall, total)
    took = [line for line in _human(result) if line.startswith("took")]
    assert took == [
        f"took       {total:.1f} s ("
        + ", ".join(f"{name} {s:.1f}" for name, s in parts.items())
        + ")"
    ]
    assert "make timed: done in" in made.stderr and "flush " in made.stderr


def test_archive_text_put_get_ls(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    doc = SAMPLE / "documents" / "notes.md"
    meta = json.loads(ok(run("-d", "demo", "archive", "add", str(doc))).stdout)
    short = meta["checksum"][:10]
    text = tmp_path / "notes.txt"
    text.write_text("Ünïcode notes\nline 2\n")
    res = ok(run("-d", "demo", "archive", "text", "put", short, "--engine", "tika", str(text)))
    assert meta["checksum"] in res.stderr
    ok(run("-d", "demo", "archive", "text", "put", short, "-e", "ocr", "-", input=b"from stdin"))
    got = ok(run("-d", "demo", "archive", "text", "get", short, "--engine", "tika"))
    assert got.stdout == "Ünïcode notes\nline 2\n"
    assert (
        ok(run("-d", "demo", "archive", "text", "get", short, "-e", "ocr")).stdout == "from stdin"
    )
    listed = [
        json.loads(line)
        for line in ok(run("-d", "demo", "archive", "text", "ls", short)).stdout.splitlines()
    ]
    assert [(r["engine"], r["bytes"]) for r in listed] == [
        ("ocr", 10),
        ("tika", len(text.read_bytes())),
    ]
    # errors: one line, exit 1, naming what to fix
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Müller".encode("latin-1"))
    res = run("-d", "demo", "archive", "text", "put", short, "-e", "ocr", str(latin1))
    assert res.exit_code == 1 and "not UTF-8" in res.stderr and "latin1.txt" in res.stderr
    res = run("-d", "demo", "archive", "text", "put", short, "-e", "ocr", "-", input=b"\xff")
    assert res.exit_code == 1 and "<stdin>" in res.stderr
    res = run("-d", "demo", "archive", "text", "get", short, "-e", "nope")
    assert res.exit_code == 1 and "No text of engine 'nope'" in res.stderr
    assert "engines with text: ocr, tika" in res.stderr
    res = run("-d", "demo", "archive", "text", "put", short, "-e", "../../x", str(text))
    assert res.exit_code == 1 and "Invalid text engine" in res.stderr
    res = run("-d", "demo", "archive", "text", "put", short, "-e", "ocr", str(tmp_path / "no"))
    assert res.exit_code == 2 and "no such file" in res.stderr
    res = run("-d", "demo", "archive", "text", "put", "f" * 64, "-e", "ocr", str(text))
    assert res.exit_code == 1 and "archive the file before adding its text" in res.stderr
    # the text survived every refused write
    assert (
        ok(run("-d", "demo", "archive", "text", "get", short, "-e", "ocr")).stdout == "from stdin"
    )


def test_queue_push_ls_consume(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok(run("datasets", "create", "demo"))
    entity = json.dumps({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    first = json.loads(
        ok(
            run("--tenant", "app-a", "-d", "demo", "queue", "push", "UPSERT", "entity", entity)
        ).stdout
    )
    assert first["tenant"] == "app-a" and first["payload"]["entity"]["id"] == "p1"
    res = ok(
        run(
            "--tenant",
            "app-b",
            "-d",
            "demo",
            "queue",
            "push",
            "delete",
            "entity",
            "-",
            input=b'{"entity_id": "p1"}',
        )
    )
    second = json.loads(res.stdout)
    assert "queued DELETE entity p1 as app-b/" in res.stderr
    listed = [json.loads(x) for x in ok(run("-d", "demo", "queue", "ls")).stdout.splitlines()]
    assert [(e["id"], e["state"]) for e in listed] == [
        (first["id"], "pending"),
        (second["id"], "pending"),
    ]
    only_b = ok(run("-d", "demo", "queue", "ls", "--tenant", "app-b")).stdout.splitlines()
    assert [json.loads(x)["id"] for x in only_b] == [second["id"]]
    # refused pushes: one line, exit 1 (bad JSON, bad entity) or 2 (unknown action)
    res = run("-d", "demo", "queue", "push", "UPSERT", "entity", "{nope")
    assert res.exit_code == 1 and "payload is not JSON" in res.stderr
    res = run("-d", "demo", "queue", "push", "UPSERT", "entity", '{"id": "x", "schema": "Nope"}')
    assert res.exit_code == 1 and "unknown schema 'Nope'" in res.stderr
    res = run("-d", "demo", "queue", "push", "MERGE", "entity", "{}")
    assert res.exit_code == 2
    res = run("--tenant", "../x", "-d", "demo", "queue", "push", "UPSERT", "entity", entity)
    assert res.exit_code == 1 and "Invalid tenant name" in res.stderr
    res = run("-d", "demo", "queue", "ls", "--tenant", "../../x")
    assert res.exit_code == 1 and "Invalid tenant name" in res.stderr
    # a malformed item dropped into the queue by hand is set aside and reported
    lake: Lakehouse = run.lake
    from lakehouse_assets.queue import uuid7

    bad = uuid7()
    lake.store.write_bytes(cv.queue_item("demo", "app-b", bad), b"{broken")
    res = run("-d", "demo", "queue", "consume")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["applied"], report["remaining"]) == (2, 0)
    assert [f["id"] for f in report["failed"]] == [bad]
    assert f"failed app-b/{bad}: not JSON" in res.stderr
    assert lake.journal.live_entity_statements("demo", "p1") == []  # upserted, then deleted
    everything = [
        json.loads(x) for x in ok(run("-d", "demo", "queue", "ls", "--all")).stdout.splitlines()
    ]
    assert [(e["id"], e["state"]) for e in everything] == [
        (first["id"], "done"),
        (second["id"], "done"),
        (bad, "failed"),
    ]
    assert ok(run("-d", "demo", "queue", "ls")).stdout == ""


def test_commands_that_touch_no_entity_import_no_followthemoney(tmp_path: Path) -> None:
    """followthemoney costs about 0.5 s of a process's start, duckdb 0.2 s: a
    flush, an archive listing, ``status``, ``versions`` and ``queue ls`` import
    neither (nor does ``lakehouse --help``); writing entities does."""
    lake_dir, journal = tmp_path / "lake", f"sqlite:///{tmp_path / 'journal.sqlite'}"
    Lakehouse(lake_dir, journal_url=journal).create_dataset("quiet")
    probe = (
        "import sys\n"
        "from lakehouse_assets.cli import cli\n"
        "for args in sys.argv[1:]:\n"
        "    cli.main(args.split('|'), standalone_mode=False)\n"
        "print('\\nimported:', 'followthemoney' in sys.modules or 'duckdb' in sys.modules)\n"
    )
    common = f"--lake|{lake_dir}|--journal-url|{journal}"
    quiet = [
        f"{common}|-d|quiet|{command}"
        for command in ("flush", "archive|ls", "status", "versions", "queue|ls")
    ]

    def imported(*commands: str) -> bool:
        done = run_python(probe, *commands)
        return done.stdout.strip().splitlines()[-1] == "imported: True"

    assert not imported(*quiet)
    assert not imported("--help")
    entities = SAMPLE / "entities.ftm.json"
    assert imported(f"{common}|-d|quiet|entities|write|-i|{entities}")


def test_a_spark_server_started_with_other_code_is_refused(tmp_path: Path) -> None:
    """A Connect server's Python workers import this package once and are reused:
    after an upgrade (or an edit) a running server would run the old code in its
    tasks beside the clients' new code. Its PID file records the code it was
    started with; status says so, start refuses to pass it off as running, and
    a client refuses to use it, each naming the restart."""
    import os
    import socket

    from lakehouse_assets.locks import process_start
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.spark import connect

    cache = tmp_path / "cache"
    settings = Settings(cache_dir=str(cache))
    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    env["LAKEHOUSE_CACHE_DIR"] = str(cache)
    with socket.socket() as listener, subprocess.Popen(["sleep", "120"]) as holder:
        # the "server": a live process of ours and a port that accepts connections
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        record = connect.server_dir(settings, port) / "server.json"
        record.parent.mkdir(parents=True)

        def started_with(code: str | None) -> None:
            data = {"pid": holder.pid, "pid_start": process_start(holder.pid), "port": port}
            record.write_text(json.dumps(data if code is None else {**data, "code": code}))

        def lakehouse(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [exe, *args], capture_output=True, text=True, env=env, timeout=120
            )

        try:
            started_with(connect.code_fingerprint())
            info = connect.status(settings, port)
            assert info.running and not info.stale_code and info.note is None
            connect.require_current_code(settings, "127.0.0.1", port)  # no error

            for code in ("0123456789abcdef", None):  # other code; a server from before the record
                started_with(code)
                assert connect.status(settings, port).stale_code
                shown = lakehouse("spark", "status", "--port", str(port))
                assert shown.returncode == 0, shown.stderr
                assert "started with other lakehouse_assets code" in shown.stdout
                assert f"lakehouse spark stop --port {port}" in shown.stdout
                started = lakehouse("spark", "start", "--port", str(port))
                assert started.returncode == 1 and "Restart it" in started.stderr
                client = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        "from lakehouse_assets.settings import Settings\n"
                        "from lakehouse_assets.spark.session import get_spark\n"
                        f"get_spark(Settings(spark_remote='sc://127.0.0.1:{port}'))\n",
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=120,
                )
                assert client.returncode == 1
                assert "ConfigurationError" in client.stderr and "Restart it" in client.stderr
                # a server elsewhere has no record here: taken as it is
                connect.require_current_code(settings, "spark.example.org", port)
            assert holder.poll() is None  # nothing stopped the "server"
        finally:
            holder.kill()


def test_the_cli_exits_without_teardown_but_runs_exit_handlers_and_flushes(
    tmp_path: Path,
) -> None:
    """``lakehouse`` ends with ``os._exit`` after a command (the interpreter's
    teardown cost about 0.45 s of each warm command): the exit code, every line
    of a large output to a pipe and the exit handlers must survive that; while
    a non-daemon thread runs, the process exits the usual way, after it."""
    marker = tmp_path / "handler-ran"
    probe = (
        "import atexit, sys, threading, time\n"
        "from pathlib import Path\n"
        "from lakehouse_assets.cli.root import exit_without_teardown\n"
        f"atexit.register(lambda: Path({str(marker)!r}).write_text('yes'))\n"
        "for i in range(200_000):\n"
        "    print(f'line {i}')\n"
        "if sys.argv[1] == 'thread':\n"
        "    threading.Thread(target=lambda: (time.sleep(0.5), print('thread done'))).start()\n"
        "exit_without_teardown(int(sys.argv[2]))\n"
        "print('returned')\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    import os

    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for mode, code in (("plain", 0), ("plain", 3), ("thread", 0)):
        marker.unlink(missing_ok=True)
        # a pipe's block buffer, as a user's shell gives
        done = run_python(probe, mode, str(code), env=buffered, check=False)
        assert done.returncode == code, done.stderr
        lines = done.stdout.splitlines()
        assert lines[:200_000] == [f"line {i}" for i in range(200_000)]
        assert lines[200_000:] == ([] if mode == "plain" else ["returned", "thread done"])
        assert marker.read_text() == "yes"
    # the real command: output and exit codes as before
    exe = str(Path(sys.executable).parent / "lakehouse")
    lake = tmp_path / "lake"
    made = subprocess.run([exe, "--lake", str(lake), "datasets", "create", "one"], timeout=120)
    assert made.returncode == 0
    listed = subprocess.run(
        [exe, "--lake", str(lake), "datasets", "list"], capture_output=True, text=True, timeout=120
    )
    assert (listed.returncode, listed.stdout.split()) == (0, ["one"])
    bad = subprocess.run([exe, "--nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such option" in bad.stderr.lower()


def test_a_json_document_is_indented_on_a_terminal_and_one_line_on_a_pipe(
    tmp_path: Path,
) -> None:
    """``--json`` for a person (a terminal) is indented; for a script (a pipe) it is
    one line holding one document. Also: a dataset with no flush yet says so
    instead of printing table version ``vNone``."""
    import os
    import pty

    lake_dir = tmp_path / "lake"
    Lakehouse(lake_dir, journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}").create_dataset("docs")
    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {**os.environ, "LAKEHOUSE_LAKE_URI": str(lake_dir)}
    env["LAKEHOUSE_JOURNAL_URL"] = f"sqlite:///{tmp_path / 'j.sqlite'}"

    def on_terminal(*args: str) -> str:
        leader, follower = pty.openpty()
        with subprocess.Popen(
            [exe, *args], stdout=follower, stderr=subprocess.DEVNULL, env=env
        ) as p:
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            os.close(leader)
            assert p.wait(timeout=60) == 0
        return b"".join(chunks).decode().replace("\r\n", "\n")

    piped = subprocess.run(
        [exe, "-d", "docs", "status", "--json"], capture_output=True, text=True, env=env
    )
    assert piped.returncode == 0, piped.stderr
    assert len(piped.stdout.strip().splitlines()) == 1
    shown = on_terminal("-d", "docs", "status", "--json")
    assert len(shown.strip().splitlines()) > 10
    assert json.loads(shown) == json.loads(piped.stdout)
    text = on_terminal("-d", "docs", "status")
    assert "vNone" not in text and "statements table: none yet (no flush has run)" in text
    # datasets list: a table for a person, names for a script
    table = on_terminal("datasets", "list").splitlines()
    assert table[0].split()[:4] == ["dataset", "version", "waiting", "title"]
    assert table[1].split()[:3] == ["docs", "-", "0"]
    names = subprocess.run([exe, "datasets", "list"], capture_output=True, text=True, env=env)
    assert names.stdout.split() == ["docs"]
