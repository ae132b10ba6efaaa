"""Time the version chain on N statements of scaled kek data.

    python -m benchmarks.versions --statements 1000000

Builds a lake (journal write + ``make``: the first version), changes 1% of
the entities and deletes a few (``make``: the second version), then prints:
the publish step of each ``make`` (manifest, diff, chain entry, Delta tag:
what a version costs beyond the exports), ``verify`` and ``verify --deep``,
a point read at the head against the same read as of version 1 (median and
p95 of 100 ids), and ``trace`` of one statement and of one entity.
Numbers only; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import orjson

from benchmarks.data import write as write_data


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    clock = time.monotonic()
    value = fn()
    return time.monotonic() - clock, value


def percentiles(samples: list[float]) -> str:
    samples = sorted(samples)
    median = statistics.median(samples) * 1000
    p95 = samples[int(len(samples) * 0.95)] * 1000
    return f"median {median:.1f} ms, p95 {p95:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--lake", type=Path, default=None, help="default: a temp folder")
    args = parser.parse_args()

    from lakehouse_assets import versions
    from lakehouse_assets.lake import Lakehouse

    data_dir = Path(__file__).parent / ".data"
    data_dir.mkdir(exist_ok=True)
    data = write_data(data_dir / f"kek-{args.statements}.ftm.json", args.statements)
    root = args.lake or Path(tempfile.mkdtemp(prefix="lakehouse-versions-"))
    shutil.rmtree(root, ignore_errors=True)
    lake = Lakehouse(root)
    ds = lake.create_dataset("bench")
    lines = data.read_bytes().splitlines()
    with data.open("rb") as fh:
        written = ds.write_entities(fh, origin="bench").count

    def publish_seconds(label: str) -> None:
        clock = time.monotonic()
        made = ds.make()
        total = time.monotonic() - clock
        index = made.written["index"]
        print(
            f"{label}: make {total:.1f} s; version {index['version']['sequence']} "
            f"({index['version']['diff']['counts']})",
            flush=True,
        )

    publish_seconds("version 1")
    head = ds.version()
    assert head is not None
    snapshot = ds.snapshot()
    seconds, _ = timed(
        lambda: versions.build_manifest(ds, snapshot, head, index_text="{}", statements_fresh=True)
    )
    print(f"manifest of the head (all files known): {seconds:.3f} s", flush=True)

    rng = random.Random(7)
    changed = [orjson.loads(lines[rng.randrange(len(lines))]) for _ in range(len(lines) // 100)]
    with ds.bulk(origin="bench") as bulk:
        for entity in changed:
            entity["properties"].setdefault("summary", []).append("changed")
            bulk.add_entity(entity)
    for entity in changed[:20]:
        ds.delete_entity(entity["id"])
    publish_seconds("version 2 (1% of entities changed)")

    parent = ds.version(1)
    head = ds.version()
    assert parent is not None and head is not None
    old = versions.snapshot_at(ds, parent)
    new = versions.snapshot_at(ds, head)
    seconds, _ = timed(lambda: versions.render_diff(ds, old, new, io.BytesIO()))
    print(f"diff of version 2 (from the translog): {seconds:.3f} s", flush=True)
    seconds, _ = timed(
        lambda: versions.build_manifest(ds, new, parent, index_text="{}", statements_fresh=True)
    )
    print(f"manifest of version 2 (hashing its new files): {seconds:.3f} s", flush=True)

    seconds, report = timed(lambda: ds.verify())
    assert getattr(report, "ok", False)
    hashed = getattr(report, "bytes_hashed", 0) / 1e6
    print(f"verify: {seconds:.3f} s ({hashed:.0f} MB hashed)", flush=True)
    seconds, report = timed(lambda: ds.verify(deep=True))
    assert getattr(report, "ok", False)
    print(f"verify --deep: {seconds:.3f} s", flush=True)

    ids = [orjson.loads(lines[rng.randrange(len(lines))])["id"] for _ in range(100)]
    latest = [timed(partial(ds.get_entity, i))[0] for i in ids]
    as_of = [timed(partial(ds.get_entity, i, as_of=1))[0] for i in ids]
    print(f"get at the head:   {percentiles(latest)}", flush=True)
    print(f"get as of version 1: {percentiles(as_of)}", flush=True)

    entity = ds.get_entity(ids[0])
    assert entity is not None
    statement = next(iter(entity.statements))
    seconds, _ = timed(lambda: ds.trace(str(statement.id)))
    print(f"trace one statement (by id): {seconds * 1000:.0f} ms", flush=True)
    seconds, found = timed(lambda: ds.trace(ids[0]))
    print(f"trace one entity ({len(found)} statements): {seconds * 1000:.0f} ms", flush=True)  # type: ignore[arg-type]
    print(f"statements: {written:,}; lake: {root}")


if __name__ == "__main__":
    main()
