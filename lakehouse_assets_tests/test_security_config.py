"""Bounded parsing and numbers: config.yml, mapping YAML and every numeric setting.

Before: a 10,000-deep config.yml stopped every command with RecursionError, a
5,000-deep mapping with a traceback; ``vacuum_retention_hours: true`` became
one hour and ``1.0e+29`` was accepted (``optimize --vacuum`` then overflowed);
duplicate keys took the last value; a config.yml that is a directory was
ignored; a config.yml linked to a secret file printed that file's content in
the error. Each is now one line naming the file (and line, and setting).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.bounded import (
    MAX_DEPTH,
    BoundedParseError,
    load_json,
    load_yaml,
)
from lakehouse_assets.catalog import MAX_CONFIG_BYTES
from lakehouse_assets.cli import cli
from lakehouse_assets.errors import InvalidConfigError, InvalidInputError, InvalidSettingError
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.mappings import parse_queries
from lakehouse_assets.settings import MAX_RETENTION_HOURS, Settings
from lakehouse_assets_tests.conftest import REPO, make_bucket

SAMPLE = REPO / "lakehouse_assets" / "sample"
SECRET = "AKIA-SECRET-do-not-print-1234"

#: A billion laughs: ten aliases of ten aliases, nine levels deep (10**9 values).
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("LAKEHOUSE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def config_error(lake_dir: Path, text: str | bytes) -> str:
    """The error of opening a lake whose config.yml is ``text``; the CLI's must be
    the same one line, exit 1."""
    lake_dir.mkdir(parents=True, exist_ok=True)
    path = lake_dir / cv.CATALOG_CONFIG
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return open_error(lake_dir)


def open_error(lake_dir: Path) -> str:
    with pytest.raises(InvalidConfigError) as error:
        Lakehouse(lake_dir)
    message = str(error.value)
    assert message.startswith(str(lake_dir / cv.CATALOG_CONFIG)) and "\n" not in message
    res = CliRunner().invoke(cli, ["--lake", str(lake_dir), "config", "show"])
    assert res.exit_code == 1 and res.stderr == f"Error: {message}\n", res.stderr
    return message


# --- config.yml: shape ------------------------------------------------------------


def test_a_deep_config_is_one_line_in_every_command(tmp_path: Path) -> None:
    """10,000 levels (flow and block): refused at level 65, before recursion runs out."""
    flow = "retention: " + "[" * 10_000 + "]" * 10_000 + "\n"
    assert "nested deeper than 64 levels at line 1" in config_error(tmp_path / "lake", flow)
    block = "".join("  " * i + "k:\n" for i in range(500))
    assert "nested deeper than 64 levels at line 64" in config_error(tmp_path / "lake", block)
    compact = "retention:\n" + "- " * 10_000 + "x\n"
    assert "nested deeper than 64 levels at line 2" in config_error(tmp_path / "lake", compact)
    # in a fresh process, as an operator meets it (RecursionError was a traceback)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-m", "lakehouse_assets.cli", "--lake", "lake", "datasets", "list"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "nested deeper than 64 levels" in res.stderr and "Traceback" not in res.stderr


def test_a_config_nested_within_the_limit_is_read(tmp_path: Path) -> None:
    """The bound is on depth, not on an ordinary config's shape."""
    (tmp_path / "lake").mkdir()
    deep = {"publisher": {"name": "ACME", "url": "https://acme.example.org"}}
    (tmp_path / "lake" / cv.CATALOG_CONFIG).write_text(
        yaml.safe_dump({"dataset_defaults": deep, "retention": {"vacuum_retention_hours": 24}})
    )
    assert Lakehouse(tmp_path / "lake").settings.vacuum_retention_hours == 24
    assert load_yaml("- " * (MAX_DEPTH - 1) + "x\n", max_bytes=1000) is not None


def test_an_oversized_config_is_refused_unread(tmp_path: Path) -> None:
    text = "title: " + "x" * MAX_CONFIG_BYTES + "\n"
    assert "larger than the 1,048,576 bytes allowed" in config_error(tmp_path / "lake", text)


