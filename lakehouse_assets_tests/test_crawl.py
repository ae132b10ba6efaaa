"""Crawl over a real folder and a real S3 prefix (the loopback moto server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli import cli
from lakehouse_assets.crawl import CRAWL_JOB
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.jobs import list_runs
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import s3_client
from lakehouse_assets_tests.conftest import make_bucket

FILES = {
    "letters/a.txt": b"letter a",
    "letters/b.txt": b"letter b",
    "letters/draft.tmp.txt": b"draft",
    "reports/2024/q1.pdf": b"%PDF-1.4 q1",
    "reports/2024/q2.pdf": b"%PDF-1.4 q2",
    "readme.md": b"# source",
}


def make_source(root: Path) -> Path:
    for rel, data in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def documents(lake: Lakehouse, name: str) -> dict[str, set[str]]:
    """Document entity id → file names, from the journal."""
    ds = lake.dataset(name)
    found: dict[str, set[str]] = {}
    for meta in ds.archive.list():
        stmts = ds.stored_statements(meta.checksum)
        found[meta.checksum] = {s.value for s in stmts if s.prop == "fileName"}
        assert {s.schema for s in stmts} == {"Document"}
    return found


def test_crawl_folder_then_again(local_lake: Lakehouse, tmp_path: Path) -> None:
    source = make_source(tmp_path / "source")
    ds = local_lake.create_dataset("crawled")
    first = ds.crawl(str(source))
    assert (first.seen, first.archived, first.skipped, first.failed) == (6, 6, 0, 0)
    assert first.bytes == sum(len(v) for v in FILES.values())
    keys = {m.key for m in ds.archive.list()}
    assert keys == set(FILES)
    docs = documents(local_lake, "crawled")
    assert len(docs) == 6 and {"q1.pdf"} in docs.values()
    for tag in (cv.ARCHIVE_LAST_UPDATED, cv.JOURNAL_LAST_UPDATED, cv.CRAWL_LAST_RUN):
        assert ds.core_tags.get(tag) is not None, tag
    (run,) = list_runs(ds.store, ds.name, CRAWL_JOB)
    assert run.status == "succeeded" and run.stats["archived"] == 6

    # the same source again: nothing new, nothing read
    journal_rows = local_lake.journal.count(ds.name)
    second = ds.crawl(f"file://{source}")
    assert (second.seen, second.archived, second.skipped) == (6, 0, 6)
    assert local_lake.journal.count(ds.name) == journal_rows
    assert len(list_runs(ds.store, ds.name, CRAWL_JOB)) == 2

    # a file changed at a crawled path is archived again (its size and mtime
    # differ from those recorded), a new Document; the others are skipped
    (source / "readme.md").write_bytes(b"# source, v2")
    changed = ds.crawl(str(source))
    assert (changed.archived, changed.updated, changed.skipped) == (0, 1, 5)
    assert len({m.checksum for m in ds.archive.list()}) == 7
    assert {"readme.md"} in [v for k, v in documents(local_lake, "crawled").items()]
    assert ds.crawl(str(source)).skipped == 6  # and then it is known

    # everything again when existing files are not skipped
    third = ds.crawl(str(source), skip_existing=False)
    assert third.archived == 6
    assert len({m.checksum for m in ds.archive.list()}) == 7


def test_crawl_filters(local_lake: Lakehouse, tmp_path: Path) -> None:
    source = make_source(tmp_path / "source")
    ds = local_lake.create_dataset("filtered")
    result = ds.crawl(str(source), prefix="letters", glob="*.txt", exclude="*.tmp.txt")
    assert result.archived == 2
    assert {m.key for m in ds.archive.list()} == {"letters/a.txt", "letters/b.txt"}
    pdfs = ds.crawl(str(source), glob="reports/*/*.pdf")
    assert pdfs.archived == 2


def test_failing_files_are_recorded_and_the_crawl_goes_on(
    local_lake: Lakehouse, tmp_path: Path
) -> None:
    source = make_source(tmp_path / "source")
    (source / "broken-link.txt").symlink_to(source / "missing.txt")  # unreadable
    ds = local_lake.create_dataset("failing")
    listed = sorted([*FILES, "broken-link.txt"])
    # q2.pdf vanishes between the listing and its turn
    doomed = source / "reports/2024/q2.pdf"

    def progress(_: int) -> None:
        doomed.unlink(missing_ok=True)

    result = ds.crawl(str(source), progress=progress)
    assert result.seen == len(listed)
    assert result.failed == 2 and result.archived == len(listed) - 2
    failed = {e["path"]: e["error"] for e in result.errors}
    assert set(failed) == {"broken-link.txt", "reports/2024/q2.pdf"}
    assert all("not found" in reason.lower() for reason in failed.values()), failed
    (run,) = list_runs(ds.store, ds.name, CRAWL_JOB)
    assert run.status == "succeeded"
    assert {e["path"] for e in run.errors} == set(failed)
    assert run.stats["failed"] == 2


def test_bad_sources(local_lake: Lakehouse, tmp_path: Path) -> None:
    ds = local_lake.create_dataset("bad_source")
    with pytest.raises(SourceNotFoundError, match="not a folder"):
        ds.crawl(str(tmp_path / "nope"))
    assert not (tmp_path / "nope").exists()
    with pytest.raises(InvalidInputError, match="bad_source"):
        ds.crawl("ftp://example.org/x")


def test_crawl_s3_prefix(local_lake: Lakehouse, s3_settings: Settings) -> None:
    bucket = make_bucket(s3_settings)
    client = s3_client(s3_settings)
    for rel, data in FILES.items():
        client.put_object(Bucket=bucket, Key=f"incoming/{rel}", Body=data)
    lake = Lakehouse(
        local_lake.settings.lake_uri,
        settings=s3_settings,
        journal_url=local_lake.settings.journal_url,
    )
    ds = lake.create_dataset("from_s3")
    result = ds.crawl(f"s3://{bucket}/incoming", glob="*.pdf")
    assert result.archived == 2
    assert {m.key for m in ds.archive.list()} == {"reports/2024/q1.pdf", "reports/2024/q2.pdf"}
    with ds.archive.open(next(iter(ds.archive.list())).checksum) as fh:
        assert fh.read().startswith(b"%PDF")
    assert ds.crawl(f"s3://{bucket}/incoming", glob="*.pdf").skipped == 2
    # an object overwritten with new content (a new ETag) is archived again
    client.put_object(Bucket=bucket, Key="incoming/reports/2024/q2.pdf", Body=b"%PDF-1.4 q2 v2")
    again = ds.crawl(f"s3://{bucket}/incoming", glob="*.pdf")
    assert (again.updated, again.skipped) == (1, 1)
    assert len({m.checksum for m in ds.archive.list()}) == 3


def test_crawl_cli(tmp_path: Path) -> None:
    source = make_source(tmp_path / "source")
    lake_dir = tmp_path / "lake"
    base = ["--lake", str(lake_dir), "--journal-url", f"sqlite:///{tmp_path / 'j.sqlite'}"]
    runner = CliRunner()
    assert runner.invoke(cli, [*base, "datasets", "create", "cli_crawl"]).exit_code == 0
    result = runner.invoke(
        cli,
        [
            *base,
            "-d",
            "cli_crawl",
            "crawl",
            str(source),
            "--glob",
            "*.txt",
            "--exclude",
            "*.tmp.txt",
        ],
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["archived"] == 2 and stats["errors"] == []
    again = runner.invoke(cli, [*base, "-d", "cli_crawl", "crawl", str(source), "--glob", "*.txt"])
    assert json.loads(again.stdout)["skipped"] == 2
    forced = runner.invoke(
        cli,
        [*base, "-d", "cli_crawl", "crawl", str(source), "--glob", "*.txt", "--no-skip-existing"],
    )
    assert json.loads(forced.stdout)["archived"] == 3


def test_crawl_job_in_dagster(local_lake: Lakehouse, tmp_path: Path) -> None:
    import dagster as dg

    from lakehouse_assets.definitions import defs
    from lakehouse_assets.defs.partitions import DATASETS

    source = make_source(tmp_path / "source")
    ds = local_lake.create_dataset("dagster_crawl")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, [ds.name])
        job = defs.resolve_job_def("crawl_job")
        result = run_crawl_job(job, instance, source, local_lake, ds.name)
    assert result.success
    (output,) = [e for e in result.events_for_node("crawl_source") if e.is_successful_output]
    assert output.step_output_data.metadata["archived"].value == 2
    assert {m.key for m in ds.archive.list()} == {"reports/2024/q1.pdf", "reports/2024/q2.pdf"}
    assert local_lake.journal.count(ds.name) > 0


def run_crawl_job(job: Any, instance: Any, source: Path, lake: Lakehouse, name: str) -> Any:
    from lakehouse_assets.defs.resources import LakehouseResource

    return job.execute_in_process(
        run_config={
            "ops": {"crawl_source": {"config": {"source_uri": str(source), "glob": "*.pdf"}}}
        },
        partition_key=name,
        instance=instance,
        resources={
            "lakehouse": LakehouseResource(
                lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
            )
        },
    )


def test_symlinks_out_of_the_tree_are_not_followed_unless_asked(tmp_path: Path) -> None:
    """A crawl archives the tree it was pointed at: a symlink to a file outside it
    is skipped and listed (``--follow-symlinks`` opts in); a link inside the tree
    is fine. ``archive add`` of a symlink is refused unless asked."""
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    outside = tmp_path / "secret.txt"
    outside.write_text("not for the archive")
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_text("a")
    (source / "inner-link.txt").symlink_to(source / "a.txt")
    (source / "leak.txt").symlink_to(outside)
    lake = tmp_path / "lake"
    Lakehouse(lake).create_dataset("links")
    runner = CliRunner()
    base = ["--lake", str(lake), "-d", "links"]

    result = runner.invoke(cli, [*base, "crawl", str(source)])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["skipped_symlinks"] == 1 and stats["archived"] == 2
    assert "leak.txt" in json.dumps(stats["errors"])
    ds = Lakehouse(lake).dataset("links")
    assert {m.name for m in ds.archive.list()} == {"a.txt", "inner-link.txt"}

    result = runner.invoke(cli, [*base, "crawl", str(source), "--follow-symlinks"])
    assert result.exit_code == 0, result.output
    assert {m.name for m in ds.archive.list()} == {"a.txt", "inner-link.txt", "leak.txt"}

    before = sorted(p.relative_to(lake).as_posix() for p in lake.rglob("*"))
    result = runner.invoke(cli, [*base, "archive", "add", str(source / "leak.txt")])
    assert result.exit_code == 1
    assert "is a symlink to" in result.stderr and "--follow-symlinks" in result.stderr
    assert sorted(p.relative_to(lake).as_posix() for p in lake.rglob("*")) == before
    result = runner.invoke(
        cli, [*base, "archive", "add", str(source / "leak.txt"), "--follow-symlinks"]
    )
    assert result.exit_code == 0, result.output
