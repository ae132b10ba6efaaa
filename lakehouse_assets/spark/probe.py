"""Does a cluster's executors see the lake folder this process writes?

A lake on a local folder works on a cluster only when every executor sees
the same folder at the same path (a shared mount), and without one a flush
fails deep in a task (``PATH_NOT_FOUND .../_staging/...``). So before the
first job on a cluster that may run elsewhere, the driver writes a token
into the lake folder and one task reads it back; a task that finds no file,
or another one, gets a one-line error saying what to fix.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from lakehouse_assets.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The probe file's name in the lake folder (removed at once).
PROBE_PREFIX = ".spark-probe-"


def _read_probe(path: str) -> Iterator[pa.RecordBatch]:
    """(on an executor) The probe file's text, or "" where there is none."""
    try:
        seen = Path(path).read_text()
    except OSError:
        seen = ""
    yield pa.RecordBatch.from_pydict({"seen": [seen]})


def executors_read(spark: SparkSession, path: str) -> str:
    """What a task of ``spark`` reads at ``path`` ("" when it finds no file)."""

    def probe(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _read_probe(path)

    rows = spark.range(1, numPartitions=1).mapInArrow(probe, "seen string").collect()
    return str(rows[0]["seen"]) if rows else ""


def require_seen(spark: SparkSession, folder: Path, probe: Path, token: str) -> None:
    """Raise unless the executors read ``token`` at ``probe`` (in the lake ``folder``)."""
    if executors_read(spark, str(probe)) != token:
        raise ConfigurationError(
            f"Spark's executors cannot see the lake folder {folder} (a folder on this "
            "machine's disk): on a cluster, put the lake where every executor reaches it "
            "(LAKEHOUSE_LAKE_URI=s3://...), or mount a shared folder at the same path on "
            "every worker"
        )


def require_visible_lake(spark: SparkSession, folder: Path) -> None:
    """Check that the executors of ``spark`` see the local lake ``folder`` (see module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = folder / f"{PROBE_PREFIX}{token}"
    probe.write_text(token)
    try:
        require_seen(spark, folder, probe, token)
    finally:
        probe.unlink(missing_ok=True)
