"""The Delta Sharing connector's own readers on the table's files, with no server.

``.venv-sharing/bin/python -P benchmarks/sharing_local.py FORMAT TABLE_URI FILES_JSON``

(``-P``: this folder on ``sys.path`` would shadow the standard library's
``collections`` with :mod:`benchmarks.collections`.)

What :mod:`benchmarks.sharing` compares with delta-rs is the connector's
``load_as_pandas``; this reads the same table with the same code of the
connector but every file from the local disk, no HTTP and no server: the
fastest any server could make that read.

- ``delta``: delta-kernel's scan (``delta_kernel_rust_sharing_wrapper``, what
  ``load_as_pandas`` runs in the delta response format) opened on the table's
  own folder, its batches converted as the connector converts them
  (``pa.Table.from_batches(...).to_pandas(self_destruct=True)``);
- ``parquet``: ``DeltaSharingReader._to_pandas`` (the connector's reader of
  one file in the parquet response format) of each file in turn, a local
  path as its URL, and ``pd.concat`` as ``to_pandas`` does.

``FILES_JSON``: the table's files as ``[{"path": ..., "size": ...,
"partitionValues": {...}}]`` (the parent reads them with delta-rs) and the
schema string (``{"files": [...], "schema": "..."}``). Reads twice, prints the
second read's rows, seconds and CPU seconds as one JSON line.

This file imports delta_sharing (in its own venv): nothing else imports it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def kernel_read(table: str) -> Any:
    """delta-kernel's scan of the table's folder, converted as the connector does."""
    import delta_kernel_rust_sharing_wrapper as kernel
    import pyarrow as pa

    interface = kernel.PythonInterface(table)
    snapshot = kernel.Table(table).snapshot(interface)
    batches = kernel.ScanBuilder(snapshot).build().execute(interface)
    return pa.Table.from_batches(batches).to_pandas(self_destruct=True)


def parquet_read(listing: dict[str, Any]) -> Any:
    """The connector's per-file reader of the parquet response format, file by file."""
    import pandas as pd
    from delta_sharing.converter import to_converters
    from delta_sharing.protocol import AddFile
    from delta_sharing.reader import DeltaSharingReader

    converters = to_converters(json.loads(listing["schema"]))
    frames = [
        DeltaSharingReader._to_pandas(
            AddFile(
                url=f["path"], id=str(i), partition_values=f["partitionValues"], size=f["size"]
            ),
            converters,
            False,
            None,
            False,
        )
        for i, f in enumerate(listing["files"])
    ]
    return pd.concat(frames, axis=0, ignore_index=True, copy=False)


def main(argv: list[str]) -> None:
    kind, table, files = argv[:3]
    listing = json.loads(Path(files).read_text())
    for _ in range(2):
        started, cpu = time.perf_counter(), time.process_time()
        frame = kernel_read(table) if kind == "delta" else parquet_read(listing)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"rows": len(frame), "seconds": seconds, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main(sys.argv[1:])
