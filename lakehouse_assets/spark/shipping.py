"""Ship this package to a Spark that does not run on this machine's install.

A cluster's executors (and a remote Spark Connect server's driver, which
plans the journal's Python data source) import :mod:`lakehouse_assets` to run
a task. Rather than asking users to install the project into every
executor's Python, the session ships it: a zip of the package as this process
runs it, built once per content digest under ``{cache_dir}/spark-code/``,
handed to ``SparkContext.addPyFile`` (in-process driver) or
``SparkSession.addArtifacts(..., pyfile=True)`` (Spark Connect), which puts it
first on the Python path of every task of the session. The executors still
need the project's dependencies (pyarrow, deltalake, followthemoney, ...):
a task that lacks one fails, and :func:`missing_module` turns that failure
into one line naming it.

The zip is deterministic (sorted names, fixed times), so the same code gives
the same bytes: processes that share a Connect session add the same artifact.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from lakehouse_assets.settings import Settings

#: The one timestamp of every zip entry (zip's epoch), so the bytes depend only on the code.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _package_root() -> Path:
    import lakehouse_assets

    return Path(lakehouse_assets.__file__).parent


def _files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


@functools.cache
def code_digest() -> str:
    """The content digest of the package this process runs (names and bytes)."""
    root = _package_root()
    digest = hashlib.sha256()
    for path in _files(root):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def code_zip(settings: Settings) -> Path:
    """The package as a zip for Spark's Python path (built once per digest)."""
    try:
        release = version("lakehouse_assets")
    except PackageNotFoundError:  # run from a source tree
        release = "0"
    folder = settings.cache_path / "spark-code"
    path = folder / f"lakehouse_assets-{release}-{code_digest()}.zip"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    root = _package_root()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in _files(root):
            name = f"lakehouse_assets/{file.relative_to(root).as_posix()}"
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, file.read_bytes())
    os.replace(tmp, path)
    return path


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_module(exc: BaseException) -> str | None:
    """The one line for a Spark task that failed on a module its Python lacks, or None."""
    found = _MISSING.search(str(exc))
    if found is None:
        return None
    name = found.group(1)
    if name.split(".")[0] == "lakehouse_assets":
        return (
            "Spark's Python could not import lakehouse_assets: the session ships it to a "
            "cluster (spark://... or a remote Connect server); a local Spark runs this "
            "interpreter, which must have the package installed"
        )
    return (
        f"Spark's executors lack the Python module {name!r}: install the lakehouse's "
        "dependencies (pip install -r requirements.lock, without the project) into the "
        "executors' Python (LAKEHOUSE_SPARK_EXECUTOR_PYTHON, spark.pyspark.python); "
        "see docs/cluster.md"
    )
