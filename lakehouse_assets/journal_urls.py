"""Which journal URLs the lakehouse accepts: a SQLite *file* or a PostgreSQL *server*.

A write is acknowledged once its rows are committed to the journal, so a
journal that forgets them when the process exits loses acknowledged writes.
SQLite has several ways to be in memory or temporary that a URL can ask
for: ``sqlite://``, ``sqlite:///:memory:``, an empty path (a temporary
database, deleted on close), and, with ``uri=true``, SQLite URI filenames
such as ``file::memory:?cache=shared``, ``file:x?mode=memory`` or
``vfs=memdb``. Rather than trying to recognise every such form (SQLite may
add more), the rule is an allow-list, checked by :func:`checked_journal_url`
wherever a URL enters (``Settings`` from the environment, ``config.yml``,
``--journal-url`` and ``Lakehouse(journal_url=...)`` through
``Settings.resolved_journal_url``, and :class:`~lakehouse_assets.journal.Journal`
itself):

* ``sqlite:///PATH`` (``sqlite+pysqlite``): PATH non-empty, not ``:memory:``,
  and no query parameters except the driver's own (``timeout``, ...). Without
  ``uri=true`` SQLAlchemy hands SQLite ``os.path.abspath(PATH)``, which is
  always a file. SQLite URI filenames (``uri=true``) are refused even when
  they name a file: ``sqlite:///PATH`` says the same without the forms that
  are not files. The message says whether the URL was in memory.
* ``postgresql://`` (``postgresql+psycopg2``): a server, with no connection
  option that would make the journal's tables temporary: libpq's ``options``
  parameter (``-c search_path=pg_temp``, ``--search_path=...``) can put
  ``pg_temp`` first on the search path, so ``CREATE TABLE journal`` makes a
  temporary table that vanishes with the connection (:func:`postgres_options`).
  The same can come from outside the URL (``PGOPTIONS``, a role's or a
  database's ``search_path``): :class:`~lakehouse_assets.journal.Journal`
  checks where its tables really live after creating them.
* anything else (another database, another driver): refused; the journal's
  SQL is written for these two.

Only the URL's shape is judged here, never the database behind it (a server
that is down is the connection's error, at first use).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote

from lakehouse_assets.errors import NonDurableJournalError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.engine import URL, Engine

#: Query parameters the pysqlite driver takes itself (SQLAlchemy's list in
#: ``SQLiteDialect_pysqlite.create_connect_args``, without ``uri``): they set
#: the Python connection, never which database is opened.
SQLITE_DRIVER_PARAMETERS = frozenset(
    {"timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements"}
)
SQLITE_DRIVERS = frozenset({"sqlite", "sqlite+pysqlite"})
POSTGRESQL_DRIVERS = frozenset({"postgresql", "postgresql+psycopg2"})
#: ``asbool``'s false words in SQLAlchemy: ``uri=false`` turns URI filenames off.
FALSE_WORDS = frozenset({"false", "no", "off", "n", "f", "0"})

USE_INSTEAD = "use a SQLite file (sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST/DB)"


def _shown(url: URL, given: str) -> str:
    """The URL as it may be printed: as given, but a password hidden."""
    return repr(url.render_as_string(hide_password=True) if url.password else given)


def _uri_mode(url: URL) -> bool:
    """Whether SQLAlchemy opens the database with ``uri=True``: any ``uri``
    parameter but a false word does (a repeated one is a tuple, which
    ``asbool`` takes as true)."""
    value = url.query.get("uri")
    if value is None:
        return False
    return not (isinstance(value, str) and value.strip().lower() in FALSE_WORDS)


def _sqlite_filename(url: URL) -> str:
    """What SQLAlchemy passes to ``sqlite3.connect`` (``create_connect_args``)."""
    database = url.database or ""
    if not _uri_mode(url):
        return database or ":memory:"
    rest = {k: v for k, v in url.query.items() if k not in SQLITE_DRIVER_PARAMETERS | {"uri"}}
    if rest:
        database += "?" + "&".join(f"{k}={rest[k]}" for k in sorted(rest))
    return database


def sqlite_in_memory(url: URL) -> bool:
    """Whether SQLite, given this URL the way SQLAlchemy gives it, opens a
    database that is gone when the connection closes (in memory or temporary).

    Follows SQLite's URI filename rules (``file:`` prefix, case-insensitive;
    an optional ``//authority``; the path up to ``?``/``#``, percent-decoded;
    ``mode=memory`` and ``vfs=memdb`` in the query) for ``uri=true`` URLs.
    Used for the message: every ``uri=true`` URL is refused either way.
    """
    filename = _sqlite_filename(url)
    if filename in ("", ":memory:"):
        return True
    if not _uri_mode(url):
        # mode=memory without uri=true is ignored by SQLAlchemy (the file is
        # opened); it is refused with the in-memory message all the same
        return any(k == "mode" and v == "memory" for k, v in _query_items(url))
    if filename[:5].lower() != "file:":
        return False  # a plain file name, "?" and all
    rest = filename[5:]
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        rest = "" if slash < 0 else rest[slash:]
    path, _, query = rest.partition("?")
    path = unquote(path.partition("#")[0])
    params = parse_qsl(query.partition("#")[0], keep_blank_values=True)
    return (
        path in ("", ":memory:")
        or any(k == "mode" and v == "memory" for k, v in params)
        or any(k == "vfs" and v == "memdb" for k, v in params)
    )


def _query_items(url: URL) -> list[tuple[str, str]]:
    items = []
    for key, value in url.query.items():
        for one in (value,) if isinstance(value, str) else value:
            items.append((key, one))
    return items


#: A schema name on a search path that is session-private: ``pg_temp`` (the
#: session's temporary schema) or ``pg_temp_N`` (one of them by number).
_TEMP_SCHEMA = re.compile(r'^\s*"?pg_temp(_\d+)?"?\s*$', re.IGNORECASE)


def postgres_options(url: URL) -> list[tuple[str, str]]:
    """The server settings libpq's ``options`` URL parameter sets, as (name, value):
    ``-c name=value``, ``-cname=value`` and ``--name=value`` (PostgreSQL's
    command-line forms; names are case-insensitive, ``-`` and ``_`` alike)."""
    found: list[tuple[str, str]] = []
    for key, value in _query_items(url):
        if key != "options":
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        expect = False
        for word in words:
            setting = None
            if expect:
                setting, expect = word, False
            elif word == "-c":
                expect = True
            elif word.startswith("-c") or word.startswith("--"):
                setting = word[2:]
            if setting and "=" in setting:
                name, _, val = setting.partition("=")
                found.append((name.strip().lower().replace("-", "_"), val))
    return found


def temporary_search_path(path: str) -> bool:
    """Whether a ``search_path`` value puts a temporary schema first among the
    schemas it names, so new tables are created there."""
    first = path.split(",")[0] if path.strip() else ""
    return bool(_TEMP_SCHEMA.match(first))


def checked_journal_url(url: str) -> str:
    """``url`` unchanged if it names a SQLite file or a PostgreSQL server;
    otherwise :class:`~lakehouse_assets.errors.NonDurableJournalError` naming
    the URL (password hidden) and what to use instead. See the module docstring."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # the URL is shown unless it may carry a password (user:password@host)
        shown = repr(url[:200]) if "@" not in url else repr(url.partition("://")[0][:40] + "://…")
        raise NonDurableJournalError(
            f"journal URL {shown} is not a database URL: {USE_INSTEAD}"
        ) from None
    if parsed.drivername in POSTGRESQL_DRIVERS:
        for name, value in postgres_options(parsed):
            if name == "search_path" and temporary_search_path(value):
                raise NonDurableJournalError(
                    f"journal URL {_shown(parsed, url)}: its options set search_path={value}, "
                    "which creates the journal as temporary tables that lose acknowledged "
                    "writes when the connection closes: remove the option (or name a "
                    "permanent schema)"
                )
        return url
    if parsed.drivername not in SQLITE_DRIVERS:
        raise NonDurableJournalError(
            f"journal database: {parsed.drivername} (journal URL {_shown(parsed, url)}) is not "
            f"supported: {USE_INSTEAD}"
        )
    if sqlite_in_memory(parsed):
        raise NonDurableJournalError(
            f"journal URL {_shown(parsed, url)} is an in-memory journal, which loses acknowledged "
            f"writes when the process exits: {USE_INSTEAD}"
        )
    if parsed.username or parsed.password or parsed.host or parsed.port:
        raise NonDurableJournalError(
            f"journal URL {_shown(parsed, url)} names a host, which a SQLite file has not: "
            "write sqlite:////absolute/path or sqlite:///relative/path"
        )
    extra = sorted(set(parsed.query) - SQLITE_DRIVER_PARAMETERS)
    if extra:
        raise NonDurableJournalError(
            f"journal URL {_shown(parsed, url)}: the SQLite parameter(s) {', '.join(extra)} are not "
            "accepted (SQLite URI filenames can name databases that are not files): "
            "name the file as sqlite:///PATH"
        )
    return url


