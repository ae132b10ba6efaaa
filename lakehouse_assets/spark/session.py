"""One Spark session per process, created lazily on first use.

Configured for this stack: Delta tables are committed by delta-rs, so Spark
needs no extra JARs (Maven is not reachable); Spark writes Parquet with the
timestamp type Delta expects. ``local[*]`` is the embedded default; pointing
``LAKEHOUSE_SPARK_MASTER`` at ``spark://host:7077`` (or ``yarn``, ``k8s://…``)
runs the same jobs on a cluster.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse_assets.settings import Settings
from lakehouse_assets.spark.java import require_java
from lakehouse_assets.staging import Cleaned, clean_stale_scratch, scratch_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_lock = threading.Lock()
_session: SparkSession | None = None
#: Scratch folders of dead processes removed when this process started Spark.
_cleaned: Cleaned | None = None


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark configuration the lakehouse runs with."""
    scratch = scratch_dir(settings)
    return {
        # Spark's block manager and temp folders, and the JVM's temp folder
        # (native libraries it extracts), in this process's scratch folder:
        # a killed process's leftovers are found and removed by the next one
        "spark.local.dir": str(scratch),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData",
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

        global _cleaned
        _cleaned = clean_stale_scratch(settings)
        atexit.register(_leave, scratch_dir(settings))
        builder = SparkSession.builder
        for key, value in spark_conf(settings).items():
            builder = builder.config(key, value)
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel("WARN")
        return _session


def _leave(scratch: Path) -> None:
    """At a normal exit: stop Spark, then remove this process's scratch folder."""
    stop_spark()
    shutil.rmtree(scratch, ignore_errors=True)


def scratch_cleanup() -> dict[str, int]:
    """What starting Spark in this process removed of dead processes' scratch folders
    (reported once, by the first job record that asks)."""
    global _cleaned
    done, _cleaned = _cleaned, None
    return done.as_dict() if done is not None else Cleaned().as_dict()


def stop_spark() -> None:
    """Stop the process-wide session (tests, shutdown)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
