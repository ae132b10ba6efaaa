"""Durability by construction: a journal is a SQLite file or a PostgreSQL server.

Every URL form that SQLite (through SQLAlchemy) opens in memory or as a
temporary database is refused with one line naming the URL, whichever way
the URL comes in: ``--journal-url``, ``LAKEHOUSE_JOURNAL_URL``, the Python API
(``Lakehouse(journal_url=...)``, ``Settings``, ``Journal``) and the catalog
``config.yml``. Before, ``sqlite:///file::memory:?cache=shared&uri=true``
printed "wrote 1 entities" and the rows were gone when the process exited.
SQLite URI filenames (``uri=true``) are refused even when they name a file:
``sqlite:///PATH`` says the same without the forms that are not files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidConfigError, LakehouseError, NonDurableJournalError
from lakehouse_assets.journal import Journal
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets_tests.conftest import REPO, sample_entities

#: (URL, what the one line must say): each opened in memory / as a temporary
#: database by SQLAlchemy + SQLite, or a SQLite URI filename.
IN_MEMORY = [
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///",  # an empty path: SQLAlchemy opens :memory:
    "sqlite+pysqlite:///:memory:",
    "sqlite:///%3Amemory%3A",  # percent-decoded by SQLAlchemy
    "sqlite:///:memory:?uri=false",
    "sqlite:///file::memory:?cache=shared&uri=true",
    "sqlite:///file:x?mode=memory&uri=true",
    "sqlite:///file:x?mode=memory&cache=shared&uri=1",
    "sqlite:///file://localhost/x?mode=memory&uri=true",
    "sqlite:///file:memdb1?vfs=memdb&uri=true",
    "sqlite:///file:?uri=true",  # an empty URI path: a temporary database
    "sqlite:///?uri=true",  # an empty file name: a temporary database
    "sqlite:///x.sqlite?mode=memory",  # ignored by SQLAlchemy, refused all the same
]
#: Not in memory, but not the plain file form either: refused, saying why.
NOT_PLAIN = [
    ("sqlite:///file:journal.sqlite?uri=true", "not accepted"),
    ("sqlite:///journal.sqlite?uri=true&uri=false", "not accepted"),
    ("sqlite:///journal.sqlite?cache=shared", "not accepted"),
    ("sqlite://localhost/journal.sqlite", "names a host"),
    ("duckdb:///:memory:", "not supported"),
    ("mysql://user:hunter2@127.0.0.1/journal", "not supported"),
]
REFUSED = [(url, "in-memory journal") for url in IN_MEMORY] + NOT_PLAIN


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh process (what an operator runs)."""
    return subprocess.run(
        [sys.executable, "-m", "lakehouse_assets.cli", *args],
        capture_output=True,
        text=True,
        env={**(env or os.environ), "PYTHONPATH": str(REPO)},
        cwd=cwd,
        timeout=120,
    )


@pytest.fixture
def entities_file(tmp_path: Path) -> Path:
    path = tmp_path / "entities.ftm.json"
    path.write_bytes(orjson.dumps(sample_entities()[0]) + b"\n")
    return path


@pytest.fixture
def lake_dir(tmp_path: Path) -> Path:
    """A lake with dataset ``ds`` (journal: a file outside the lake)."""
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'good.sqlite'}")
    lake.create_dataset("ds")
    return tmp_path / "lake"


def assert_refused(res: subprocess.CompletedProcess[str], url: str, says: str) -> None:
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "wrote" not in res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert says in res.stderr
    if "hunter2" in url:
        assert "hunter2" not in res.stderr  # the password is never shown
    else:
        assert url in res.stderr  # the URL is named as given


