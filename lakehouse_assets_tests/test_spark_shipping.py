"""What a session on a cluster is configured with, without a cluster: the shipped
zip, the driver's binding and the executors' Python, the one-line error of a
module missing on the executors. (The cluster itself: test_cluster.py.)"""

from __future__ import annotations

import zipfile
from pathlib import Path

from lakehouse_assets import Settings
from lakehouse_assets.cli.errors import user_error
from lakehouse_assets.spark import cluster
from lakehouse_assets.spark.session import spark_conf
from lakehouse_assets.spark.shipping import code_digest, code_zip, missing_module


def test_the_code_zip_is_built_once_per_digest_and_holds_the_package(tmp_path: Path) -> None:
    settings = Settings(cache_dir=str(tmp_path))
    path = code_zip(settings)
    assert path.name.endswith(f"-{code_digest()}.zip")
    built = path.stat().st_mtime_ns
    assert code_zip(settings) == path and path.stat().st_mtime_ns == built
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        assert "lakehouse_assets/__init__.py" in names
        assert "lakehouse_assets/spark/journal_source.py" in names
        assert not any("__pycache__" in n for n in names)
        # the same code, the same bytes (processes share a Connect session's artifact)
        assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_a_driver_on_a_loopback_cluster_binds_to_loopback(tmp_path: Path) -> None:
    """The in-process driver on a master at 127.0.0.1 never binds a public address,
    and hands its executors their Python and their share of the cluster."""
    settings = Settings(
        cache_dir=str(tmp_path),
        spark_master="spark://127.0.0.1:7077",
        spark_executor_python="/opt/deps/bin/python",
    )
    conf = spark_conf(settings)
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] == "/opt/deps/bin/python"
    assert conf["spark.cores.max"] == "2" and conf["spark.executor.memory"] == "512m"
    # no local cluster recorded in this cache folder: no secret of ours to hand on
    assert "spark.authenticate.secret" not in conf
    assert cluster.client_conf(settings) == {}
    remote = settings.model_copy(update={"spark_master": "spark://spark.example.org:7077"})
    assert "spark.driver.host" not in spark_conf(remote)


def test_a_module_missing_on_the_executors_is_one_line() -> None:
    from pyspark.errors.exceptions.base import PySparkException

    spark_error = PySparkException(
        "Traceback (most recent call last):\n  File ...\n"
        "ModuleNotFoundError: No module named 'pyarrow'\n\tat org.apache.spark..."
    )
    line = user_error(spark_error)
    assert line is not None and line.startswith(
        "Spark's executors lack the Python module 'pyarrow'"
    )
    assert "LAKEHOUSE_SPARK_EXECUTOR_PYTHON" in line
    ours = missing_module(RuntimeError("ModuleNotFoundError: No module named 'lakehouse_assets.x'"))
    assert ours is not None and "ships it" in ours
    assert user_error(PySparkException("some other failure")) is None
