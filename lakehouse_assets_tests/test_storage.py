"""The store layer on a local folder and on a real S3 server."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lakehouse_assets import Lakehouse
from lakehouse_assets.errors import InvalidNameError, SourceNotFoundError
from lakehouse_assets.storage import LocalStore


def test_write_read_list_delete(lake: Lakehouse) -> None:
    store = lake.store
    store.write_text("ds/a/one.json", '{"a": 1}')
    store.write_text("ds/a/b/two.json", "2")
    store.write_text("ds/three", "3")
    assert store.read_text("ds/a/one.json") == '{"a": 1}'
    assert list(store.list("ds/a/")) == ["ds/a/b/two.json", "ds/a/one.json"]
    assert store.exists("ds/three") and not store.exists("ds/four")
    assert store.size("ds/three") == 1
    assert store.list_dirs("ds") == ["a", "three"]
    store.delete("ds/three")
    assert not store.exists("ds/three")
    store.delete("ds/three")  # idempotent
    with pytest.raises(SourceNotFoundError):
        store.read_bytes("ds/three")


def test_put_if_absent_has_one_winner(lake: Lakehouse) -> None:
    store = lake.store
    results: list[bool] = []

    def attempt(i: int) -> None:
        results.append(store.put_if_absent("ds/locks/x", f"{i}".encode()))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert store.read_text("ds/locks/x") in {str(i) for i in range(8)}


def test_overwrite_is_atomic_for_readers(lake: Lakehouse) -> None:
    """Readers racing a writer see a complete old or new file, never a mix."""
    store = lake.store
    a, b = b"A" * 200_000, b"B" * 300_000
    store.write_bytes("ds/file", a)
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(store.read_bytes("ds/file"))

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(20):
        store.write_bytes("ds/file", a if i % 2 else b)
    stop.set()
    thread.join()
    assert seen <= {a, b}


def test_local_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_text("x/y.json", "1")
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["y.json"]


@pytest.mark.parametrize("path", ["../escape", "a/../../b", "/etc/passwd", "a//b", "a\x00b"])
def test_unsafe_paths_are_rejected(lake: Lakehouse, path: str) -> None:
    with pytest.raises(InvalidNameError):
        lake.store.write_text(path, "x")


def test_entries_list_sizes_times_and_fingerprints(lake: Lakehouse) -> None:
    import time

    store = lake.store
    before = time.time() - 5  # S3 times have whole seconds; moto's clock is ours
    store.write_bytes("ds/archive/a/data", b"abc")
    store.write_bytes("ds/archive/b/x.json", b"{}")
    store.write_bytes("other/file", b"no")
    entries = list(store.entries("ds/archive/"))
    assert [e.path for e in entries] == list(store.list("ds/archive/"))
    assert [e.size for e in entries] == [3, 2]
    assert all(before <= e.modified <= time.time() + 5 for e in entries)
    # a listing's fingerprint is what a HEAD/stat of the file says
    assert [e.fingerprint for e in entries] == [store.fingerprint(e.path) for e in entries]
    store.write_bytes("ds/archive/a/data", b"abcd")
    (changed, _) = store.entries("ds/archive/")
    assert changed.size == 4 and changed.fingerprint != entries[0].fingerprint
