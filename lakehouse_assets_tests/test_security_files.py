"""The file-access policy of source URIs (:mod:`lakehouse_assets.access`).

A hostile tenant names files through the queue; a careless operator through
``archive add`` and ``crawl``. Every test here runs against the real policy on
real files (symlinks, a FIFO, a hard link, /proc), on a local lake and on the
loopback S3 lake where the lake's storage is touched, with a real SQLite
journal. None needs Spark.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.access import SourceAccess, sqlite_file
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.queue import uuid7
from lakehouse_assets.settings import Settings

#: What a secret looks like: its bytes must never reach the lake.
MARKER = "h2-secret-marker-7f3a"


def reopened(lake: Lakehouse, roots: list[str]) -> Lakehouse:
    """The same lake (and journal) with ``LAKEHOUSE_SOURCE_ROOTS`` set to ``roots``."""
    settings = lake.settings.model_copy(update={"source_roots": roots})
    return Lakehouse(lake.store.uri, settings=settings)


def lake_bytes(ds: Dataset) -> bytes:
    """Every byte the dataset holds in the lake (archive, queue records, ...)."""
    prefix = cv.dataset_path(ds.name) + "/"
    return b"".join(ds.store.read_bytes(p) for p in ds.store.list(prefix))


def journal_file(lake: Lakehouse) -> Path:
    path = sqlite_file(lake.settings.resolved_journal_url())
    assert path is not None and path.exists()
    return path


# --- the queue: no roots, no local file ------------------------------------------


def test_the_queue_reads_no_local_file_without_roots(
    lake: Lakehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/self/environ (the consumer's S3 keys), the journal, /etc/passwd and an
    ordinary file: with no roots configured every queued local path is set aside
    with the reason, and nothing of any of them lands in the lake."""
    monkeypatch.setenv("H2_SECRET", MARKER)
    lake = reopened(lake, [])
    ds = lake.create_dataset("hostile")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    plain = tmp_path / "plain.txt"
    plain.write_text(MARKER)
    uris = ["/proc/self/environ", str(journal_file(lake)), "/etc/passwd", str(plain)]
    uris.append(f"file://{plain}")
    pushed = [ds.queue.push("UPSERT", "file", {"uri": uri}, tenant="evil") for uri in uris]

    result = ds.queue.consume()

    assert result.applied == 0 and len(result.failed) == len(uris)
    errors = {f["id"]: f["error"] for f in result.failed}
    assert "never read as a source" in errors[pushed[0].id]
    assert "never read as a source" in errors[pushed[1].id]
    for item in pushed[2:]:
        assert "LAKEHOUSE_SOURCE_ROOTS, and none is set" in errors[item.id]
    assert list(ds.archive.list()) == []
    stored = lake_bytes(ds)
    assert MARKER.encode() not in stored and b"root:x:0:0" not in stored
    assert b"SQLite format 3" not in stored


def test_the_queue_reads_under_its_roots_with_every_symlink_resolved(
    lake: Lakehouse, tmp_path: Path
) -> None:
    """Under a configured root a file is archived; a path through a directory
    symlink leaving the root (``dir_link/hostname``, ``dir_link -> /etc``) and a
    file symlink to a secret outside are refused, never read."""
    root = tmp_path / "inbox"
    root.mkdir()
    (root / "a.txt").write_text("welcome")
    (root / "dir_link").symlink_to("/etc")
    secret = tmp_path / "secret.txt"
    secret.write_text(MARKER)
    (root / "leak.txt").symlink_to(secret)
    (root / "sub").mkdir()
    (root / "sub" / "up").symlink_to(tmp_path)  # inbox/sub/up/secret.txt is outside
    lake = reopened(lake, [str(root)])
    ds = lake.create_dataset("rooted")

    ok = ds.queue.push("UPSERT", "file", {"uri": str(root / "a.txt"), "document": True})
    etc = ds.queue.push("UPSERT", "file", {"uri": str(root / "dir_link" / "hostname")})
    link = ds.queue.push("UPSERT", "file", {"uri": str(root / "leak.txt")})
    up = ds.queue.push("UPSERT", "file", {"uri": str(root / "sub" / "up" / "secret.txt")})
    result = ds.queue.consume()

    assert result.applied == 1
    errors = {f["id"]: f["error"] for f in result.failed}
    assert set(errors) == {etc.id, link.id, up.id}
    for item in (etc, link, up):
        assert "resolves outside the allowed source folders" in errors[item.id]
        # the error names the URI given, never where the link points
        assert str(secret) not in errors[item.id] and "/etc/" not in errors[item.id]
    assert [m.name for m in ds.archive.list()] == ["a.txt"]
    assert ok.id in {i["id"] for i in result.items if i["outcome"] == "applied"}
    assert MARKER.encode() not in lake_bytes(ds)


