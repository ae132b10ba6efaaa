"""Names and paths of the storage layout (conventions layer)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidNameError

CH = "ab" * 32


def test_layout_paths_follow_the_specification() -> None:
    ts = datetime(2026, 11, 22, 10, 11, 12, 123456, tzinfo=UTC)
    assert cv.archive_blob("ds", CH) == f"ds/archive/ab/ab/ab/{CH}/data"
    assert cv.archive_meta("ds", CH, "f1") == f"ds/archive/ab/ab/ab/{CH}/f1.json"
    assert cv.archive_text("ds", CH, "ocr") == f"ds/archive/ab/ab/ab/{CH}/ocr.txt"
    assert cv.tag_path("ds", "app", "journal/last_updated") == "ds/tags/app/journal/last_updated"
    assert cv.lock_path("ds", "app", "flush") == "ds/locks/app/flush"
    assert cv.job_run_path("ds", "crawl", ts) == "ds/jobs/runs/crawl/20261122T101112123456Z.json"
    assert cv.dataset_version("ds", "index.json", ts) == (
        "ds/versions/2026/11/20261122T101112123456Z/index.json"
    )
    assert cv.catalog_version("index.json", ts).startswith("versions/2026/11/")
    assert cv.mapping_config("ds", CH) == f"ds/mappings/{CH}/mapping.yml"
    assert cv.dataset_path("ds", cv.STATEMENTS_TABLE) == "ds/entities/statements"
    assert cv.dataset_path("ds", cv.TRANSLOG_TABLE) == "ds/entities/translog"
    assert cv.dataset_path("ds", cv.LOCK) == "ds/.LOCK"
    assert cv.queue_item("ds", "app", "0190") == "ds/queue/app/0190.json"


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        "../etc",
        "a/b",
        "/abs",
        "UPPER",
        "with space",
        "a\x00b",
        "x" * 129,
        "a-b",
        "versions",
    ],
)
def test_invalid_dataset_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidNameError, match="dataset name"):
        cv.dataset_name(name)


@pytest.mark.parametrize("name", ["kek", "my_dataset_2", "0"])
def test_valid_dataset_names(name: str) -> None:
    assert cv.dataset_name(name) == name


@pytest.mark.parametrize(
    "key", ["../x", "a/../b", "/abs", "a//b", ".hidden", "a/.", "", "a\x00", "a\\b"]
)
def test_tag_keys_cannot_escape(key: str) -> None:
    with pytest.raises(InvalidNameError):
        cv.tag_key(key)


@pytest.mark.parametrize("tenant", ["..", "a/b", "App", "-lead", ""])
def test_invalid_tenants(tenant: str) -> None:
    with pytest.raises(InvalidNameError, match="tenant"):
        cv.tenant_name(tenant)


@pytest.mark.parametrize("fid", ["..", ".", "a/b", "../../etc/passwd", "", ".x"])
def test_invalid_file_ids(fid: str) -> None:
    with pytest.raises(InvalidNameError, match="file id"):
        cv.archive_meta("ds", CH, fid)


@pytest.mark.parametrize("ch", ["../" + "a" * 61, "A" * 64, "a" * 63, "g" * 64])
def test_invalid_checksums(ch: str) -> None:
    with pytest.raises(InvalidNameError, match="checksum"):
        cv.archive_blob("ds", ch)


def test_origins_allow_mapping_prefix_but_not_paths() -> None:
    assert cv.origin(f"mapping:{CH}") == f"mapping:{CH}"
    for bad in ["a/b", "..", "", "x y"]:
        with pytest.raises(InvalidNameError):
            cv.origin(bad)
