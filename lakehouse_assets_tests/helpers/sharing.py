"""Run the real Delta Sharing connector (its own venv) and compare what it reads.

The connector ``delta-sharing`` 1.4 caps pyarrow (<=23.0.1), requests, fsspec
and aiohttp below this project's pins, so it is installed in
``.venv-sharing`` (``make sharing-client``), as on a recipient's machine, and
driven by :mod:`.sharing_driver` there. Tests that need it skip, saying why,
when that venv is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
#: The Python of the connector's virtual environment (``make sharing-client``).
SHARING_PYTHON = Path(
    os.environ.get("LAKEHOUSE_TEST_SHARING_PYTHON", REPO / ".venv-sharing" / "bin" / "python")
)
DRIVER = Path(__file__).with_name("sharing_driver.py")


def sharing_python() -> Path:
    """The connector's interpreter, or a skip saying why there is none."""
    if not SHARING_PYTHON.exists():
        pytest.skip(f"delta-sharing is not installed ({SHARING_PYTHON}: run `make sharing-client`)")
    return SHARING_PYTHON


def connector(profile: Path, ops: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    """Run ``ops`` with the connector against ``profile``; each result, with the
    frame it loaded (``result["frame"]``) read back here."""
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "spec.json"
    spec.write_text(json.dumps(ops))
    proc = subprocess.run(
        [str(sharing_python()), str(DRIVER), str(profile), str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads((out / "results.json").read_text())
    for index, result in enumerate(results):
        frame = out / f"{index}.parquet"
        if result.get("ok") and frame.exists():
            result["frame"] = pd.read_parquet(frame)
    return results


def assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same columns, types and rows (in any order)."""
    assert list(got.columns) == list(want.columns)
    assert dict(got.dtypes) == dict(want.dtypes)
    cols = list(want.columns)
    left = got.sort_values(cols, ignore_index=True)
    right = want.sort_values(cols, ignore_index=True)
    pd.testing.assert_frame_equal(left, right)