# --- a caller's own paths: anywhere, but never the lake's internals ---------------------


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder as the current directory, no roots configured."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("LAKEHOUSE_SOURCE_ROOTS", raising=False)
    return work


def test_the_api_reads_the_callers_own_paths_anywhere_and_never_the_lakes_own_files(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whose path is it: a path the user names in their own call is theirs to
    read wherever it lies (``archive add /data/report.pdf`` from any folder);
    the lake's internals and the system trees stay refused whoever names them."""
    monkeypatch.setenv("H2_SECRET", MARKER)
    state = tmp_path / "server-state"
    (state / "jobs").mkdir(parents=True)
    (state / "jobs" / "job.json").write_text(MARKER)
    monkeypatch.setenv("LAKEHOUSE_API_STATE_DIR", str(state))
    journal = workdir / "journal.sqlite"
    lake = Lakehouse(workdir / "lake", journal_url=f"sqlite:///{journal}")
    ds = lake.create_dataset("api")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    (workdir / "report.txt").write_text("fine")
    (workdir / "dir_link").symlink_to("/etc")
    elsewhere = tmp_path / "data" / "report.pdf"
    elsewhere.parent.mkdir()
    elsewhere.write_text("the user's own file, outside the current directory")
    (workdir / "journal-copy.db").hardlink_to(journal)  # the journal by another name
    (workdir / "journal-link.db").symlink_to(journal)  # and through a link
    (workdir / "lakehouse.env").write_text(f"LAKEHOUSE_S3_SECRET_ACCESS_KEY={MARKER}\n")
    os.mkfifo(workdir / "pipe")  # reading it would hang forever

    assert ds.add_file("report.txt").size == 4  # relative to the current directory
    assert ds.add_file(str(elsewhere)).size == elsewhere.stat().st_size
    assert ds.add_file(f"file://{elsewhere}").size == elsewhere.stat().st_size
    assert ds.add_file("dir_link/hostname").size == Path("/etc/hostname").stat().st_size
    refused = {
        "/proc/self/environ": "never read as a source",
        "/dev/null": "never read as a source",
        "/sys/kernel/mm/transparent_hugepage/enabled": "never read as a source",
        str(journal): "never read as a source",
        "journal-link.db": "never read as a source",
        str(workdir / "lake" / "config.yml"): "never read as a source",
        str(workdir / "lake" / "api" / "config.yml"): "never read as a source",
        "lakehouse.env": "never read as a source",
        str(state / "jobs" / "job.json"): "never read as a source",
        str(ds.settings.cache_path / "x"): "never read as a source",
        str(workdir / "journal-copy.db"): "a system or lakehouse file",
        "pipe": "is not a regular file",
        str(workdir): "is not a regular file",
    }
    for uri, message in refused.items():
        with pytest.raises(InvalidInputError, match=message):
            ds.add_file(uri)
    with pytest.raises(SourceNotFoundError):
        ds.add_file("missing.txt")
    assert sorted(m.name for m in ds.archive.list()) == sorted(
        ["report.txt", "report.pdf", "report.pdf", "hostname"]
    )
    assert MARKER.encode() not in lake_bytes(ds)

    # the queue (tenants' paths) still reads only under the configured roots
    ds.queue.push("UPSERT", "file", {"uri": str(elsewhere)})
    result = ds.queue.consume()
    assert result.applied == 0 and "outside the allowed source folders" in result.failed[0]["error"]


def test_an_s3_source_inside_the_lake_itself_is_refused(lake: Lakehouse) -> None:
    """Another dataset's files are no source: the lake's own prefix (or folder) is off limits."""
    other = lake.create_dataset("other")
    ds = lake.create_dataset("thief")
    inside = lake.store.full_uri(cv.dataset_path(other.name, cv.CONFIG))
    if not inside.startswith("s3://"):
        inside = str(Path(inside))
    with pytest.raises(InvalidInputError, match="(inside the lake itself|never read as a source)"):
        ds.add_file(inside)
    assert list(ds.archive.list()) == []


def test_a_symlink_appearing_inside_a_checked_path_is_not_followed(tmp_path: Path) -> None:
    """The race: the path was checked with no symlink in it, then a folder of it
    became a link. Opening walks the checked path with O_NOFOLLOW on every part,
    so the swapped-in link fails the open instead of being followed."""
    from lakehouse_assets.access import _open_no_symlinks

    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "hostname").write_text("mine")
    access = SourceAccess.for_queue(Settings(source_roots=[str(root)]))
    checked = access.check_path(root / "docs" / "hostname", "docs/hostname")
    (root / "docs" / "hostname").unlink()
    (root / "docs").rmdir()
    (root / "docs").symlink_to("/etc")  # the swap, after the check
    with pytest.raises(InvalidInputError, match="a symlink appeared"):
        os.close(_open_no_symlinks(checked, "docs/hostname", access))


