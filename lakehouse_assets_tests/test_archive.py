"""Archive: content-addressed source files from every kind of source URI."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import (
    ChecksumMismatchError,
    InvalidInputError,
    InvalidNameError,
    SourceNotFoundError,
    SourceUnreachableError,
)
from lakehouse_assets.storage import s3_client
from lakehouse_assets_tests.conftest import free_port, make_bucket


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "report.txt"
    path.parent.mkdir()
    path.write_bytes(b"hello lakehouse\n")
    return path


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real HTTP server on 127.0.0.1 serving a temp folder."""
    root = tmp_path_factory.mktemp("www")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(root), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def test_add_file_stores_blob_once_and_metadata(lake: Lakehouse, source: Path) -> None:
    ds = lake.create_dataset("docs")
    meta = ds.add_file(str(source), extra={"collector": "test"})
    content = source.read_bytes()
    assert meta.checksum == sha(content)
    assert meta.size == len(content)
    assert meta.name == "report.txt"
    assert meta.mimetype == "text/plain"
    assert meta.extra == {"collector": "test"}
    assert lake.store.read_bytes(cv.archive_blob("docs", meta.checksum)) == content
    assert lake.store.exists(cv.archive_meta("docs", meta.checksum, meta.file_id))
    assert ds.core_tags.get(cv.ARCHIVE_LAST_UPDATED) is not None
    with ds.archive.open(meta.checksum) as fh:
        assert fh.read() == content
    assert ds.archive.get(meta.checksum) == meta


def test_same_blob_under_two_paths_gives_two_entries(
    lake: Lakehouse, source: Path, tmp_path: Path
) -> None:
    ds = lake.create_dataset("docs")
    copy = tmp_path / "copy.txt"
    copy.write_bytes(source.read_bytes())
    m1 = ds.add_file(str(source))
    m2 = ds.add_file(f"file://{copy}")
    assert m1.checksum == m2.checksum and m1.file_id != m2.file_id
    assert {m.file_id for m in ds.archive.files(m1.checksum)} == {m1.file_id, m2.file_id}
    blobs = [p for p in lake.store.list("docs/archive/") if p.endswith("/data")]
    assert len(blobs) == 1
    # re-adding the same path updates its entry instead of adding one
    m3 = ds.add_file(str(source))
    assert m3.file_id == m1.file_id and m3.created_at == m1.created_at
    assert len(list(ds.archive.list())) == 2


def test_delete_removes_only_that_metadata(lake: Lakehouse, source: Path, tmp_path: Path) -> None:
    ds = lake.create_dataset("docs")
    copy = tmp_path / "copy.txt"
    copy.write_bytes(source.read_bytes())
    m1 = ds.add_file(str(source))
    m2 = ds.add_file(str(copy))
    ds.archive.delete(m1.file_id)
    assert [m.file_id for m in ds.archive.list()] == [m2.file_id]
    assert ds.archive.exists(m1.checksum)  # the blob stays
    with pytest.raises(SourceNotFoundError):
        ds.archive.delete(m1.file_id)


def test_given_checksum_is_verified(lake: Lakehouse, source: Path) -> None:
    ds = lake.create_dataset("docs")
    good = sha(source.read_bytes())
    assert ds.add_file(str(source), checksum=good).checksum == good
    bad = "0" * 64
    other = source.parent / "other.txt"
    other.write_bytes(b"different content")
    with pytest.raises(ChecksumMismatchError, match="other.txt.*expected 0{64}"):
        ds.add_file(str(other), checksum=bad)
    assert not ds.archive.exists(sha(b"different content"))
    assert not ds.archive.exists(bad)
    assert len(list(ds.archive.list())) == 1
    assert not [p for p in lake.store.list("docs/") if p.endswith(".tmp")]


def test_get_unknown_checksum_raises_file_not_found(lake: Lakehouse) -> None:
    ds = lake.create_dataset("docs")
    with pytest.raises(FileNotFoundError, match="docs"):
        ds.archive.get("a" * 64)
    with pytest.raises(InvalidNameError):
        ds.archive.get("../../etc")


def test_missing_source_file(lake: Lakehouse, tmp_path: Path) -> None:
    ds = lake.create_dataset("docs")
    with pytest.raises(SourceNotFoundError, match="nope.txt"):
        ds.add_file(str(tmp_path / "nope.txt"))
    assert list(ds.archive.list()) == []


def test_http_source_and_errors(local_lake: Lakehouse, http_root: tuple[str, Path]) -> None:
    base, root = http_root
    (root / "page.html").write_bytes(b"<html>hi</html>")
    ds = local_lake.create_dataset("web")
    meta = ds.add_file(f"{base}/page.html")
    assert meta.checksum == sha(b"<html>hi</html>")
    assert meta.mimetype == "text/html" and meta.key == f"{base}/page.html"
    with pytest.raises(SourceNotFoundError, match="404"):
        ds.add_file(f"{base}/missing.html")
    with pytest.raises(SourceUnreachableError, match="Cannot reach"):
        ds.add_file(f"http://127.0.0.1:{free_port()}/x.txt")


