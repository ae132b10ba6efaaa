"""Shared fixtures: a temp lake (local folder or loopback S3), journals, servers.

The S3 server is a real moto server process on 127.0.0.1 (random free port,
its conditional writes atomic), started once per test session and stopped by
its own PID. PostgreSQL tests use the server on 127.0.0.1:5432 when it answers
and are skipped with a visible reason when it does not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets.lake import Dataset

if TYPE_CHECKING:
    # pyspark stays out of collection (the session is built inside the fixture).
    # A Connect session (pyspark.sql.connect.session.SparkSession, not a subclass)
    # is typed as the classic one with the same methods, as pyspark's builder and
    # get_spark declare it.
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
POSTGRES_URL = os.environ.get(
    "LAKEHOUSE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


# --- property tests ------------------------------------------------------------
#: ``ci`` (the default, what ``make test`` runs) keeps the property suite within
#: a few minutes; ``thorough`` (``make test-thorough``) runs every property with
#: at least 100 examples on a local lake and 20 on the S3 server.
PROFILE = os.environ.get("LAKEHOUSE_TEST_PROFILE", "ci")
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("thorough", settings.get_profile("ci"))
settings.load_profile(PROFILE if PROFILE in ("ci", "thorough") else "ci")


def examples(ci: int, thorough: int) -> int:
    """How many examples a property runs under the active profile."""
    return thorough if PROFILE == "thorough" else ci


#: The longest modules (minutes on 2 cores, measured with ``--durations``), run
#: first: ``--dist loadfile`` hands a worker the next module when it is free, so a
#: long one collected last kept one worker busy while the other sat idle (three
#: minutes of the main pass). The others keep their order.
LONGEST_FIRST = (
    "test_cluster",
    "test_properties_versions",
    "test_exports",
    "test_versions",
    "test_defs_ui",
    "test_cli",
    "test_flush",
    "test_security_robustness",
    "test_crash",
    "test_properties_commits",
    "test_properties_collections",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: ``python -I -c``: default SIGINT/SIGTERM handling, then exec the command in
#: place (same pid). A server started from a non-interactive shell may inherit
#: them ignored, and ignored signals survive ``exec``.
_LAUNCH = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def spawn(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``args`` in a session (and process group) of its own, stoppable by
    :func:`stop_process`, with default SIGINT/SIGTERM handling.

    Not ``preexec_fn``: Python code between ``fork`` and ``exec`` can deadlock
    in a process with threads (the test process runs gRPC's poller threads
    once a Spark Connect session exists): the likely cause of a server child
    that once never answered, its log holding only a gRPC poller error from
    the forked test process. ``start_new_session`` is done in C, and the
    signals are reset by a small launcher after ``exec``.
    """
    command = [sys.executable, "-I", "-c", _LAUNCH, *args]
    return subprocess.Popen(command, start_new_session=True, **popen)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """Stop a server and its children by PID (process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def source_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Tests archive and queue source files from pytest's temp folders: allow
    them (``LAKEHOUSE_SOURCE_ROOTS``; without it the queue reads no local file
    and the CLI and API only the current directory's), and ../shared/data where
    present (the real mappings' CSVs, outside the checkout). Set for the session,
    before any ``Settings`` is made; tests of the policy set their own."""
    base = tmp_path_factory.getbasetemp()
    roots = [str(base)] + ([str(SHARED_DATA.resolve())] if SHARED_DATA.is_dir() else [])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAKEHOUSE_SOURCE_ROOTS", os.pathsep.join(roots))
        yield base


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-compatible server (moto, its conditional writes atomic as S3's: see
    :mod:`~lakehouse_assets_tests.helpers.moto_atomic`) on 127.0.0.1."""
    from lakehouse_assets_tests.helpers.moto_atomic import command

    if importlib.util.find_spec("moto.server") is None:
        pytest.fail("moto's server not installed: pip install 'moto[server]'")
    port = free_port()
    proc = spawn(
        command("127.0.0.1", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    # generous: on a fresh checkout two workers import moto (and compile its
    # bytecode) at once beside running JVMs, which once took over 20 s
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"moto_server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.1)
    else:
        stop_process(proc)
        pytest.fail("moto_server did not start within 90 s")
    yield endpoint
    stop_process(proc)


@pytest.fixture(scope="session")
def s3_settings(s3_endpoint: str) -> Settings:
    return Settings(
        s3_endpoint_url=s3_endpoint,
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
        s3_region="us-east-1",
    )


def make_bucket(settings: Settings) -> str:
    from lakehouse_assets.storage import s3_client

    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3_client(settings).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lakehouse:
    """A fresh lake on a local folder and on the loopback S3 server, with a SQLite
    journal. In the cluster mode the S3 lake's journal is a fresh PostgreSQL
    database (a real cluster's: the tasks read it), the local lake's stays
    SQLite (a file the driver reads, handing the rows to the executors through
    the lake's staging area): both ways a cluster runs are tested."""
    if SPARK_MODE == "cluster" and request.param == "s3":
        journal = str(request.getfixturevalue("postgres_database"))
    else:
        journal = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    if request.param == "local":
        return Lakehouse(tmp_path / "lake", journal_url=journal)
    settings: Settings = request.getfixturevalue("s3_settings")
    bucket = make_bucket(settings)
    return Lakehouse(f"s3://{bucket}/lake", settings=settings, journal_url=journal)


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (what a CLI command or a Dagster step
    starts from: nothing imported yet), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        check=check,
        timeout=timeout,
    )


def lakehouse_env(lake: Lakehouse, **extra: str) -> dict[str, str]:
    """The environment a child process needs to open this lake (local or S3)."""
    env = {**os.environ, **extra}
    env["LAKEHOUSE_LAKE_URI"] = lake.store.uri
    env["LAKEHOUSE_JOURNAL_URL"] = lake.settings.resolved_journal_url()
    s = lake.settings
    # who does a small flush or incremental export: the driver, or Spark (0), as
    # the lake's settings say unless the caller says
    for key, setting in (
        ("LAKEHOUSE_FLUSH_DRIVER_ROWS", s.flush_driver_rows),
        ("LAKEHOUSE_EXPORT_DRIVER_STATEMENTS", s.export_driver_statements),
        ("LAKEHOUSE_EXPORT_ENGINE", s.export_engine),
    ):
        if key not in extra:
            env[key] = str(setting)
    for key, value in (
        ("LAKEHOUSE_S3_ENDPOINT_URL", s.s3_endpoint_url),
        ("LAKEHOUSE_S3_ACCESS_KEY_ID", s.s3_access_key_id),
        ("LAKEHOUSE_S3_SECRET_ACCESS_KEY", s.s3_secret_access_key),
    ):
        if value:
            env[key] = value
    return env


def cli_args(ds: Dataset) -> list[str]:
    """The CLI's options that open a dataset's lake, journal and dataset."""
    lake = ds.lake
    return [
        "--lake",
        lake.store.uri,
        "--journal-url",
        lake.settings.resolved_journal_url(),
        "-d",
        ds.name,
    ]


@pytest.fixture
def local_lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lakehouse:
    if SPARK_MODE == "cluster":  # as ``lake``: a cluster's journal is PostgreSQL
        return Lakehouse(
            tmp_path / "lake", journal_url=request.getfixturevalue("postgres_database")
        )
    return Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")


def postgres_available() -> str | None:
    """None if the server answers, else the reason it does not."""
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(
            POSTGRES_URL.replace("postgresql://", "postgresql+psycopg2://"),
            connect_args={"connect_timeout": 3},
        )
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {type(exc).__name__}"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    reason = postgres_available()
    if reason:
        pytest.skip(reason)
    return POSTGRES_URL


@pytest.fixture
def dagster_postgres(postgres_url: str) -> Iterator[str]:
    """A database of its own on the local server for Dagster's storage, dropped afterwards."""
    name = f"dagster_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(psycopg2_url(postgres_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def psycopg2_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """A journal URL of a new, empty PostgreSQL database, dropped after the test."""
    import sqlalchemy as sa

    name = f"lh_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(
        POSTGRES_URL.replace("postgresql://", "postgresql+psycopg2://"),
        isolation_level="AUTOCOMMIT",
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A journal URL on a real SQLite file and on the real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def dataset_name() -> str:
    """A unique dataset name, so tests sharing a PostgreSQL journal never collide."""
    return f"test_{uuid.uuid4().hex[:10]}"


def sample_entities() -> list[dict[str, object]]:
    import orjson

    path = REPO / "lakehouse_assets" / "sample" / "entities.ftm.json"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


#: How the suite runs Spark: "connect" (the default) — a Spark Connect server
#: per test worker, started by a fixture as a separate process with its own
#: working folder, used by the tests and by every child process they start
#: (LAKEHOUSE_SPARK_REMOTE); "inprocess" — a local[*] JVM in the test process.
#: "cluster" — an in-process driver on a standalone cluster (a master and two
#: workers on 127.0.0.1, one the test workers share) whose executors run a Python with the
#: lakehouse's dependencies but not the lakehouse (the session ships it), lakes
#: on PostgreSQL journals.
#: pyspark cannot mix the two in one process: ``make test`` runs the suite in
#: Connect mode, then in process the flush's tests (``local_mode``) and the
#: driver's (``driver``), then on the cluster, whose driver is an in-process
#: session too, the cluster's tests and each data-plane module's Spark path
#: (``on_cluster``; ``make test-cluster``: the whole ``spark_modes`` group).
SPARK_MODE = os.environ.get("LAKEHOUSE_TEST_SPARK", "connect")
TEST_SPARK = {"spark_shuffle_partitions": 2, "spark_driver_memory": "2g"}


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Spark Connect server on 127.0.0.1 (free port), stopped by its PID.

    Its URL carries the server's token (read from its owner-only file): the
    tests' lakes and children use other cache folders than the server's."""
    from lakehouse_assets.lake import warm_up
    from lakehouse_assets.spark import connect

    settings = Settings(cache_dir=str(tmp_path_factory.mktemp("connect-server")), **TEST_SPARK)
    port = free_port()
    info = connect.start(settings, port, warm_up=warm_up)
    assert info.running and info.url
    yield connect.client_url(settings, port)
    connect.stop(settings, port)


#: The test workers' one cluster: each session on it takes ``spark_cores_max``
#: (2) cores, so its workers offer enough for both test workers' sessions and a
#: child's at a time each (the CLI's, a Connect server's); cores here are slots,
#: not the machine's two
SHARED_WORKER_CORES = 4
SHARED_WORKER_MEMORY = "2g"


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every test worker of this run shares (the controller's base)."""
    return tmp_path_factory.getbasetemp().parent


def _cluster_settings(root: Path) -> Settings:
    return Settings(
        cache_dir=str(root / "shared-cluster"),
        spark_cluster_worker_cores=SHARED_WORKER_CORES,
        spark_cluster_worker_memory=SHARED_WORKER_MEMORY,
        **TEST_SPARK,
    )


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[Settings]:
    """A real standalone cluster (master + 2 workers on 127.0.0.1); the settings
    of a session on it (master, executors' Python, secret).

    Under xdist the test workers share one, started by the first to ask (a file
    lock in the run's shared folder) and stopped by the controller when the run
    ends (:func:`pytest_sessionfinish`): a cluster's start is the first minute of
    each worker's pass, and two clusters' six JVMs starting at once on two
    cores took longer than one's three. Alone (no xdist), the fixture starts and
    stops its own."""
    import fcntl
    import json

    from lakehouse_assets.spark import cluster
    from lakehouse_assets_tests.helpers.cluster import executor_python

    alone = worker_id == "master"
    root = tmp_path_factory.mktemp("cluster") if alone else _shared_root(tmp_path_factory)
    with open(root / "shared-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = executor_python(root / "executor-python")
        settings = _cluster_settings(root).model_copy(update={"spark_executor_python": str(python)})
        port_file = root / "shared-cluster.port"
        if port_file.exists():
            settings = settings.model_copy(
                update={"spark_cluster_port": json.loads(port_file.read_text())}
            )
        else:
            settings = settings.model_copy(update={"spark_cluster_port": free_port()})
            port_file.write_text(json.dumps(settings.spark_cluster_port))
        info = cluster.start(settings)  # finds it running when another worker started it
    assert info.running
    yield settings.model_copy(
        update={"spark_master": info.master_url, "spark_config": cluster.client_conf(settings)}
    )
    if alone:
        cluster.stop(settings)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller stops the test workers' shared cluster (:func:`spark_cluster`)."""
    if hasattr(session.config, "workerinput"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    root = factory.getbasetemp()
    if (root / "shared-cluster.port").exists():
        from lakehouse_assets.spark import cluster

        cluster.stop(_cluster_settings(root))


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The Spark session the tests' lakes use (see :data:`SPARK_MODE`)."""
    from lakehouse_assets.spark.session import get_spark, stop_spark

    settings = Settings(**TEST_SPARK)
    if SPARK_MODE == "connect":
        url = request.getfixturevalue("connect_server")
        os.environ["LAKEHOUSE_SPARK_REMOTE"] = url  # this process's lakes and its children
        settings = settings.model_copy(update={"spark_remote": url})
    elif SPARK_MODE == "cluster":
        import json

        on: Settings = request.getfixturevalue("spark_cluster")
        settings = settings.model_copy(
            update={
                k: getattr(on, k) for k in ("spark_master", "spark_executor_python", "spark_config")
            }
        )
        # this process's lakes (Settings() of the environment) and its children
        os.environ.pop("LAKEHOUSE_SPARK_REMOTE", None)
        os.environ["LAKEHOUSE_SPARK_MASTER"] = on.spark_master
        os.environ["LAKEHOUSE_SPARK_EXECUTOR_PYTHON"] = str(on.spark_executor_python)
        os.environ["LAKEHOUSE_SPARK_CONFIG"] = json.dumps(on.spark_config)
    else:
        os.environ.pop("LAKEHOUSE_SPARK_REMOTE", None)
    if SPARK_MODE != "connect":
        # the data-plane group again, with the full export pass on Spark's plan (the
        # main run's lakes take DuckDB's at their size: both engines are tested)
        os.environ["LAKEHOUSE_EXPORT_ENGINE"] = "spark"
    session = get_spark(settings)
    yield session
    for key in (
        "LAKEHOUSE_EXPORT_ENGINE",
        "LAKEHOUSE_SPARK_REMOTE",
        "LAKEHOUSE_SPARK_MASTER",
        "LAKEHOUSE_SPARK_EXECUTOR_PYTHON",
        "LAKEHOUSE_SPARK_CONFIG",
    ):
        os.environ.pop(key, None)
    stop_spark()
