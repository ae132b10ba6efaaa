"""Configuration from the environment (``LAKEHOUSE_*``) or keyword arguments.

Every field has a working default for the embedded setup: a lake folder in the
working directory, a SQLite journal inside it, and Spark on ``local[*]``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Lakehouse settings; each may be set as ``LAKEHOUSE_<NAME>``."""

    #: ``./lakehouse.env`` (``LAKEHOUSE_LAKE_URI=…`` lines) names the lake of a working
    #: folder; the environment overrides it.
    model_config = SettingsConfigDict(
        env_prefix="LAKEHOUSE_", extra="ignore", env_file="lakehouse.env"
    )

    lake_uri: str = Field(
        default="./lake",
        description="Where the lake lives: a local folder or s3://bucket/prefix.",
    )
    journal_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL of the journal. Default: a SQLite file "
            "'journal.sqlite' at the root of a local lake, or in "
            "~/.cache/lakehouse/ for an s3:// lake. postgresql://... for a server."
        ),
    )
    cache_dir: str = Field(
        default="~/.cache/lakehouse",
        description="Local folder for this machine's runtime files: the default journal of "
        "an s3:// lake, Spark's scratch folders (one per process, stale ones removed).",
    )
    public_url: str | None = Field(
        default=None,
        description="http(s) base URL where the lake is published; resource links in "
        "index.json use it (they carry lake-relative paths either way).",
    )
    spark_console: bool = Field(
        default=False,
        description="Let an in-process Spark's JVM write to this process's stderr (its "
        "start-up warnings); otherwise it writes to {cache_dir}/spark-driver.log. "
        "The CLI's -v sets it.",
    )
    tenant: str = Field(
        default="lakehouse",
        description="The tenant this process acts as (namespaces its tags and locks).",
    )
    # --- object storage (s3:// lakes and sources) ---
    s3_endpoint_url: str | None = Field(
        default=None, description="S3 endpoint (MinIO, moto, ...); AWS when unset."
    )
    s3_access_key_id: str | None = Field(default=None, description="S3 access key.")
    s3_secret_access_key: str | None = Field(default=None, description="S3 secret.")
    s3_region: str = Field(default="us-east-1", description="S3 region.")
    # --- locks ---
    lock_ttl_seconds: int = Field(
        default=6 * 3600,
        description="A lock older than this is stale even if its owner can't be checked.",
    )
    lock_wait_seconds: float = Field(
        default=900.0,
        description="How long a writer of a dataset's tables (and an export's flush-first) "
        "waits for another one to finish.",
    )
    read_wait_seconds: float = Field(
        default=10.0,
        description="How long a query's flush-first waits for a writer before it reads the "
        "current snapshot (saying how many journal rows are pending).",
    )
    query_chunk_bytes: int = Field(
        default=4 * 1024 * 1024,
        gt=0,
        description="Parquet bytes a query without entity ids reads at a time (its memory "
        "bound: the chunk's rows decoded, joined and sorted in Arrow; at 4 MB a `query` "
        "process peaked at 0.6-0.8 GB at 1M and 10M statements, and ran faster than "
        "with 32 MB chunks, which peaked at 1.6 GB at 1M).",
    )
    # --- http sources ---
    http_timeout_seconds: float = Field(
        default=30.0, description="Connect/read timeout for http(s) sources."
    )
    # --- journal ---
    journal_batch_size: int = Field(
        default=10_000, description="Rows per INSERT batch when writing to the journal."
    )
    # --- flush ---
    flush_batch_rows: int = Field(
        default=1_000_000,
        description="Journal rows per flush batch (bounds the memory a flush needs).",
    )
    vacuum_retention_hours: int = Field(
        default=168,
        description="vacuum keeps files a version younger than this still needs.",
    )
    # --- spark ---
    spark_remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:port): run every Spark job on that server "
        "(the local one of `lakehouse spark start`, or a cluster's). Unset: in-process Spark.",
    )
    spark_connect_port: int = Field(
        default=15002, description="Port of the local Spark Connect server (127.0.0.1)."
    )
    spark_connect_allow_non_loopback: bool = Field(
        default=False,
        description="Let spark_config move the local Spark Connect server (its gRPC port, "
        "driver) off the loopback address. Off: such a setting is refused, because anyone "
        "who reaches the port and holds its token runs code as the server's user.",
    )
    spark_master: str = Field(
        default="local[*]",
        description="Spark master URL: local[*] (embedded) or spark://host:7077, ...",
    )
    spark_driver_memory: str = Field(
        # 1g keeps a 10M-statement step's whole process tree under 3 GB (2g:
        # flush 3.45 GB, exports 3.44 GB); it cost exports about 5% in spills
        default="1g",
        description="spark.driver.memory (local[*]: the whole local Spark; it spills beyond).",
    )
    spark_driver_java_options: str = Field(
        # G1, named (a JVM on one CPU would pick the serial collector). The
        # parallel collector was faster on these 2 cores (kek flush -0..11%,
        # exports -4..13%, 1M exports -13%) but a 10M export ran out of heap
        # with it at the default 1g: its old generation is a fixed two thirds
        # of the heap, and caching a partition of the entities frame builds
        # column buffers of 100+ MB that G1 places as humongous regions.
        # Robust at every size before a few percent at small ones.
        default="-XX:+UseG1GC",
        description="JVM options of the Spark driver (in-process Spark and the local "
        "Connect server), after the lakehouse's own (logging, temp folder).",
    )
    spark_class_archive: bool = Field(
        default=True,
        description="Start Spark's driver JVM from the class archive of `lakehouse spark "
        "prepare` when there is one (about 3 s less per in-process Spark start).",
    )
    spark_shuffle_partitions: int = Field(
        default=8, description="spark.sql.shuffle.partitions (small is right for 2 cores)."
    )
    spark_ui_enabled: bool = Field(default=False, description="Serve Spark's web UI.")
    spark_config: dict[str, str] = Field(
        default_factory=dict,
        description='Extra Spark settings, JSON ({"spark.executor.memory": "4g"}): applied '
        "to an in-process Spark and to the local Connect server at start; a Connect session "
        "takes the runtime ones (spark.sql.*). The Dagster `spark` resource's spark_config "
        "adds to them.",
    )
    # --- mappings ---
    mapping_spark_min_bytes: int = Field(
        default=32 * 1024 * 1024,
        description="CSVs at least this big are mapped on Spark; smaller ones in-process.",
    )
    # --- dagster ---
    sensor_interval_seconds: int = Field(
        default=30, description="How often the Dagster sensors look at the lake's tags."
    )
    freshness_hours: float = Field(
        default=26.0,
        gt=0,
        description="The exports, index and graph index fail their Dagster FreshnessPolicy "
        "when not materialized for this long (the daily refresh materializes them every day); "
        "they warn after three quarters of it.",
    )
    freshness_check_interval_seconds: int = Field(
        default=300,
        description="How often the freshness_checks sensor judges every dataset's exports "
        "by the specification's freshness rule (tags only).",
    )
    archive_documents: bool = Field(
        default=True,
        description="The archive sensor writes a Document entity for each newly archived file.",
    )

    def resolved_journal_url(self) -> str:
        """The journal URL, defaulting to a durable SQLite file."""
        if self.journal_url:
            return self.journal_url
        if self.is_s3:
            digest = hashlib.sha1(self.lake_uri.encode()).hexdigest()[:16]
            folder = self.cache_path / digest
        else:
            folder = Path(self.lake_uri.removeprefix("file://")).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(folder / 'journal.sqlite').resolve()}"

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()

    @property
    def is_s3(self) -> bool:
        return self.lake_uri.startswith("s3://")