def test_s3_source(local_lake: Lakehouse, s3_settings: Settings) -> None:
    bucket = make_bucket(s3_settings)
    s3_client(s3_settings).put_object(Bucket=bucket, Key="in/data.csv", Body=b"a,b\n1,2\n")
    lake = Lakehouse(
        local_lake.store.uri, settings=s3_settings, journal_url=local_lake.settings.journal_url
    )
    ds = lake.create_dataset("s3src")
    meta = ds.add_file(f"s3://{bucket}/in/data.csv")
    assert meta.checksum == sha(b"a,b\n1,2\n") and meta.name == "data.csv"
    with pytest.raises(SourceNotFoundError):
        ds.add_file(f"s3://{bucket}/in/missing.csv")


def test_large_file_is_streamed(lake: Lakehouse, tmp_path: Path) -> None:
    """A file much larger than the read chunk arrives intact."""
    big = tmp_path / "big.bin"
    block = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB
    with big.open("wb") as fh:
        for i in range(24):
            fh.write(bytes([i]) + block[1:])
    ds = lake.create_dataset("big")
    meta = ds.add_file(str(big))
    digest = hashlib.sha256()
    with ds.archive.open(meta.checksum) as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == meta.checksum == sha(big.read_bytes())
    assert meta.size == 24 * (1 << 20)


def test_document_entity_goes_to_the_journal(lake: Lakehouse, source: Path) -> None:
    ds = lake.create_dataset("docs")
    meta = ds.add_file(str(source), create_document=True)
    stmts = ds.journal.live_entity_statements("docs", meta.checksum)
    props = {(s.prop, s.value) for s in stmts}
    assert ("contentHash", meta.checksum) in props
    assert ("fileName", "report.txt") in props
    assert ("mimeType", "text/plain") in props
    assert ("fileSize", str(meta.size)) in props
    assert {s.schema for s in stmts} == {"Document"}
    assert {s.origin for s in stmts} == {"archive"}
    assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is not None


# --- extracted text ----------------------------------------------------------------


def test_extracted_text_one_per_engine(lake: Lakehouse, source: Path) -> None:
    ds = lake.create_dataset("texts")
    meta = ds.add_file(str(source))
    assert ds.archive.texts(meta.checksum) == []
    full = ds.archive.put_text(meta.checksum[:8], "tika", "héllo lakehouse — ünïcode\n")
    assert full == meta.checksum
    ds.archive.put_text(meta.checksum, "ocr", "hello 1akehouse")
    assert ds.archive.texts(meta.checksum[:10]) == ["ocr", "tika"]
    assert ds.archive.get_text(meta.checksum, "tika") == "héllo lakehouse — ünïcode\n"
    path = cv.archive_text("texts", meta.checksum, "tika")
    assert lake.store.read_bytes(path) == "héllo lakehouse — ünïcode\n".encode()
    # replacing an engine's text; text files are not file metadata
    ds.archive.put_text(meta.checksum, "ocr", "hello lakehouse")
    assert ds.archive.get_text(meta.checksum, "ocr") == "hello lakehouse"
    assert [m.file_id for m in ds.archive.list()] == [meta.file_id]
    # deleting the last metadata keeps the blob, so its text stays with it
    ds.archive.delete(meta.file_id)
    assert ds.archive.exists(meta.checksum)
    assert ds.archive.texts(meta.checksum) == ["ocr", "tika"]
    assert ds.archive.get_text(meta.checksum, "ocr") == "hello lakehouse"


def test_extracted_text_errors_name_dataset_checksum_and_engine(
    lake: Lakehouse, source: Path
) -> None:
    ds = lake.create_dataset("texts")
    meta = ds.add_file(str(source))
    with pytest.raises(SourceNotFoundError) as missing:
        ds.archive.get_text(meta.checksum, "ocr")
    message = str(missing.value)
    assert "'ocr'" in message and meta.checksum in message and "'texts'" in message
    ds.archive.put_text(meta.checksum, "tika", "x")
    with pytest.raises(SourceNotFoundError, match="engines with text: tika"):
        ds.archive.get_text(meta.checksum, "ocr")
    unknown = "f" * 64
    with pytest.raises(SourceNotFoundError, match="archive the file before adding its text"):
        ds.archive.put_text(unknown, "tika", "x")
    with pytest.raises(SourceNotFoundError, match=f"No file with checksum {unknown}"):
        ds.archive.texts(unknown)
    for bad in ("../config", "a/b", "", ".hidden", "x\x00"):
        with pytest.raises(InvalidNameError, match="Invalid text engine"):
            ds.archive.put_text(meta.checksum, bad, "x")
        with pytest.raises(InvalidNameError):
            ds.archive.get_text(meta.checksum, bad)
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        ds.archive.put_text(meta.checksum, "ocr", "bad \udcff surrogate")
    assert ds.archive.texts(meta.checksum) == ["tika"]