@pytest.mark.parametrize(("url", "says"), REFUSED)
def test_the_cli_refuses_a_journal_that_is_not_a_file_or_server(
    tmp_path: Path, lake_dir: Path, entities_file: Path, url: str, says: str
) -> None:
    res = cli(
        "--lake", str(lake_dir), "--journal-url", url, "-d", "ds",
        "entities", "write", "-i", str(entities_file),
        cwd=tmp_path,
    )  # fmt: skip
    assert_refused(res, url, says)
    # the same URL from the environment
    env = {**os.environ, "LAKEHOUSE_JOURNAL_URL": url}
    res = cli(
        "--lake", str(lake_dir), "-d", "ds", "entities", "write", "-i", str(entities_file),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert_refused(res, url, says)
    assert "LAKEHOUSE_JOURNAL_URL" in res.stderr


@pytest.mark.parametrize(("url", "says"), REFUSED)
def test_the_python_api_refuses_a_journal_that_is_not_a_file_or_server(
    tmp_path: Path, lake_dir: Path, url: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for make in (
        lambda: Journal(url),
        lambda: Settings(journal_url=url),
        lambda: Lakehouse(lake_dir, journal_url=url).dataset("ds").add_entity(sample_entities()[0]),
        lambda: (
            Lakehouse(lake_dir, settings=Settings().model_copy(update={"journal_url": url}))
            .dataset("ds")
            .add_entity(sample_entities()[0])
        ),
    ):
        with pytest.raises(LakehouseError, match=says) as error:
            make()
        assert "\n" not in str(error.value)
    with pytest.raises(NonDurableJournalError):
        Journal(url)
    # nothing was written anywhere: not to the lake's own journal either
    assert not (lake_dir / "journal.sqlite").exists()


@pytest.mark.parametrize(("url", "says"), REFUSED)
def test_a_config_yml_journal_that_is_not_a_file_or_server_is_refused(
    tmp_path: Path, lake_dir: Path, entities_file: Path, url: str, says: str
) -> None:
    (lake_dir / cv.CATALOG_CONFIG).write_text(yaml.safe_dump({"journal_url": url}))
    with pytest.raises(InvalidConfigError, match=says) as error:
        Lakehouse(lake_dir)
    assert str(error.value).startswith(str(lake_dir / cv.CATALOG_CONFIG))
    res = cli(
        "--lake", str(lake_dir), "-d", "ds", "entities", "write", "-i", str(entities_file),
        cwd=tmp_path,
    )  # fmt: skip
    assert_refused(res, url, says)
    assert "config.yml" in res.stderr


def test_a_journal_file_or_server_is_accepted_and_keeps_the_write(
    tmp_path: Path, lake_dir: Path, entities_file: Path, journal_url: str, dataset_name: str
) -> None:
    """The allow-list lets both real journals through, from the CLI and from
    config.yml, and the written rows are there for the next process."""
    Lakehouse(lake_dir, journal_url=journal_url).create_dataset(dataset_name)
    res = cli(
        "--lake", str(lake_dir), "--journal-url", journal_url, "-d", dataset_name,
        "entities", "write", "-i", str(entities_file),
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "wrote 1 entities" in res.stderr + res.stdout
    (lake_dir / cv.CATALOG_CONFIG).write_text(yaml.safe_dump({"journal_url": journal_url}))
    lake = Lakehouse(lake_dir)
    assert lake.setting_sources["journal_url"] == "config.yml"
    try:
        assert lake.journal.count(dataset_name) > 0
    finally:
        lake.journal.clear(dataset_name)
        lake.journal.dispose()


def test_a_relative_sqlite_file_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    journal = Journal("sqlite:///relative.sqlite?timeout=5")
    assert (tmp_path / "relative.sqlite").is_file()
    journal.engine.dispose()


#: libpq ``options`` that put a temporary schema first on the search path: the
#: journal's CREATE TABLE then makes session-private tables (issue 52: "wrote 1
#: entities", exit 0, and the next process found 0 rows)
TEMPORARY_OPTIONS = [
    "options=-csearch_path%3Dpg_temp",
    "options=-c%20search_path%3Dpg_temp",
    "options=--search_path%3DPG_TEMP",
    "options=-c%20search_path%3D%22pg_temp_3%22,public",
]


@pytest.mark.postgres
@pytest.mark.parametrize("options", TEMPORARY_OPTIONS)
def test_a_postgresql_url_whose_options_make_the_journal_temporary_is_refused(
    tmp_path: Path, lake_dir: Path, entities_file: Path, postgres_database: str, options: str
) -> None:
    url = f"{postgres_database}?{options}"
    res = cli(
        "--lake", str(lake_dir), "--journal-url", url, "-d", "ds",
        "entities", "write", "-i", str(entities_file),
        cwd=tmp_path,
    )  # fmt: skip
    assert_refused(res, url, "search_path")
    assert "temporary" in res.stderr
    with pytest.raises(NonDurableJournalError, match="temporary"):
        Lakehouse(lake_dir, journal_url=url).dataset("ds").add_entity(sample_entities()[0])


@pytest.mark.postgres
def test_a_temporary_search_path_from_outside_the_url_is_found_on_the_server(
    tmp_path: Path, lake_dir: Path, entities_file: Path, postgres_database: str
) -> None:
    """PGOPTIONS (or a role's or database's search_path) can do what the URL's
    options do: the journal asks the server where its tables were made."""
    env = {**os.environ, "PGOPTIONS": "-c search_path=pg_temp"}
    res = cli(
        "--lake", str(lake_dir), "--journal-url", postgres_database, "-d", "ds",
        "entities", "write", "-i", str(entities_file),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "wrote" not in res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "temporary table" in res.stderr, res.stderr
    # a database whose own search_path is temporary: the same, with no option anywhere
    import sqlalchemy as sa

    from lakehouse_assets_tests.conftest import psycopg2_url

    name = postgres_database.rsplit("/", 1)[1]
    admin = sa.create_engine(psycopg2_url(postgres_database), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"ALTER DATABASE {name} SET search_path = pg_temp"))
    admin.dispose()
    with pytest.raises(NonDurableJournalError, match="temporary table"):
        Journal(postgres_database)
    # the writes of an accepted journal are there for the next process
    good = Journal(f"{postgres_database}?options=-csearch_path%3Dpublic")
    assert good.count("ds") == 0
