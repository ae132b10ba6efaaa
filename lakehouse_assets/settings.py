"""Configuration from the environment (``LAKEHOUSE_*``) or keyword arguments.

Every field has a working default for the embedded setup: a lake folder in the
working directory, a SQLite journal inside it, and Spark on ``local[*]``.

Every number has a range (``ge``/``le`` on its Field, finite for floats) and
refuses ``true``/``false``; the journal URL must name a SQLite file or a
PostgreSQL server (:mod:`lakehouse_assets.journal_urls`). A bad value, from a
keyword or the environment, is one :class:`~lakehouse_assets.errors.InvalidSettingError`
naming the setting and its variable.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from lakehouse_assets.errors import InvalidSettingError
from lakehouse_assets.journal_urls import checked_journal_url

#: The longest vacuum retention (and freshness period): ten years, in hours.
#: A bound, not a policy: beyond it a retention overflowed the date
#: arithmetic of ``optimize --vacuum`` (1e29 hours was accepted).
MAX_RETENTION_HOURS = 10 * 365 * 24


def describe_setting_errors(exc: ValidationError) -> str:
    """``vacuum_retention_hours (LAKEHOUSE_VACUUM_RETENTION_HOURS): Input should be ...``.

    The value is shown for type and range errors only: a validator's own
    message (the journal URL's) says what it needs to, without the password.
    """
    parts = []
    for error in exc.errors():
        name = ".".join(str(p) for p in error["loc"]) or "(settings)"
        where = f"{name} (LAKEHOUSE_{str(error['loc'][0]).upper()})" if error["loc"] else name
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if error["type"] != "value_error" and isinstance(value, str | int | float | bool):
            shown = repr(value)
            message += f" (got {shown[:60]}{'...' if len(shown) > 60 else ''})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


#: a DuckDB memory size (more than nothing: DuckDB with no memory fails every query)
MEMORY_SIZE = r"^([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)\s*(KB|MB|GB|KiB|MiB|GiB)$"


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
        ge=1,
        le=366 * 24 * 3600,
        description="A lock older than this is stale even if its owner can't be checked.",
    )
    lock_wait_seconds: float = Field(
        default=900.0,
        ge=0,
        le=7 * 24 * 3600,
        allow_inf_nan=False,
        description="How long a writer of a dataset's tables (and an export's flush-first) "
        "waits for another one to finish.",
    )
    read_wait_seconds: float = Field(
        default=10.0,
        ge=0,
        le=24 * 3600,
        allow_inf_nan=False,
        description="How long a query's flush-first waits for a writer before it reads the "
        "current snapshot (saying how many journal rows are pending).",
    )
    query_chunk_bytes: int = Field(
        default=4 * 1024 * 1024,
        gt=0,
        le=2**31 - 1,
        description="Parquet bytes a query without entity ids reads at a time (its memory "
        "bound: the chunk's rows decoded, joined and sorted in Arrow; at 4 MB a `query` "
        "process peaked at 0.6-0.8 GB at 1M and 10M statements, and ran faster than "
        "with 32 MB chunks, which peaked at 1.6 GB at 1M).",
    )
    # --- http sources ---
    http_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=24 * 3600,
        allow_inf_nan=False,
        description="Connect/read timeout for http(s) sources.",
    )
    # --- journal ---
    journal_batch_size: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="Rows per INSERT batch when writing to the journal.",
    )
    # --- flush ---
    flush_batch_rows: int = Field(
        default=1_000_000,
        ge=1,
        le=2**31 - 1,
        description="Journal rows per flush batch (bounds the memory a flush needs).",
    )
    duckdb_memory_limit: str = Field(
        # DuckDB's process memory runs to about twice its limit (its Parquet
        # reader and allocator work outside it): 128MB kept a 10M-statement
        # graph rebuild's client at 885 MiB (256MB: 1,031 MiB) and cost its
        # live count 0.2 s
        default="128MB",
        # more than nothing: DuckDB with no memory fails every query it is given
        pattern=MEMORY_SIZE,
        description=(
            "The memory limit of DuckDB where it works on whole tables in this process "
            "(the graph index's rebuild, a version's diff and live count), spilling to a "
            "temporary folder beyond it: with Spark on a cluster, the host that runs the "
            "CLI or Dagster's run workers stays small."
        ),
    )
    flush_driver_rows: int = Field(
        # a 1% change of 10M statements is 106k journal rows: read in 2 s on the
        # driver, which also spares the Python workers' start and memory
        default=200_000,
        ge=0,
        le=2**31 - 1,
        description=(
            "A flush batch of at most this many journal rows is read and reduced by the "
            "driver (no Spark tasks, no Python workers to start); a larger one by Spark's "
            "tasks in parallel."
        ),
    )
    flush_driver_merge_rows: int = Field(
        # the driver merges about 1M translog rows a second per core (1M
        # statements, a 1% change: 1.3 s); a Spark job over the same files
        # costs its start and the JVM's as well (10M statements, a 1% change:
        # the Spark flush 85 s)
        default=25_000_000,
        ge=0,
        le=2**40,
        description=(
            "A batch the driver read is flushed by the driver too, in Arrow, file by file "
            "(its probes of the statements and translog files, the translog files it "
            "rewrites), as long as those hold at most this many stored rows; more, and "
            "Spark does the batch's joins and the translog's rewrite."
        ),
    )
    # --- exports ---
    export_driver_statements: int = Field(
        default=100_000,
        ge=0,
        le=2**31 - 1,
        description=(
            "An incremental export whose changed entities hold at most this many live "
            "statements makes their lines on the driver (no Spark job, no JVM to start); "
            "more, with Spark."
        ),
    )
    export_engine: Literal["auto", "duckdb", "spark"] = Field(
        default="auto",
        description=(
            "What makes a full export pass and a collection's build: `duckdb` (on the "
            "driver, this process: no "
            "JVM, no Spark tasks), `spark` (Spark's plan, on its local JVM or the "
            "cluster), or `auto`: DuckDB for a snapshot of at most "
            "export_duckdb_max_statements statements, Spark beyond. Both write the "
            "same bytes."
        ),
    )
    export_duckdb_max_statements: int = Field(
        # 1M statements (benchmarks/peer.py, cold): DuckDB's pass in one process
        # against Spark's JVM start, plan and tasks; see docs/benchmarks.md
        default=25_000_000,
        ge=0,
        le=2**40,
        description=(
            "With export_engine `auto`, the largest snapshot (statements in its files, "
            "before deletes) whose full export pass DuckDB makes on the driver; for a "
            "collection's build, the statements of its leaves."
        ),
    )
    export_duckdb_memory_limit: str = Field(
        default="1GB",
        pattern=MEMORY_SIZE,
        description=(
            "DuckDB's memory limit in a full export pass on the driver; its sorts and "
            "aggregations spill to a temporary folder beyond it."
        ),
    )
    vacuum_retention_hours: int = Field(
        default=168,
        ge=0,
        le=MAX_RETENTION_HOURS,
        description="vacuum keeps files a version younger than this still needs.",
    )
    # --- spark ---
    spark_remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:port): run every Spark job on that server "
        "(the local one of `lakehouse spark start`, or a cluster's). Unset: in-process Spark.",
    )
    spark_connect_port: int = Field(
        default=15002,
        ge=1,
        le=65535,
        description="Port of the local Spark Connect server (127.0.0.1).",
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
    spark_executor_python: str | None = Field(
        default=None,
        description="The Python that a cluster's executors run (spark.pyspark.python): it "
        "needs the lakehouse's dependencies, not the lakehouse itself (shipped by the "
        "session). Unset: this process's interpreter.",
    )
    spark_cluster_port: int = Field(
        default=7077,
        ge=1,
        le=65535,
        description="Port of the master of `lakehouse spark cluster start` (127.0.0.1).",
    )
    spark_cluster_workers: int = Field(
        default=2, ge=1, le=64, description="Workers of `lakehouse spark cluster start`."
    )
    spark_cluster_worker_cores: int = Field(
        default=2, ge=1, le=1024, description="Cores each local cluster worker offers."
    )
    spark_cluster_worker_memory: str = Field(
        default="1g", description="Memory each local cluster worker offers its executors."
    )
    spark_executor_memory: str = Field(
        default="512m",
        description="spark.executor.memory of a session on a cluster master (spark://...).",
    )
    spark_cores_max: int = Field(
        default=2,
        ge=1,
        le=100_000,
        description="spark.cores.max of a session on a cluster master: what one application "
        "takes of the cluster, so several lakehouse processes share it instead of queueing.",
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
        default=8,
        ge=1,
        le=100_000,
        description="spark.sql.shuffle.partitions (small is right for 2 cores).",
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
        ge=0,
        le=2**50,
        description="CSVs at least this big are mapped on Spark; smaller ones in-process.",
    )
    # --- dagster ---
    sensor_interval_seconds: int = Field(
        default=30,
        ge=1,
        le=24 * 3600,
        description="How often the Dagster sensors look at the lake's tags.",
    )
    freshness_check_interval_seconds: int = Field(
        default=300,
        ge=1,
        le=24 * 3600,
        description="How often the freshness_checks sensor judges every dataset's exports "
        "by the specification's freshness rule (tags only).",
    )
    archive_documents: bool = Field(
        default=True,
        description="The archive sensor writes a Document entity for each newly archived file.",
    )
    # --- the HTTP server (see lakehouse_assets.server) ---
    api_secret: SecretStr | None = Field(
        default=None,
        description="The HS256 key that signs and checks the server's bearer tokens (at least "
        "32 characters; `lakehouse serve` refuses to start without it). Whoever holds it can "
        "issue a token for any tenant, dataset and action. Not read from a lake's config.yml.",
    )
    api_token_max_hours: float = Field(
        default=24 * 30,
        gt=0,
        le=24 * 366,
        allow_inf_nan=False,
        description="The longest lifetime `lakehouse tokens issue` gives a token, in hours.",
    )
    api_max_body_bytes: int = Field(
        default=512 * 1024 * 1024,
        gt=0,
        le=2**40,
        description="The largest NDJSON body (entities, statements) the server accepts: "
        "a larger one is 413 and nothing is written.",
    )
    api_max_upload_bytes: int = Field(
        default=4 * 1024**3,
        gt=0,
        le=2**44,
        description="The largest archive upload the server accepts: a larger one is 413 and "
        "nothing is stored.",
    )
    api_upload_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        le=24 * 3600,
        allow_inf_nan=False,
        description="How long the server waits for the next chunk of a request body before it "
        "gives up (408) and removes what it staged.",
    )
    api_query_max_filter_keys: int = Field(
        default=20,
        ge=1,
        le=10_000,
        description="The most filter conditions a query body may hold (as the peer caps them).",
    )
    api_query_max_in_values: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="The longest `__in` / `__not_in` list of a query body (as the peer).",
    )
    api_state_dir: str | None = Field(
        default=None,
        description="Local folder of the server's staging uploads and its operation jobs' "
        "state (shared by the workers of one host; not under the cache folder, which the archive "
        "never reads from). Default: lakehouse-server-{uid} in the system's temporary folder.",
    )
    api_dagster_runs: bool = Field(
        default=True,
        description="When a Dagster instance is configured (LAKEHOUSE_API_DAGSTER_URL, or "
        "DAGSTER_HOME), the server's operations are Dagster runs of flush_job, refresh_dataset "
        "(make), export_job, compact_job and optimize_job (the UI shows them). False: the "
        "server's own worker runs them.",
    )
    api_dagster_url: str | None = Field(
        default=None,
        description="The Dagster webserver (http://host:port[/prefix]) whose instance queues "
        "the server's operations: submitted as runs through its GraphQL API, started by the "
        "daemon as the UI's runs are (its run queue, one run per dataset). Unset, with "
        "DAGSTER_HOME: the runs execute in the server's process.",
    )
    api_operation_wait_seconds: float = Field(
        default=600.0,
        ge=0,
        le=24 * 3600,
        allow_inf_nan=False,
        description="How long the peer's `POST .../entities/flush` waits for the flush job it "
        "submitted before it answers 202 with the job instead of the count.",
    )
    # --- Delta Sharing and published files (see lakehouse_assets.sharing) ---
    sharing_url_seconds: int = Field(
        default=900,
        ge=10,
        le=7 * 24 * 3600,
        description="How long a file URL the Delta Sharing server hands out stays valid, in "
        "seconds (a presigned S3 URL, or the server's signed download route on a local lake): "
        "long enough for a recipient to read a table, short enough that a leaked URL dies soon.",
    )
    public_datasets: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Datasets (names or globs such as `opensanctions_*`) whose published files "
        "(index.json, entities.ftm.json, the exports and the delta feed) the server serves "
        "without a token (LAKEHOUSE_PUBLIC_DATASETS: a JSON list or names separated by ','). "
        "Their tables still need a token. Unset: every file needs a token.",
    )

    @field_validator("public_datasets", mode="before")
    @classmethod
    def _split_public(cls, value: object) -> object:
        """``LAKEHOUSE_PUBLIC_DATASETS`` as a JSON list or as ``a,b``."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    # --- source files (see lakehouse_assets.access) ---
    source_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Folders queued file UPSERTs (tenants' paths) may read local files from "
        "(LAKEHOUSE_SOURCE_ROOTS: a JSON list or paths separated by ':'; unset: a queued local "
        "path is refused). A path is resolved with every symlink followed before the check. "
        "A path the user names on their own command line or Python call (`archive add`, "
        "`crawl`, `Dataset.add_file`) is theirs to read wherever it lies. Never, whoever names "
        "it: /proc, /sys, /dev, the lake's own folder, its journal, lakehouse.env, the cache "
        "folder and the server's state folder. Not read from a lake's config.yml: a lake "
        "cannot widen what its consumer reads.",
    )

    source_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts queued http(s) sources may reach although their address is not "
        "public, e.g. an internal file server (LAKEHOUSE_SOURCE_HOSTS: a JSON list or "
        "entries separated by ',' or spaces, each host or host:port, [v6]:port for IPv6; "
        "matched against the host as the URL names it, no port: any port). Otherwise a "
        "queued URL must resolve to public addresses only (no loopback, link-local such as "
        "169.254.169.254, private or other internal address), redirects included. "
        "`archive add`, `crawl` and the Python API read any URL they are given. Not read "
        "from a lake's config.yml.",
    )

    @field_validator("source_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        """``LAKEHOUSE_SOURCE_HOSTS`` as a JSON list or ``a:8080,b``; entries normalised."""
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.replace(",", " ").split()
        if not isinstance(value, list):
            return value
        hosts = []
        for entry in value:
            if not isinstance(entry, str):
                raise ValueError(f"source host {entry!r} is not a string")
            parts = urlsplit(f"//{entry.strip()}")
            try:
                port = parts.port
            except ValueError as exc:
                raise ValueError(f"source host {entry!r}: {exc}") from None
            host = (parts.hostname or "").rstrip(".")
            if not host or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
                raise ValueError(f"source host {entry!r} is not host[:port]")
            shown = f"[{host}]" if ":" in host else host
            hosts.append(shown if port is None else f"{shown}:{port}")
        return hosts

    @field_validator("source_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        """``LAKEHOUSE_SOURCE_ROOTS`` as a JSON list or as ``PATH``-style ``a:b``."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part for part in text.split(os.pathsep) if part.strip()]
        return value

    def __init__(self, **values: Any) -> None:
        """Settings from ``values``, the environment and ``./lakehouse.env``;
        :class:`~lakehouse_assets.errors.InvalidSettingError` (one line naming
        each setting and its variable) instead of pydantic's multi-line error."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidSettingError(f"invalid settings: {describe_setting_errors(exc)}") from None
        except SettingsError as exc:  # a JSON setting (spark_config) that is not JSON
            raise InvalidSettingError(f"invalid settings: {exc}") from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``true`` is not a number: pydantic would take it as 1 (one hour of
        vacuum retention). Applies to every int and float field, present and future."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError(f"a number is expected, not {str(value).lower()}")
        return value

    @field_validator("cache_dir")
    @classmethod
    def _absolute_cache(cls, value: str) -> str:
        """A relative folder made absolute where it is given: the Spark Connect
        server and its spark-submit run in folders of their own, where
        ``cache`` named another place (its properties file was "invalid")."""
        return str(Path(value).expanduser().absolute()) if value else value

    @field_validator("journal_url")
    @classmethod
    def _durable_journal(cls, value: str | None) -> str | None:
        """An in-memory journal would lose acknowledged writes (see
        :mod:`lakehouse_assets.journal_urls`); empty means unset."""
        return checked_journal_url(value) if value else value

    def resolved_journal_url(self) -> str:
        """The journal URL, defaulting to a durable SQLite file.

        Checked here too (:func:`~lakehouse_assets.journal_urls.checked_journal_url`):
        ``Lakehouse(journal_url=...)``, ``--journal-url`` and ``config.yml`` set
        the field with ``model_copy``, which does not validate."""
        if self.journal_url:
            return checked_journal_url(self.journal_url)
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
    def api_state_path(self) -> Path:
        """The server's state folder (staging uploads, jobs): ``api_state_dir`` or
        ``lakehouse-server-{uid}`` in the system's temporary folder. Never a source
        of the archive, except the server's own staged uploads."""
        if self.api_state_dir:
            return Path(self.api_state_dir).expanduser()
        return Path(tempfile.gettempdir()) / f"lakehouse-server-{os.getuid()}"

    @property
    def is_s3(self) -> bool:
        return self.lake_uri.startswith("s3://")