def test_an_alias_bomb_in_config_is_refused(tmp_path: Path) -> None:
    message = config_error(tmp_path / "lake", "dataset_defaults:\n  keywords: *a9\n" + BOMB)
    assert "not valid YAML" in message  # an alias before its anchor
    message = config_error(tmp_path / "lake", BOMB + "title: x\n")
    assert "expands to more than 1,000,000 values" in message
    message = config_error(tmp_path / "lake", "title: &t [x, *t]\n")
    assert "refers to a node that contains it" in message


def test_duplicate_keys_in_config_are_refused(tmp_path: Path) -> None:
    text = "journal_url: sqlite:///a.sqlite\ntitle: T\njournal_url: sqlite:///b.sqlite\n"
    message = config_error(tmp_path / "lake", text)
    assert "duplicate key 'journal_url' at line 3 (first at line 1)" in message
    nested = "retention:\n  vacuum_retention_hours: 1\n  vacuum_retention_hours: 2\n"
    assert "duplicate key 'vacuum_retention_hours' at line 3" in config_error(
        tmp_path / "lake", nested
    )
    assert "duplicate key 'title' at line 1" in config_error(
        tmp_path / "lake", "{title: a, title: b}"
    )


def test_a_config_that_is_a_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "lake" / cv.CATALOG_CONFIG).mkdir(parents=True)
    assert "is a directory" in open_error(tmp_path / "lake")


def test_a_config_that_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()
    os.mkfifo(tmp_path / "lake" / cv.CATALOG_CONFIG)
    assert "is not a regular file" in open_error(tmp_path / "lake")


# --- config.yml: never echo another file ---------------------------------------------


@pytest.mark.parametrize(
    "secret_file",
    [
        f"retention: {SECRET}\n",  # a type error showed the value
        f"title: *{SECRET}\n",  # an undefined alias showed its name
        f"aws_secret_access_key = {SECRET}\n[default\n",
        f"{SECRET}: 1\n",  # an unknown key showed the key
    ],
)
def test_a_config_linked_to_a_secret_file_is_refused_unread(
    tmp_path: Path, secret_file: str
) -> None:
    secret = tmp_path / "credentials"
    secret.write_text(secret_file)
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / cv.CATALOG_CONFIG).symlink_to(secret)
    message = open_error(tmp_path / "lake")
    assert "is a symbolic link" in message and SECRET not in message
    # a link to a directory, and a dangling link, are the same error
    (tmp_path / "lake" / cv.CATALOG_CONFIG).unlink()
    (tmp_path / "lake" / cv.CATALOG_CONFIG).symlink_to(tmp_path / "nowhere")
    assert "is a symbolic link" in open_error(tmp_path / "lake")


@pytest.mark.parametrize(
    "text",
    [
        f"title: *{SECRET}\n",
        f"title: !{SECRET} x\n",
        f"title: !!python/object:{SECRET} x\n",
        f"title: x\n\t{SECRET}\n",
        f'title: "\\q{SECRET}"\n',
        f"title: !{SECRET}!x y\n",
        f"title: x\n  {SECRET}: [\n",
    ],
)
def test_yaml_errors_never_quote_the_text(tmp_path: Path, text: str) -> None:
    """Line, column and the kind of problem; not PyYAML's snippet of the line."""
    message = config_error(tmp_path / "lake", text)
    assert "not valid YAML at line" in message and SECRET not in message
    with pytest.raises(InvalidInputError) as error:
        parse_queries(text, where="mapping.yml")
    assert SECRET not in str(error.value)


