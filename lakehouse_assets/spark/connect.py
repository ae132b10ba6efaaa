"""A local Spark Connect server: one warm Spark for every lakehouse command.

Starting a JVM and warming Spark costs 5–15 s, more than most operations on a
small dataset. pyspark ships the Spark Connect server, so the lakehouse runs
one in the background (``lakehouse spark start``) and every process that has
``LAKEHOUSE_SPARK_REMOTE=sc://127.0.0.1:PORT`` set talks to it over gRPC: the
CLI, Dagster runs and checks, the demo, mappings. The same setting pointed at
a cluster's Spark Connect endpoint (Databricks, EMR, Dataproc, a plain Spark
cluster) runs the same jobs there.

The server binds to 127.0.0.1 only. Its PID file, log and working folder live
under ``{LAKEHOUSE_CACHE_DIR}/spark-connect/{port}/``; start waits until the
server answers a query; stop sends SIGTERM to the recorded PID (SIGKILL after
a grace period); a PID file whose process is gone is recovered on the next
start or status. The server's Python workers run this interpreter, so they
import this package and its dependencies exactly as installed here, once:
Spark reuses a worker for the next task. A server started before the package
was upgraded (or a development checkout edited) would run the old code in
its tasks beside the new code of its clients, so the PID file records the
code's fingerprint and clients, ``start`` and ``status`` compare it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.locks import pid_alive, process_start
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark import cds
from lakehouse_assets.spark.java import require_java

logger = logging.getLogger(__name__)

#: Spark's own start-up chatter (log4j defaults, native-hadoop warning) stays
#: out of the way: warnings and errors only, to stderr (the server: its log).
LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoopnative.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoopnative.level = off
logger.sessionholder.name = org.apache.spark.sql.connect.service.SessionHolder
logger.sessionholder.level = warn
"""

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def log4j_config(settings: Settings) -> Path:
    """The quiet log4j2 configuration file (written once into the cache folder)."""
    path = settings.cache_path / "log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(LOG4J)
        os.replace(tmp, path)
    return path


@functools.cache
def code_fingerprint() -> str:
    """The lakehouse_assets code this process runs: its version and each module
    file's size and modification time (an upgrade or an edit changes it)."""
    from importlib.metadata import PackageNotFoundError, version

    import lakehouse_assets

    try:
        release = version("lakehouse_assets")
    except PackageNotFoundError:  # run from a source tree
        release = "unknown"
    root = Path(lakehouse_assets.__file__).parent
    digest = hashlib.sha256(release.encode())
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@dataclass
class ServerInfo:
    """What ``lakehouse spark status`` shows."""

    running: bool
    port: int
    pid: int | None = None
    url: str | None = None
    log: str | None = None
    started_at: float | None = None
    note: str | None = None
    #: Started with other lakehouse_assets code than this process's (see module doc).
    stale_code: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def server_dir(settings: Settings, port: int) -> Path:
    return settings.cache_path / "spark-connect" / str(port)


