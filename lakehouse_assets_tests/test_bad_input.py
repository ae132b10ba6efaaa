"""Bad input through the CLI: one clear line, the right exit code, nothing changed.

Each case runs one command against a lake that already holds a dataset, an
archived CSV and a mapping, journal rows and tags, and checks:

* the exit code (1: fix the input; 2: the command line itself is wrong);
* one line on stderr that names the problem (and dataset, file and line where
  they apply), never a traceback;
* the lake's file tree (every file, byte for byte) and the journal (every
  row, every column) are exactly as before.

Cases that touch the journal run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from lakehouse_assets.cli import cli
from lakehouse_assets.journal import journal_table
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import REPO, free_port, sample_entities

SAMPLE = REPO / "lakehouse_assets" / "sample"
CSV = SAMPLE / "documents" / "northwind-shareholders.csv"
CSV_SHA = hashlib.sha256(CSV.read_bytes()).hexdigest()
GOOD = [orjson.dumps(e) for e in sample_entities()[:3]]


@dataclass(frozen=True)
class Case:
    """One kind of bad input: the command (``{ds}``, ``{file}``, ``{dir}`` filled in)."""

    name: str
    args: tuple[str, ...]
    code: int
    message: str  # a regular expression the one line must match
    file: bytes | None = None  # content of ``{file}``
    stdin: bytes | None = None
    journal: bool = True  # also run on PostgreSQL
    extra: dict[str, Any] = field(default_factory=dict)


def lines(*extra: bytes) -> bytes:
    """Three good entity lines, then the bad one(s): the error must name line 4."""
    return b"\n".join([*GOOD, *extra])


def csv(text: str) -> bytes:
    return text.encode("utf-8")


HEADER = "entity_id,prop,schema,value\n"

CASES: list[Case] = [
    # --- names that would become paths --------------------------------------------
    Case(
        "dataset name with a path",
        ("-d", "../etc", "archive", "ls"),
        1,
        r"Invalid dataset name '\.\./etc'",
        journal=False,
    ),
    Case(
        "dataset name in capitals",
        ("-d", "Demo", "tags", "ls"),
        1,
        r"Invalid dataset name 'Demo'",
        journal=False,
    ),
    Case(
        "dataset name with a NUL",
        ("-d", "x\x00y", "tags", "ls"),
        1,
        r"Invalid dataset name",
        journal=False,
    ),
    Case(
        "unknown dataset",
        ("-d", "nope", "entities", "write", "-i", "{file}"),
        1,
        r"Dataset 'nope' does not exist",
        file=lines(),
    ),
    Case(
        "no dataset given",
        ("entities", "write", "-i", "{file}"),
        2,
        r"needs --dataset",
        file=lines(),
    ),
    Case(
        "tenant with a path",
        ("--tenant", "../root", "-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"Invalid tenant name '\.\./root'",
        file=lines(),
    ),
    Case(
        "origin with a slash",
        ("-d", "{ds}", "entities", "write", "-i", "{file}", "-o", "a/../b"),
        1,
        r"Invalid origin 'a/\.\./b'",
        file=lines(),
    ),
    Case(
        "tags of a tenant with a path",
        ("-d", "{ds}", "tags", "ls", "--tenant", "../../x"),
        1,
        r"Invalid tenant name",
        journal=False,
    ),
    Case(
        "job type with a path",
        ("-d", "{ds}", "jobs", "../flush"),
        1,
        r"Invalid job type '\.\./flush'",
        journal=False,
    ),
    Case(
        "file id with a path",
        ("-d", "{ds}", "archive", "delete", "../../config.yml"),
        1,
        r"Invalid file id '\.\./\.\./config\.yml'",
        journal=False,
    ),
    Case(
        "archive add with a bad file id",
        ("-d", "{ds}", "archive", "add", "--file-id", "../x", "{file}"),
        1,
        r"Invalid file id '\.\./x'",
        file=b"hello",
        journal=False,
    ),
    Case(
        "checksum that is not one",
        ("-d", "{ds}", "archive", "get", "xyz"),
        1,
        r"checksum prefix 'xyz': give at least 4 hex characters of a SHA-256",
        journal=False,
    ),
    Case(
        "unlock an operation with a path",
        ("-d", "{ds}", "unlock", "--operation", "../x"),
        1,
        r"Invalid job type '\.\./x'",
        journal=False,
    ),
    # --- files and sources -------------------------------------------------------------
    Case(
        "input file missing",
        ("-d", "{ds}", "entities", "write", "-i", "{dir}/missing.json"),
        2,
        r"no such file",
        journal=False,
    ),
    Case(
        "archive a missing file",
        ("-d", "{ds}", "archive", "add", "{dir}/missing.pdf"),
        1,
        r"Source file not found.*missing\.pdf",
        journal=False,
    ),
    Case(
        "checksum mismatch",
        ("-d", "{ds}", "archive", "add", "--checksum", "0" * 64, "{file}"),
        1,
        r"checksum mismatch.*nothing was stored",
        file=b"hello",
        journal=False,
    ),
    Case(
        "unreachable http source",
        ("-d", "{ds}", "archive", "add", "http://127.0.0.1:{port}/a.pdf"),
        1,
        r"Cannot reach",
        journal=False,
    ),
    Case(
        "unknown checksum",
        ("-d", "{ds}", "archive", "get", "f" * 64),
        1,
        r"No file with checksum f{64} in dataset '{ds}'",
        journal=False,
    ),
    Case(
        "unknown file id",
        ("-d", "{ds}", "archive", "delete", "a" * 40),
        1,
        r"No file with id a{40} in dataset '{ds}'",
        journal=False,
    ),
    Case(
        "crawl a missing folder",
        ("-d", "{ds}", "crawl", "{dir}/nowhere"),
        1,
        r"crawl source is not a folder",
    ),
    Case(
        "crawl an unsupported scheme",
        ("-d", "{ds}", "crawl", "ftp://example.org/x"),
        1,
        r"cannot crawl 'ftp://example\.org/x'",
    ),
    # --- entity lines (each names the file and line 4) ------------------------------
    Case(
        "malformed JSON",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"\[dataset '{ds}', file '.*', line 4\] malformed JSON",
        file=lines(b'{"id": "x", "schema": "Person", "properties": {'),
    ),
    Case(
        "unknown schema",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'x': unknown schema 'Unicorn'",
        file=lines(b'{"id": "x", "schema": "Unicorn", "properties": {}}'),
    ),
    Case(
        "abstract schema",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'x': schema 'Thing' is abstract",
        file=lines(b'{"id": "x", "schema": "Thing", "properties": {}}'),
    ),
    Case(
        "unknown property",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'x': schema Person has no property 'wings'",
        file=lines(b'{"id": "x", "schema": "Person", "properties": {"wings": ["2"]}}'),
    ),
    Case(
        "entity without id",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity has no id",
        file=lines(b'{"schema": "Person", "properties": {"name": ["No Id"]}}'),
    ),
    Case(
        "properties not an object",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'x': 'properties' must be an object",
        file=lines(b'{"id": "x", "schema": "Person", "properties": ["name"]}'),
    ),
    Case(
        "a line that is not an object",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] expected a JSON object",
        file=lines(b'["not", "an", "object"]'),
    ),
    Case(
        "entity line not UTF-8",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] not UTF-8",
        file=lines(b'{"id": "x", "schema": "Person", "properties": {"name": ["M\xfcller"]}}'),
    ),
    Case(
        "bad line on stdin",
        ("-d", "{ds}", "entities", "write"),
        1,
        r"file '<stdin>', line 4\] entity 'x': unknown schema 'Unicorn'",
        stdin=lines(b'{"id": "x", "schema": "Unicorn", "properties": {}}'),
    ),
    # --- one rule on every backend (limits checked before any write) -----------------
    Case(
        "an entity id over 1,024 characters",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity id: is 1025 characters long \(at most 1024\)",
        file=lines(b'{"id": "%s", "schema": "Person", "properties": {}}' % (b"x" * 1025)),
    ),
    Case(
        "a NUL character in an entity id",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity id: contains a NUL character",
        file=lines(b'{"id": "a\\u0000b", "schema": "Person", "properties": {}}'),
    ),
    Case(
        "a NUL character in a value",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'n': a value of 'name' contains a NUL character",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": ["A\\u0000B"]}}'),
    ),
    Case(
        "a lang over 16 characters",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] lang is 17 characters long \(at most 16\)",
        file=csv("entity_id,prop,schema,value,lang\np1,name,Person,Ann,%s\n" % ("x" * 17)),
    ),
    Case(
        "a first_seen that is not a date",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] first_seen 'not-a-date' is not an ISO 8601 date-time",
        file=csv("entity_id,prop,schema,value,first_seen\np1,name,Person,Ann,not-a-date\n"),
    ),
    Case(
        "a first_seen over 32 characters",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] first_seen is 33 characters long",
        file=csv("entity_id,prop,schema,value,first_seen\np1,name,Person,Ann,%s\n" % ("2" * 33)),
    ),
    # --- nothing altered silently ----------------------------------------------------
    Case(
        "a number as a property value",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 'n': value 1 of 'name' is a int, not a string",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": [5]}}'),
    ),
    Case(
        "a boolean as a property value",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"value 1 of 'name' is a bool, not a string",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": [true]}}'),
    ),
    Case(
        "null in a value list",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"value 2 of 'name' is a null, not a string",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": ["A", null]}}'),
    ),
    Case(
        "an entity's first_seen that is not a date",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"dataset '{ds}'.*line 4\] entity 's': first_seen 'yesterday' is not an ISO 8601 date-time",
        file=lines(b'{"id": "s", "schema": "Person", "first_seen": "yesterday"}'),
    ),
    Case(
        "an entity's last_seen before its first_seen",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 's': first_seen 2024-01-02T00:00:00 is after last_seen 2024-01-01",
        file=lines(
            b'{"id": "s", "schema": "Person", "first_seen": "2024-01-02T00:00:00", '
            b'"last_seen": "2024-01-01T00:00:00"}'
        ),
    ),
    Case(
        "an entity's last_change that is a number",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"line 4\] entity 's': last_change must be a string, not int",
        file=lines(b'{"id": "s", "schema": "Person", "last_change": 1700000000}'),
    ),
    Case(
        "a nested list in a value list",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"value 1 of 'name' is a list, not a string",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": [["A", "B"]]}}'),
    ),
    Case(
        "an object in a value list",
        ("-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"value 1 of 'name' is a dict, not a string",
        file=lines(b'{"id": "n", "schema": "Person", "properties": {"name": [{"a": 1}]}}'),
    ),
    Case(
        "a statement CSV with an unknown column",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 1\] unknown columns \['colour'\]",
        file=csv("entity_id,prop,schema,value,colour\np1,name,Person,Ann,red\n"),
    ),
    Case(
        "a statement CSV row with surplus cells",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] 2 cell\(s\) more than the header has columns",
        file=csv(HEADER + "p1,name,Person,Ann,extra,more\n"),
    ),
    Case(
        "external that is not a boolean",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] external 'maybe' is not a boolean",
        file=csv("entity_id,prop,schema,value,external\np1,name,Person,Ann,maybe\n"),
    ),
    Case(
        "a statement of another dataset",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] statement of dataset 'other', not '{ds}'",
        file=csv("entity_id,prop,schema,value,dataset\np1,name,Person,Ann,other\n"),
    ),
    # --- statement CSV ----------------------------------------------------------------
    Case(
        "statement CSV lacks columns",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 1\] statement CSV lacks columns \['entity_id', 'prop', 'schema'\]",
        file=csv("entity,value\nx,y\n"),
    ),
    Case(
        "statement of an unknown schema",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 3\] unknown schema 'Unicorn'",
        file=csv(HEADER + "p1,name,Person,Ann\np1,name,Unicorn,Ann\n"),
    ),
    Case(
        "statement of an unknown property",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 3\] schema Person has no property 'wings'",
        file=csv(HEADER + "p1,name,Person,Ann\np1,wings,Person,2\n"),
    ),
    Case(
        "statement id that followthemoney would not make",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] statement id 'made-up' does not match",
        file=csv("id," + HEADER + "made-up,p1,name,Person,Ann\n"),
    ),
    Case(
        "statement with a wrong prop_type",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] prop_type 'date' is wrong for Person:name",
        file=csv("prop_type," + HEADER + "date,p1,name,Person,Ann\n"),
    ),
    Case(
        "statement value missing",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"line 2\] statement has no value",
        file=csv(HEADER + "p1,name,Person,\n"),
    ),
    Case(
        "statement CSV not UTF-8",
        ("-d", "{ds}", "statements", "write", "-i", "{file}"),
        1,
        r"not UTF-8",
        file=HEADER.encode() + b"p1,name,Person,M\xfcller\n",
    ),
    # --- mappings -------------------------------------------------------------------
    Case(
        "mapping of a file not in the archive",
        ("-d", "{ds}", "mapping", "add", "b" * 64, "{file}"),
        1,
        r"no archived file has this checksum",
        file=(SAMPLE / "northwind-shareholders.yml").read_bytes(),
        journal=False,
    ),
    Case(
        "mapping that is not YAML",
        ("-d", "{ds}", "mapping", "add", CSV_SHA, "{file}"),
        1,
        r"not valid YAML",
        file=b"queries: [unclosed",
        journal=False,
    ),
    Case(
        "mapping with an unknown schema",
        ("-d", "{ds}", "mapping", "add", CSV_SHA, "{file}"),
        1,
        r"Unicorn",
        file=b"queries:\n- entities:\n    c:\n      schema: Unicorn\n      keys: [name]\n",
        journal=False,
    ),
    Case(
        "mapping of a column the CSV lacks",
        ("-d", "{ds}", "mapping", "add", CSV_SHA, "{file}"),
        1,
        r"nonexistent_column",
        file=b"queries:\n- entities:\n    c:\n      schema: Company\n"
        b"      keys: [nonexistent_column]\n",
        journal=False,
    ),
    # --- options --------------------------------------------------------------------
    Case(
        "export of an unknown kind",
        ("-d", "{ds}", "export", "pictures"),
        2,
        r"Invalid value for .*'pictures' is not one of",
        journal=False,
    ),
    Case(
        "query filter without a value",
        ("-d", "{ds}", "query", "--no-flush", "-p", "name"),
        2,
        r"expected PROPERTY=VALUE",
        journal=False,
    ),
    Case(
        "negative vacuum retention",
        ("-d", "{ds}", "optimize", "--retention-hours", "-1"),
        2,
        r"Invalid value for '--retention-hours'",
        journal=False,
    ),
    Case(
        "get an entity that is not there",
        ("-d", "{ds}", "get", "no-such-entity"),
        1,
        r"no entity 'no-such-entity' in dataset '{ds}'",
    ),
    Case(
        "query filter on a property no schema has",
        ("-d", "{ds}", "query", "--no-flush", "-p", "wings=1"),
        1,
        r"invalid query: Invalid prop",
        journal=False,
    ),
    Case(
        "query filter on an unknown schema",
        ("-d", "{ds}", "query", "--no-flush", "-s", "Nonexistent"),
        1,
        r"Dataset '{ds}': unknown FtM schema 'Nonexistent'",
        journal=False,
    ),
    Case(
        "flush with a negative batch size",
        ("-d", "{ds}", "flush", "--batch-rows", "-5"),
        2,
        r"Invalid value for '--batch-rows'",
        journal=False,
    ),
    Case(
        "an empty lake URI",
        ("--lake", "", "datasets", "list"),
        2,
        r"an empty lake URI",
        journal=False,
    ),
    Case(
        "a lake under a regular file",
        ("--lake", "{file}/lake", "datasets", "list"),
        1,
        r"lake .*/lake: .* is a file, not a folder",
        file=b"just a file",
        journal=False,
    ),
    Case(
        "a lake that is a regular file",
        ("--lake", "{file}", "datasets", "list"),
        1,
        r"is a file, not a folder",
        file=b"just a file",
        journal=False,
    ),
    Case(
        "a journal URL with an unknown driver",
        ("--journal-url", "nosuchdb://host/x", "-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"journal database: .*nosuchdb",
        file=lines(),
        journal=False,
    ),
    Case(
        "a journal file that is not a database",
        ("--journal-url", "sqlite:///{file}", "-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"journal database: .*not a database",
        file=lines(),
        journal=False,
    ),
    Case(
        "an in-memory journal",
        ("--journal-url", "sqlite://", "-d", "{ds}", "entities", "write", "-i", "{file}"),
        1,
        r"in-memory journal",
        file=lines(),
        journal=False,
    ),
    Case(
        "a PostgreSQL journal that refuses connections",
        (
            "--journal-url",
            "postgresql://127.0.0.1:{port}/x",
            "-d",
            "{ds}",
            "entities",
            "write",
            "-i",
            "{file}",
        ),
        1,
        r"journal database: .*Connection refused",
        file=lines(),
        journal=False,
    ),
    Case(
        "stream before any export",
        ("-d", "{ds}", "stream"),
        1,
        r"has no entities\.ftm\.json yet",
        journal=False,
    ),
]


def fingerprint(lake_dir: Path, engine: sa.Engine, dataset: str) -> tuple[Any, ...]:
    files = {
        str(p.relative_to(lake_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(lake_dir.rglob("*"))
        if p.is_file()
    }
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(journal_table)
            .where(journal_table.c.dataset.in_([dataset, "nope"]))
            .order_by(journal_table.c.seq)
        ).all()
    return files, [tuple(r) for r in rows]


def checker(tmp_path: Path, journal_url: str, dataset_name: str) -> Callable[[Case], None]:
    """A lake with a dataset, an archived CSV + mapping, journal rows and tags;
    returns the function that runs a case against it."""
    lake_dir = tmp_path / "lake"
    lake = Lakehouse(lake_dir, journal_url=journal_url)
    ds = lake.create_dataset(dataset_name)
    ds.add_file(str(CSV))
    ds.add_mapping(CSV_SHA, (SAMPLE / "northwind-shareholders.yml").read_text())
    for e in sample_entities()[:5]:
        ds.add_entity(e, origin="before")
    engine = lake.journal.engine

    def check(case: Case) -> None:
        subs = {"ds": dataset_name, "dir": str(tmp_path), "port": str(free_port())}
        path = tmp_path / "input.bin"
        if case.file is not None:
            path.write_bytes(case.file)
        subs["file"] = str(path)
        args = [a.format(**subs) for a in case.args]
        before = fingerprint(lake_dir, engine, dataset_name)
        result = CliRunner().invoke(
            cli,
            ["--lake", str(lake_dir), "--journal-url", journal_url, *args],
            input=case.stdin,
        )
        assert result.exit_code == case.code, (result.output, result.exception)
        assert isinstance(result.exception, SystemExit), repr(result.exception)
        err = result.stderr.strip()
        assert "Traceback" not in result.output
        assert len(err.splitlines()) == 1, err
        assert re.search(case.message.replace("{ds}", dataset_name), err), err
        assert fingerprint(lake_dir, engine, dataset_name) == before

    return check


@pytest.mark.parametrize("case", [c for c in CASES if c.journal], ids=lambda c: c.name)
def test_bad_input_is_refused_and_changes_nothing(
    tmp_path: Path, journal_url: str, dataset_name: str, case: Case
) -> None:
    checker(tmp_path, journal_url, dataset_name)(case)


@pytest.mark.parametrize("case", [c for c in CASES if not c.journal], ids=lambda c: c.name)
def test_bad_names_files_and_options_are_refused(
    tmp_path: Path, dataset_name: str, case: Case
) -> None:
    """Cases that never reach the journal: run once, on SQLite."""
    checker(tmp_path, f"sqlite:///{tmp_path / 'journal.sqlite'}", dataset_name)(case)


def test_there_are_enough_kinds() -> None:
    assert len(CASES) >= 40