# --- numbers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("true", "a number of hours is expected, not true"),
        ("false", "a number of hours is expected, not false"),
        ("1.0e+29", "(got 1e+29)"),
        ("1" + "0" * 29, "less than or equal to 87600"),  # accepted, then vacuum overflowed
        (str(MAX_RETENTION_HOURS + 1), "less than or equal to 87600"),
        ("-1", "greater than or equal to 0"),
        (".inf", "finite number"),
        (".nan", "finite number"),
    ],
)
def test_vacuum_retention_in_config_is_a_bounded_number(
    tmp_path: Path, value: str, says: str
) -> None:
    message = config_error(tmp_path / "lake", f"retention:\n  vacuum_retention_hours: {value}\n")
    assert "retention.vacuum_retention_hours" in message and says in message


def test_vacuum_retention_at_its_bounds_is_accepted(tmp_path: Path) -> None:
    for hours in (0, MAX_RETENTION_HOURS):
        (tmp_path / "lake").mkdir(exist_ok=True)
        (tmp_path / "lake" / cv.CATALOG_CONFIG).write_text(
            f"retention:\n  vacuum_retention_hours: {hours}\n"
        )
        assert Lakehouse(tmp_path / "lake").settings.vacuum_retention_hours == hours


def test_the_cli_retention_option_is_bounded_too(tmp_path: Path) -> None:
    """``optimize --retention-hours`` (click's range: exit 2, before any work)."""
    args = ["--lake", str(tmp_path / "lake"), "-d", "ds", "optimize", "--vacuum"]
    res = CliRunner().invoke(cli, [*args, "--retention-hours", "1" + "0" * 29])
    assert res.exit_code == 2 and "--retention-hours" in res.stderr
    assert "Traceback" not in res.stderr


def numeric_fields() -> list[tuple[str, type]]:
    return [
        (name, field.annotation)  # type: ignore[misc]
        for name, field in Settings.model_fields.items()
        if field.annotation in (int, float)
    ]


def bounds(name: str) -> tuple[float, float]:
    """A numeric setting's (lowest, highest) accepted value, from its Field."""
    low = high = None
    for item in Settings.model_fields[name].metadata:
        for attr, shift in (("ge", 0), ("gt", 1)):
            if getattr(item, attr, None) is not None:
                low = getattr(item, attr) + shift
        for attr, shift in (("le", 0), ("lt", -1)):
            if getattr(item, attr, None) is not None:
                high = getattr(item, attr) + shift
    assert low is not None and high is not None, f"{name} has no range"
    return low, high


def test_every_numeric_setting_has_a_range() -> None:
    """A new int or float setting without ge/gt and le/lt fails here."""
    assert len(numeric_fields()) >= 14
    for name, _ in numeric_fields():
        low, high = bounds(name)
        assert low <= Settings.model_fields[name].default <= high, name


