"""Read shared tables with the real Delta Sharing connector, in its own venv.

``python sharing_driver.py PROFILE SPEC OUT_DIR``

The ``delta-sharing`` connector (1.4.x) caps pyarrow, requests, fsspec and
aiohttp below the versions this project pins, so it lives in its own virtual
environment (``make sharing-client``: ``.venv-sharing``), as a recipient's
machine would. ``SPEC`` is a JSON list of operations; each one's result goes
to ``OUT_DIR/results.json`` (in order: ``{"ok": true, ...}`` or ``{"ok":
false, "error": "..."}``), each frame it loads to ``OUT_DIR/{i}.parquet``:

- ``{"op": "list_all_tables"}``: the tables as ``share.schema.table`` names;
- ``{"op": "load", "table": "share.schema.table", "version": N, "timestamp": T,
  "limit": N, "delta": B}``: ``delta_sharing.load_as_pandas`` (``delta``: its
  ``use_delta_format``; absent, the connector asks the server which format);
- ``{"op": "changes", "table": ..., "starting_version": N, "ending_version": N}``:
  ``delta_sharing.load_table_changes_as_pandas``;
- ``{"op": "version", "table": ...}``: ``SharingClient``'s table version.

This file imports delta_sharing: it is never imported by the test suite.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def run(profile: str, op: dict[str, Any], out: Path, index: int) -> dict[str, Any]:
    import delta_sharing

    url = f"{profile}#{op.get('table', '')}"
    started, cpu = time.perf_counter(), time.process_time()
    if op["op"] == "list_all_tables":
        client = delta_sharing.SharingClient(profile)
        names = [f"{t.share}.{t.schema}.{t.name}" for t in client.list_all_tables()]
        return {"tables": names}
    if op["op"] == "version":
        from delta_sharing.protocol import DeltaSharingProfile, Table
        from delta_sharing.rest_client import DataSharingRestClient

        share, schema, name = op["table"].split(".")
        rest = DataSharingRestClient(DeltaSharingProfile.read_from_file(profile))
        version = rest.query_table_version(Table(name, share, schema)).delta_table_version
        return {"version": version}
    if op["op"] == "load":
        df = delta_sharing.load_as_pandas(
            url,
            limit=op.get("limit"),
            version=op.get("version"),
            timestamp=op.get("timestamp"),
            use_delta_format=op.get("delta"),
        )
    elif op["op"] == "changes":
        df = delta_sharing.load_table_changes_as_pandas(
            url,
            starting_version=op.get("starting_version"),
            ending_version=op.get("ending_version"),
        )
    else:
        raise ValueError(f"unknown op {op['op']!r}")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    df.to_parquet(out / f"{index}.parquet", index=False)
    return {
        "rows": len(df),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "dtypes": {k: str(v) for k, v in df.dtypes.items()},
    }


def main(argv: list[str]) -> None:
    profile, spec, out_dir = argv[:3]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for index, op in enumerate(json.loads(Path(spec).read_text())):
        try:
            results.append({"ok": True, **run(profile, op, out, index)})
        except Exception as exc:  # noqa: BLE001 - the test judges the error
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
