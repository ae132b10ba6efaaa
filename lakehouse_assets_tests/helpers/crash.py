"""An operation of a dataset run in a child process that SIGKILLs itself at a fault
point (``LAKEHOUSE_CRASH_AT``), and its rerun in this process."""

from __future__ import annotations

import subprocess
import sys

from lakehouse_assets import faults
from lakehouse_assets.lake import Dataset
from lakehouse_assets_tests.conftest import lakehouse_env

CHILD = """
import sys
from lakehouse_assets.lake import Lakehouse
lake = Lakehouse(sys.argv[1], journal_url=sys.argv[2])
ds = lake.dataset(sys.argv[3])
op = sys.argv[4]
if op == "flush":
    ds.flush(batch_rows=int(sys.argv[5]))
elif op == "export":
    ds.export(["statements", "entities", "statistics", "index"], force=True)
elif op == "export_incremental":  # incremental where the export state and change feed allow
    ds.export(["statements", "entities", "statistics", "index"])
elif op == "compact":
    ds.compact()
else:
    ds.optimize(vacuum=True, retention_hours=0)
"""

CRASH_POINTS = {
    "flush": faults.FLUSH_POINTS,
    "export": faults.EXPORT_POINTS,
    "compact": faults.COMPACT_POINTS,
    "optimize": faults.OPTIMIZE_POINTS,
}


child_env = lakehouse_env


def crash(ds: Dataset, op: str, point: str, hit: int = 1, batch_rows: int = 20) -> bool:
    """Run ``op`` in a child that SIGKILLs itself at the ``hit``-th time it reaches
    ``point``; True if it died there. ``op`` is one of :data:`CRASH_POINTS` or
    ``export_incremental`` (an export that is not forced); a flush's batches hold
    about ``batch_rows`` journal rows (whole buckets)."""
    lake = ds.lake
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            lake.store.uri,
            lake.settings.resolved_journal_url(),
            ds.name,
            op,
            str(batch_rows),
        ],
        env=child_env(lake, LAKEHOUSE_CRASH_AT=f"{point}:{hit}"),
        capture_output=True,
        timeout=600,
    )
    if proc.returncode == 0:
        return False  # the point was not reached (nothing to do there)
    assert proc.returncode == -9, proc.stderr.decode()[-3000:]
    return True


def rerun(ds: Dataset, op: str) -> None:
    if op == "flush":
        ds.flush(batch_rows=20)
    elif op == "export":
        ds.export(["statements", "entities", "statistics", "index"], force=True)
    elif op == "compact":
        ds.compact()
    else:
        ds.optimize(vacuum=True, retention_hours=0)