@pytest.mark.parametrize(("name", "kind"), numeric_fields())
def test_every_numeric_setting_refuses_bools_and_out_of_range(
    name: str, kind: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = bounds(name)
    bad: list[Any] = [True, False, high * 10 + 1, low - 1, 1e29]
    if kind is float:
        bad += [math.inf, -math.inf, math.nan]
    for value in bad:
        with pytest.raises(InvalidSettingError, match=name) as error:
            Settings(**{name: value})
        assert "\n" not in str(error.value)
    for value in (low, high):
        assert getattr(Settings(**{name: value}), name) == value
    # from the environment: the variable is named, one line
    variable = f"LAKEHOUSE_{name.upper()}"
    for text in ("true", "1e29", "-1e9", "nan"):
        monkeypatch.setenv(variable, text)
        with pytest.raises(InvalidSettingError, match=variable):
            Settings()


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("LAKEHOUSE_VACUUM_RETENTION_HOURS", "true", "valid integer"),
        ("LAKEHOUSE_VACUUM_RETENTION_HOURS", "1e29", "valid integer"),
        ("LAKEHOUSE_VACUUM_RETENTION_HOURS", "100000", "less than or equal to 87600"),
        ("LAKEHOUSE_LOCK_WAIT_SECONDS", "nan", "finite number"),
        ("LAKEHOUSE_SPARK_CONNECT_PORT", "70000", "less than or equal to 65535"),
        ("LAKEHOUSE_SPARK_CONFIG", "{not json", "spark_config"),
    ],
)
def test_a_bad_setting_in_the_environment_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    """Settings() runs first in every command: its error was a pydantic traceback."""
    monkeypatch.setenv(variable, value)
    res = CliRunner().invoke(cli, ["--lake", str(tmp_path / "lake"), "datasets", "list"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr


# --- the S3 lake ---------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["256MB", "1.5GB", "0.5 GiB", "512KiB"])
def test_the_duckdb_memory_limit_takes_a_size(limit: str) -> None:
    assert Settings(duckdb_memory_limit=limit).duckdb_memory_limit == limit


@pytest.mark.parametrize("limit", ["0MB", "0.0GB", "-1GB", "lots", "1 TB", "256", "1e3MB"])
def test_the_duckdb_memory_limit_refuses_what_is_not_a_size(limit: str) -> None:
    with pytest.raises(InvalidSettingError, match="duckdb_memory_limit"):
        Settings(duckdb_memory_limit=limit)


@pytest.mark.s3
def test_config_bounds_on_an_s3_lake(s3_settings: Settings) -> None:
    uri = f"s3://{make_bucket(s3_settings)}/lake"
    store = Lakehouse(uri, settings=s3_settings).store
    where = f"{uri}/{cv.CATALOG_CONFIG}"
    for text, says in [
        ("retention: " + "[" * 10_000 + "]" * 10_000, "nested deeper than 64 levels"),
        ("title: a\ntitle: b\n", "duplicate key 'title' at line 2"),
        ("title: " + "x" * (MAX_CONFIG_BYTES + 10), "larger than the 1,048,576 bytes"),
        ("retention: {vacuum_retention_hours: true}", "not true"),
        (BOMB + "title: x\n", "expands to more than"),
    ]:
        store.write_text(cv.CATALOG_CONFIG, text)
        with pytest.raises(InvalidConfigError, match=says) as error:
            Lakehouse(uri, settings=s3_settings)
        assert str(error.value).startswith(where)


# --- mapping YAML ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("q: " + "[" * 5_000 + "]" * 5_000, "nested deeper than 64 levels at line 1"),
        ("q:\n" + "- " * 5_000 + "x\n", "nested deeper than 64 levels at line 2"),
        ("".join("  " * i + "k:\n" for i in range(500)), "nested deeper than 64 levels"),
        (BOMB + "queries: [*a9]\n", "expands to more than"),
        ("queries:\n  - entities: {}\nqueries: []\n", "duplicate key 'queries' at line 3"),
        ("x: " + "y" * (4 * 1024 * 1024), "larger than the 4,194,304 bytes allowed"),
    ],
)
def test_a_bounded_mapping_yaml(text: str, says: str) -> None:
    with pytest.raises(InvalidInputError, match=says) as error:
        parse_queries(text, where="[dataset 'ds', mapping]")
    assert str(error.value).startswith("[dataset 'ds', mapping]")


def test_a_deep_or_duplicate_mapping_through_the_cli(tmp_path: Path) -> None:
    """``mapping add``: one line, exit 1, nothing stored (a traceback before)."""
    csv = tmp_path / "northwind-shareholders.csv"
    shutil.copy(SAMPLE / "documents" / csv.name, csv)
    base = ["--lake", str(tmp_path / "lake"), "--journal-url", f"sqlite:///{tmp_path}/j.sqlite"]
    runner = CliRunner()
    assert runner.invoke(cli, [*base, "datasets", "create", "ds"]).exit_code == 0
    res = runner.invoke(cli, [*base, "-d", "ds", "archive", "add", str(csv)])
    assert res.exit_code == 0, res.output
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path}/j.sqlite")
    (checksum,) = [f.checksum for f in lake.dataset("ds").archive.list()]
    good = (SAMPLE / "northwind-shareholders.yml").read_text()
    for text, says in [
        ("q: " + "[" * 5_000 + "]" * 5_000, "nested deeper than 64 levels"),
        (good + "sample_companies: {}\n", "duplicate key 'sample_companies' at line"),
    ]:
        mapping = tmp_path / "mapping.yml"
        mapping.write_text(text)
        res = runner.invoke(cli, [*base, "-d", "ds", "mapping", "add", checksum, str(mapping)])
        assert res.exit_code == 1 and res.stderr.count("\n") == 1, res.stderr
        assert says in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "lake" / "ds" / "mappings").exists()
    mapping.write_text(good)  # the sample itself passes the bounds
    res = runner.invoke(cli, [*base, "-d", "ds", "mapping", "add", checksum, str(mapping)])
    assert res.exit_code == 0, res.stderr


