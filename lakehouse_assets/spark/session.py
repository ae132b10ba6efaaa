"""One Spark session per process, created lazily on first use.

Configured for this stack: Delta tables are committed by delta-rs, so Spark
needs no extra JARs (Maven is not reachable); Spark writes Parquet with the
timestamp type Delta expects. ``local[*]`` is the embedded default; pointing
``LAKEHOUSE_SPARK_MASTER`` at ``spark://host:7077`` (or ``yarn``, ``k8s://…``)
runs the same jobs on a cluster.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

from lakehouse_assets.settings import Settings
from lakehouse_assets.spark.java import require_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_lock = threading.Lock()
_session: SparkSession | None = None


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark configuration the lakehouse runs with."""
    return {
        "spark.master": settings.spark_master,
        "spark.app.name": "lakehouse_assets",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.ui.enabled": str(settings.spark_ui_enabled).lower(),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        # Delta expects microsecond timestamps (Spark's default is INT96).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Our heavy steps are Python tasks (FtM aggregation, Parquet writers):
        # AQE would merge "small" shuffle partitions into one task, i.e. one
        # core. Keep the partitions we ask for.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.bindAddress": "127.0.0.1"
        if settings.spark_master.startswith("local")
        else "0.0.0.0",
    }


def get_spark(settings: Settings | None = None) -> SparkSession:
    """The process-wide Spark session (created on first call, then reused)."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        settings = settings or Settings()
        require_java()
        # Spark's Python workers must run this interpreter (with our packages),
        # and a local session must not bind a public address.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if settings.spark_master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        builder = SparkSession.builder
        for key, value in spark_conf(settings).items():
            builder = builder.config(key, value)
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel("WARN")
        return _session


def stop_spark() -> None:
    """Stop the process-wide session (tests, shutdown)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