def check_tables_durable(engine: Engine, names: Sequence[str], url: str) -> None:
    """Refuse PostgreSQL tables ``names`` that would not outlive the session.

    The URL's own ``options`` are judged by :func:`checked_journal_url`; a
    temporary schema can also come from ``PGOPTIONS`` or a role's or
    database's ``search_path``, and an unlogged table is emptied by a crash
    of the server. So ask the server where the names resolve (``to_regclass``
    follows the session's search path as every journal query does) and how
    they persist. A name just created that does not resolve was made where
    this session cannot see it (another session's temporary schema).
    """
    from sqlalchemy.engine import make_url

    with engine.connect() as conn:
        path = conn.exec_driver_sql("SHOW search_path").scalar()
        for name in names:
            row = conn.exec_driver_sql(
                "SELECT c.relpersistence, n.nspname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = to_regclass(%(name)s)",
                {"name": name},
            ).first()
            persistence, schema = (str(row[0]), str(row[1])) if row else ("t", "?")
            if persistence == "p":
                continue
            what = "a temporary table" if persistence == "t" else "an unlogged table"
            shown = repr(make_url(url).render_as_string(hide_password=True))
            raise NonDurableJournalError(
                f"journal URL {shown}: the journal table {name!r} is {what} "
                f"(schema {schema}, search_path {path!r}), which loses acknowledged "
                "writes; check the URL's options, PGOPTIONS and the role's and "
                "database's search_path"
            )