def test_merge_keys_may_override_and_a_stored_mapping_reads_back() -> None:
    text = "base: &b {schema: Person, key: id}\nqueries:\n  - entities:\n      p:\n        <<: *b\n        key: other\n"
    (query,) = parse_queries(text, where="m")
    assert query["entities"]["p"] == {"schema": "Person", "key": "other"}
    # what store_mapping writes (yaml.safe_dump, anchors for shared objects) reads back
    shared = {"column": "name"}
    stored = yaml.safe_dump({"queries": [{"entities": {"a": shared, "b": shared}}]})
    assert "&id" in stored and parse_queries(stored, where="m")[0]["entities"]["b"] == shared


# --- JSON ----------------------------------------------------------------------------


def test_bounded_json() -> None:
    with pytest.raises(BoundedParseError, match="nested deeper than 64 levels at line 2"):
        load_json("{\n" + '{"a":' * 100 + "1" + "}" * 100 + "}", max_bytes=10_000)
    with pytest.raises(BoundedParseError, match="duplicate key 'a'"):
        load_json('{"a": 1, "a": 2}', max_bytes=100)
    with pytest.raises(BoundedParseError, match="larger than the 10 bytes"):
        load_json('"' + "x" * 20 + '"', max_bytes=10)
    with pytest.raises(BoundedParseError, match="not valid JSON at line 1, column 7"):
        load_json('{"a": }', max_bytes=100)
    # brackets inside strings are not depth; an escaped quote does not end a string
    assert load_json('{"a": "[[[[\\"[[[["}', max_bytes=100, max_depth=1) == {"a": '[[[["[[[['}
    # a million levels: no RecursionError (json.loads alone would raise it)
    with pytest.raises(BoundedParseError, match="nested deeper"):
        load_json("[" * 1_000_000 + "]" * 1_000_000, max_bytes=10_000_000)


@pytest.mark.parametrize("hours", [10**29, -1, True, 2.5, MAX_RETENTION_HOURS + 1])
def test_the_python_api_retention_is_bounded_before_any_work(
    local_lake: Lakehouse, hours: Any
) -> None:
    """``Dataset.optimize(retention_hours=…)`` took any number (1e29 overflowed the
    vacuum's dates); now the setting's bounds hold, refused before Spark starts."""
    ds = local_lake.create_dataset("ds")
    with pytest.raises(InvalidInputError, match="retention_hours must be a whole number"):
        ds.optimize(vacuum=True, retention_hours=hours)
    assert not local_lake.store.exists(cv.dataset_path("ds", "jobs"))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("a: " + "[" * 10_000 + "]" * 10_000 + "\n", "deeper"),
        ("title: a\ntitle: b\n", "duplicate"),
    ],
)
def test_a_dataset_config_is_read_bounded(local_lake: Lakehouse, text: str, problem: str) -> None:
    """A dataset's own config.yml goes through the same bounded reader as the
    catalog's: a 10,000-deep or duplicate-key file is one error naming it,
    not a RecursionError in every command that lists the catalog."""
    local_lake.create_dataset("ds")
    local_lake.store.write_text(cv.dataset_path("ds", cv.CONFIG), text)
    for read in (lambda: local_lake.dataset("ds").config(), local_lake.write_catalog):
        with pytest.raises(InvalidConfigError, match=problem) as err:
            read()
        assert "ds/config.yml" in str(err.value) and "\n" not in str(err.value)