def _pid_file(settings: Settings, port: int) -> Path:
    return server_dir(settings, port) / "server.json"


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _recorded(settings: Settings, port: int) -> dict[str, object] | None:
    try:
        data = json.loads(_pid_file(settings, port).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(record: dict[str, object]) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    started = record.get("pid_start")
    return not isinstance(started, int) or process_start(pid) in (None, started)


def status(settings: Settings, port: int | None = None) -> ServerInfo:
    """Is the local server on ``port`` running? A stale PID file is removed."""
    port = port or settings.spark_connect_port
    record = _recorded(settings, port)
    if record is None:
        return ServerInfo(False, port)
    if not _alive(record):
        _pid_file(settings, port).unlink(missing_ok=True)
        return ServerInfo(
            False, port, note=f"removed the stale PID file of pid {record.get('pid')}"
        )
    stale = record.get("code") != code_fingerprint()
    return ServerInfo(
        True,
        port,
        pid=int(record["pid"]),  # type: ignore[call-overload]
        url=f"sc://127.0.0.1:{port}",
        log=str(record.get("log")),
        started_at=float(record.get("started_at") or 0),  # type: ignore[arg-type]
        note=STALE_CODE.format(port=port) if stale else None,
        stale_code=stale,
    )


#: What a server started with other code is told (``status``'s note).
STALE_CODE = (
    "started with other lakehouse_assets code than this process runs (upgraded or "
    "edited since): its Python workers would run the old code beside the new. Restart "
    "it: lakehouse spark stop --port {port} && lakehouse spark start --port {port}"
)


def stale_code_message(port: int) -> str:
    return f"the Spark Connect server at sc://127.0.0.1:{port} was " + STALE_CODE.format(port=port)


def require_current_code(settings: Settings, host: str, port: int) -> None:
    """Refuse a local server this lake's settings started with other code.

    A server on another machine, or one started with another cache folder,
    has no record here and is taken as it is."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return
    info = status(settings, port)
    if info.running and info.stale_code:
        raise ConfigurationError(stale_code_message(port))


def start(settings: Settings, port: int | None = None, *, timeout: float = 180.0) -> ServerInfo:
    """Start the local server (or find it running) and wait until it answers a query."""
    port = port or settings.spark_connect_port
    current = status(settings, port)
    if current.running:
        if current.stale_code:
            raise ConfigurationError(stale_code_message(port))
        return current
    if answers("127.0.0.1", port):
        raise ConfigurationError(
            f"port {port} on 127.0.0.1 is taken by another program; "
            f"choose another with --port or LAKEHOUSE_SPARK_CONNECT_PORT"
        )
    require_java()
    import pyspark

    home = Path(pyspark.__file__).parent
    folder = server_dir(settings, port)
    scratch = folder / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)  # a killed server's leftovers
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = folder / "server.log"
    java_options = (
        f"-Dlog4j2.configurationFile=file:{log4j_config(settings)} "
        f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData -XX:+ExitOnOutOfMemoryError "
        f"{cds.java_options(settings)} {settings.spark_driver_java_options}"
    ).strip()
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": str(settings.spark_ui_enabled).lower(),
        "spark.local.dir": str(scratch),
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        "spark.ui.showConsoleProgress": "false",
        **settings.spark_config,
    }
    command = [
        str(home / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--name",
        f"lakehouse-connect-{port}",
        "--master",
        settings.spark_master,
        "--driver-memory",
        settings.spark_driver_memory,
        "--driver-java-options",
        java_options,
    ]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("LAKEHOUSE_SPARK_REMOTE", None)
    clock = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped by its PID, not by Ctrl-C
        )
    record = {
        "pid": proc.pid,
        "pid_start": process_start(proc.pid),
        "port": port,
        "log": str(log_path),
        "started_at": time.time(),
        "code": code_fingerprint(),
    }
    tmp = _pid_file(settings, port).with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, _pid_file(settings, port))
    while not answers("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() - clock > timeout:
            stop(settings, port)
            tail = log_path.read_text(errors="replace")[-1500:]
            raise ConfigurationError(
                f"the Spark Connect server did not start (see {log_path}): {tail.strip()[-300:]}"
            )
        time.sleep(0.2)
    try:
        _warm_up(f"sc://127.0.0.1:{port}", settings)
    except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs the first job time
        logger.warning("the Spark Connect server answers, but its warm-up failed: %s", exc)
    return status(settings, port)


def _warm_up(url: str, settings: Settings) -> None:
    """Run once what every real job runs, on a throwaway lake, so no user pays for
    the first time: a flush (the journal data source, reduce, Spark's Parquet
    writer, delta-rs commits) and the exports. On a fresh server the first
    flush of 26k journal rows took 17 s, the next ones 4 s: JIT compilation,
    class loading and Python workers, not data."""
    import tempfile

    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(url).create()
    try:
        session.range(1).count()
    finally:
        session.stop()
    from lakehouse_assets.lake import Lakehouse

    with tempfile.TemporaryDirectory(prefix="warm-up-", dir=settings.cache_path) as tmp:
        lake = Lakehouse(
            str(Path(tmp) / "lake"),
            settings=settings.model_copy(update={"spark_remote": url, "journal_url": None}),
        )
        ds = lake.create_dataset("warm_up")
        sample = Path(__file__).parent.parent / "sample" / "entities.ftm.json"
        with sample.open("rb") as fh:
            ds.write_entities(fh, origin="warm_up")
        ds.make()


def stop(settings: Settings, port: int | None = None, *, grace: float = 30.0) -> ServerInfo:
    """Stop the local server by its PID (SIGTERM, then SIGKILL after ``grace`` seconds)."""
    port = port or settings.spark_connect_port
    record = _recorded(settings, port)
    if record is None or not _alive(record):
        _pid_file(settings, port).unlink(missing_ok=True)
        return ServerInfo(False, port, note="not running")
    pid = int(record["pid"])  # type: ignore[call-overload]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _reap(pid)
    _pid_file(settings, port).unlink(missing_ok=True)
    return ServerInfo(False, port, pid=pid, note="stopped")


def _reap(pid: int) -> None:
    """Collect a child's exit status (when this process started it) so it is really gone."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