# --- the CLI: archive add and crawl ------------------------------------------------


def test_cli_archive_add_and_crawl_read_the_users_paths_but_never_the_lakes_internals(
    workdir: Path, tmp_path: Path
) -> None:
    from lakehouse_assets.cli import cli

    lake = workdir / "lake"
    ds = Lakehouse(lake).create_dataset("cli")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    journal = Path(ds.settings.resolved_journal_url().removeprefix("sqlite:///"))
    assert journal.is_file()
    (workdir / "docs").mkdir()
    (workdir / "docs" / "a.txt").write_text("a")
    (workdir / "docs" / "leak.db").symlink_to(journal)
    (workdir / "lake_link").symlink_to(lake)
    (workdir / "lakehouse.env").write_text(f"LAKEHOUSE_S3_SECRET_ACCESS_KEY={MARKER}\n")
    elsewhere = tmp_path / "data" / "report.pdf"
    elsewhere.parent.mkdir()
    elsewhere.write_text("mine")
    runner = CliRunner()
    base = ["--lake", str(lake), "-d", "cli"]

    for uri in ("docs/a.txt", str(elsewhere)):  # from the current directory and outside it
        ok = runner.invoke(cli, [*base, "archive", "add", uri])
        assert ok.exit_code == 0, ok.output
    for uri in ("/proc/self/environ", "docs/leak.db", str(journal), "lakehouse.env"):
        res = runner.invoke(cli, [*base, "archive", "add", uri, "--follow-symlinks"])
        assert res.exit_code == 1, res.output
        assert "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1
        assert uri in res.stderr and "never read as a source" in res.stderr
    # a crawl of a folder that is a link into the lake: refused as a whole
    res = runner.invoke(cli, [*base, "crawl", "lake_link"])
    assert res.exit_code == 1 and "never read as a source" in res.stderr
    # a followed link to the journal is a failed file, recorded, never archived
    res = runner.invoke(cli, [*base, "crawl", "docs", "--follow-symlinks"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    assert stats["failed"] == 1 and "leak.db" in json.dumps(stats["errors"])
    ds = Lakehouse(lake).dataset("cli")
    assert sorted(m.name for m in ds.archive.list()) == ["a.txt", "a.txt", "report.pdf"]
    assert MARKER.encode() not in lake_bytes(ds)


# --- planted queue files -------------------------------------------------------------


def test_a_planted_symlink_item_is_set_aside_without_reading_its_target(
    local_lake: Lakehouse, tmp_path: Path
) -> None:
    """A queue item that is a symlink (to a secret, here a valid-looking item) is
    recorded as failed with the error and no copy of the target; the link goes,
    the target stays."""
    ds = local_lake.create_dataset("planted")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"secret": MARKER}))
    item_id = uuid7()
    link = ds.store.local_path(cv.queue_item(ds.name, "evil", item_id))
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)

    listed = ds.queue.list()
    assert [e.id for e in listed] == [item_id] and "symlink" in (listed[0].error or "")
    result = ds.queue.consume()

    assert result.failed and "symlink" in result.failed[0]["error"]
    record = json.loads(ds.store.read_bytes(cv.queue_failed(ds.name, "evil", item_id)))
    assert record["raw"] is None and record["item"] is None
    assert MARKER.encode() not in lake_bytes(ds)
    assert not link.is_symlink() and secret.read_text() == json.dumps({"secret": MARKER})


def test_a_symlinked_tenant_folder_is_reported_never_followed(
    local_lake: Lakehouse, tmp_path: Path
) -> None:
    """``queue/evil -> /somewhere``: its files are neither read, nor set aside
    (copied), nor deleted; the folder is reported as invalid."""
    ds = local_lake.create_dataset("linked")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "notes.json").write_text(MARKER)
    (target / f"{uuid7()}.json").write_text(MARKER)
    queue = ds.store.local_path(cv.queue_prefix(ds.name))
    queue.mkdir(parents=True)
    (queue / "evil").symlink_to(target)

    result = ds.queue.consume()

    assert result.failed == [] and result.applied == 0
    assert [i["folder"] for i in result.invalid] == [f"{cv.queue_prefix(ds.name)}evil"]
    assert "symlink" in result.invalid[0]["error"]
    assert len(list(target.iterdir())) == 2  # nothing deleted
    assert MARKER.encode() not in lake_bytes(ds)
    assert [e.state for e in ds.queue.list()] == ["invalid"]
    assert not ds.queue.has_pending()
