"""Time a whole Dagster refresh of a small dataset, then one with nothing new.

    python -m benchmarks.refresh [--statements N]

Writes N statements of (scaled) kek data into a fresh lake's SQLite journal,
reports the sources as the sensors would, and runs the ``refresh_dataset``
job in this process on a temporary Dagster instance (what ``make demo``
does): flush, statement checks, the exports, index, versions, graph. Then
the same job again with nothing new, and once more after one new entity.
Prints each run's wall time and its slowest steps. With
``LAKEHOUSE_SPARK_REMOTE`` set the Spark work runs on that (warm) server;
without it, an in-process Spark starts in the first run (cold). Numbers
only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.data import KEK_STATEMENTS
from benchmarks.data import write as write_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=KEK_STATEMENTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakehouse-refresh-"))
    os.environ["LAKEHOUSE_LAKE_URI"] = str(work / "lake")
    os.environ["LAKEHOUSE_JOURNAL_URL"] = f"sqlite:///{work / 'journal.sqlite'}"
    os.environ["DAGSTER_HOME"] = str(work / "dagster")
    (work / "dagster").mkdir()

    import dagster as dg

    from lakehouse_assets import Lakehouse
    from lakehouse_assets.defs.demo import refresh, report_sources
    from lakehouse_assets.defs.resources import LakehouseResource

    data = write_data(
        Path(__file__).parent / ".data" / f"kek-{args.statements}.ftm.json", args.statements
    )
    lake = Lakehouse()
    ds = lake.create_dataset("bench")
    with data.open("rb") as fh:
        bulk = ds.write_entities(fh, origin="bench")
    mode = os.environ.get("LAKEHOUSE_SPARK_REMOTE") or "in-process Spark (cold)"
    print(f"{bulk.count:,} statements in the journal; Spark: {mode}", flush=True)
    instance = dg.DagsterInstance.get()
    first = json.loads(data.read_bytes().splitlines()[0])

    def run(label: str) -> None:
        report_sources(instance, LakehouseResource(), ds.name)
        clock = time.perf_counter()
        result = refresh(instance, ds.name)
        wall = time.perf_counter() - clock
        steps = sorted(
            instance.get_run_step_stats(result.run_id),
            key=lambda s: (s.end_time or 0) - (s.start_time or 0),
            reverse=True,
        )
        slowest = ", ".join(
            f"{s.step_key} {(s.end_time or 0) - (s.start_time or 0):.1f} s" for s in steps[:4]
        )
        state = "ok" if result.success else "FAILED"
        print(f"{label:<34} {wall:7.2f} s  {state}; slowest steps: {slowest}", flush=True)

    run("refresh (flush, checks, exports)")
    run("refresh with nothing new")
    changed = {**first, "id": f"{first['id']}-changed"}
    ds.write_entities([json.dumps(changed).encode()], origin="bench")
    run("refresh after one new entity")


if __name__ == "__main__":
    main()
