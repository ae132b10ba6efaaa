"""A local Spark Connect server: one warm Spark for every lakehouse command.

Starting a JVM and warming Spark costs 5–15 s, more than most operations on a
small dataset. pyspark ships the Spark Connect server, so the lakehouse runs
one in the background (``lakehouse spark start``) and every process that has
``LAKEHOUSE_SPARK_REMOTE=sc://127.0.0.1:PORT`` set talks to it over gRPC: the
CLI, Dagster runs and checks, the demo, mappings. The same setting pointed at
a cluster's Spark Connect endpoint (Databricks, EMR, Dataproc, a plain Spark
cluster) runs the same jobs there.

The server binds to 127.0.0.1 only (a setting that would move it elsewhere is
refused unless ``LAKEHOUSE_SPARK_CONNECT_ALLOW_NON_LOOPBACK`` says so) and
admits only clients that present its token: any local user can open a TCP
connection to a loopback port, and a Connect client runs code as the server's
user. Each start draws a new random token, hands it to the server in its
environment (a process's environment is readable by its own user only, its
command line by everyone) and writes it to a file only the owner can read;
clients of this package read it from there (:func:`authenticated_url`). The
server's Spark settings reach it in a private properties file, not on its
command line. Its PID file, log, token and working folder live in a folder
only the owner can enter,
``{LAKEHOUSE_CACHE_DIR}/spark-connect/{port}/``; start waits until the
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
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.locks import pid_alive, process_start
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark import cds
from lakehouse_assets.spark.daemons import (
    _private_dir,
    _write_properties,
    answers,
    log4j_config,
)
from lakehouse_assets.spark.java import require_java

logger = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def local_auth(settings: Settings) -> dict[str, str]:
    """Authentication of the driver's own RPC and block-transfer ports (random
    ports on loopback, which take Java-serialized messages from any local user
    otherwise): a local master draws the secret itself. A cluster master needs
    its secret configured (spark_config), so it is left alone."""
    return {"spark.authenticate": "true"} if settings.spark_master.startswith("local") else {}


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
    #: The file with the server's token (readable by its owner only).
    token_file: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def server_dir(settings: Settings, port: int) -> Path:
    return settings.cache_path / "spark-connect" / str(port)


def _pid_file(settings: Settings, port: int) -> Path:
    return server_dir(settings, port) / "server.json"


def token_file(settings: Settings, port: int) -> Path:
    """Where the running server's token is kept (mode 0600, in a 0700 folder)."""
    return server_dir(settings, port) / "token"


#: Spark settings that decide where the server listens.
BINDING_KEYS = (
    "spark.connect.grpc.binding.address",
    "spark.driver.bindAddress",
    "spark.driver.host",
)

#: Spark settings the lakehouse sets itself and spark_config may not change:
#: the port its clients look for, and the token it draws.
OWN_KEYS = ("spark.connect.grpc.binding.port", "spark.connect.authenticate.token")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only (no name lookup
    beyond ``localhost``: any other name may resolve to a public address)."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _new_token(settings: Settings, port: int) -> str:
    """Draw a token for a server about to start and store it for its clients.

    The file is created with mode 0600 and ``O_EXCL`` (never readable by others,
    not even for a moment, and never written through a planted link)."""
    token = secrets.token_hex(32)
    path = token_file(settings, port)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def read_token(settings: Settings, port: int) -> str | None:
    """The token of the local server on ``port`` started with this cache folder,
    or None when there is none (no server, or one started without a token).

    A token file that another user could have written or can read is refused:
    it is no proof of anything."""
    path = token_file(settings, port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the Spark Connect server's token {path} ({exc.strerror}): only "
            "the user who started the server can use it"
        ) from None
    with os.fdopen(fd) as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigurationError(
                f"the Spark Connect server's token {path} is not private to this user "
                f"(owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}): restart the "
                f"server (lakehouse spark stop --port {port} && lakehouse spark start "
                f"--port {port})"
            )
        token = fh.read(1024).strip()
    return token or None


def _url_params(url: str) -> dict[str, str]:
    """The ``;key=value`` parameters of a Connect URL."""
    params = urlparse(url.replace("sc://", "http://", 1)).params
    return dict(part.split("=", 1) for part in params.split(";") if "=" in part)


def with_param(url: str, key: str, value: str) -> str:
    """``url`` with ``;key=value`` added to its parameters."""
    if "/;" in url:
        return f"{url};{key}={value}"
    return f"{url.rstrip('/')}/;{key}={value}"


def authenticated_url(settings: Settings, url: str) -> str:
    """The URL a client of ours connects with: a loopback URL without a token gets
    the token of the local server on its port (read from its file), with the
    host ``localhost``, which is how pyspark sends a token over plain loopback
    TCP (gRPC's local credentials) rather than TLS. Any other URL (a cluster's,
    or one that names its own token or TLS) is used as given."""
    parsed = urlparse(url.replace("sc://", "http://", 1))
    host, port = parsed.hostname or "", parsed.port or 15002
    params = _url_params(url)
    if not is_loopback(host) or "token" in params or params.get("use_ssl", "") == "true":
        return url
    token = read_token(settings, port)
    if token is None:
        return url
    _require_own_listener(port)
    local = f"sc://localhost:{port}/"
    if parsed.params:
        local += ";" + parsed.params
    return with_param(local, "token", token)


def listener_uids(port: int) -> set[int]:
    """The users whose sockets listen on TCP ``port`` of this machine (Linux's
    /proc/net/tcp and tcp6; empty where there are none or no /proc)."""
    uids: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... uid: state 0A is LISTEN
            if (
                len(fields) > 7
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                uids.add(int(fields[7]))
    return uids


def _require_own_listener(port: int) -> None:
    """Refuse to hand the token to a port another user listens on: after the server
    stopped (or before it started) anyone can take its port and collect the
    token, and the plans (with the data and settings they carry) of clients."""
    strangers = listener_uids(port) - {os.geteuid()}
    if strangers:
        raise ConfigurationError(
            f"port {port} on 127.0.0.1 is served by another user's program (uid "
            f"{', '.join(map(str, sorted(strangers)))}), not by the Spark Connect server of "
            f"this user: not sending it the server's token. Restart the server on another "
            f"port (lakehouse spark start --port ...)"
        )


def client_url(settings: Settings, port: int) -> str:
    """The URL (with its token) a client uses for the local server on ``port``:
    for a process that does not share this cache folder (a test fixture
    handing it to its children). Keep it out of logs: it carries the token."""
    return authenticated_url(settings, f"sc://127.0.0.1:{port}")


def server_confs(settings: Settings, port: int, folder: Path) -> dict[str, str]:
    """The local server's Spark settings: the lake's ``spark_config`` under the
    lakehouse's own; a ``spark_config`` that would bind the server to another
    address than loopback (or change its port or token) is refused, naming the
    key, unless ``spark_connect_allow_non_loopback`` allows the address."""
    allow = settings.spark_connect_allow_non_loopback
    extra = dict(settings.spark_config)
    for key in OWN_KEYS:
        if key in extra:
            raise ConfigurationError(
                f"spark_config (LAKEHOUSE_SPARK_CONFIG) sets {key}, which the local Spark "
                "Connect server sets itself (the port: --port or LAKEHOUSE_SPARK_CONNECT_PORT; "
                "the token: drawn at each start)"
            )
    binding = dict.fromkeys(BINDING_KEYS, "127.0.0.1")
    for key in BINDING_KEYS:
        value = extra.pop(key, None)
        if value is None:
            continue
        if allow:
            binding[key] = value
        elif not is_loopback(value):
            raise ConfigurationError(
                f"spark_config (LAKEHOUSE_SPARK_CONFIG) sets {key}={value}, off the loopback "
                "address: anyone who reaches the server's port could try its token, and it "
                "travels unencrypted. Set LAKEHOUSE_SPARK_CONNECT_ALLOW_NON_LOOPBACK=true to "
                "allow it"
            )
    scratch = folder / "scratch"
    confs = {
        "spark.ui.enabled": str(settings.spark_ui_enabled).lower(),
        "spark.local.dir": str(scratch),
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        "spark.ui.showConsoleProgress": "false",
        **extra,
        **binding,
        "spark.connect.grpc.binding.port": str(port),
    }
    if not settings.spark_master.startswith("local"):
        # a server whose driver uses a cluster (lakehouse spark cluster): its
        # executors' Python and share, the local cluster's secret
        from lakehouse_assets.spark.cluster import session_conf

        confs = {**session_conf(settings, loopback=True), **confs}
    return {**local_auth(settings), **confs}


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
        token_file(settings, port).unlink(missing_ok=True)
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
        token_file=str(token_file(settings, port)),
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
    if not is_loopback(host):
        return
    info = status(settings, port)
    if info.running and info.stale_code:
        raise ConfigurationError(stale_code_message(port))


def start(
    settings: Settings,
    port: int | None = None,
    *,
    timeout: float = 180.0,
    warm_up: Callable[[str, Settings], None] | None = None,
) -> ServerInfo:
    """Start the local server (or find it running) and wait until it answers a query.

    ``warm_up(url, settings)``, when given, then runs real jobs on the new server
    (the caller's, e.g. :func:`lakehouse_assets.lake.warm_up`): this module sits
    below the lakehouse's operations and does not import them."""
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
    folder = _private_dir(server_dir(settings, port))
    confs = server_confs(settings, port, folder)  # refused before anything starts
    require_java()
    import pyspark

    home = Path(pyspark.__file__).parent
    scratch = folder / "scratch"  # ours to empty, whatever spark_config names
    shutil.rmtree(scratch, ignore_errors=True)  # a killed server's leftovers
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = folder / "server.log"
    java_options = (
        f"-Dlog4j2.configurationFile=file:{log4j_config(settings)} "
        f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData -XX:+ExitOnOutOfMemoryError "
        f"{cds.java_options(settings)} {settings.spark_driver_java_options}"
    ).strip()
    # the settings in a file only this user can read: a command line is
    # visible to every user (/proc/PID/cmdline), and spark_config may carry keys
    properties = folder / "server.properties"
    _write_properties(properties, confs)
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
        "--properties-file",
        str(properties),
    ]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # on a cluster master the executors' Python (it need not have this
        # package: each session ships it), else this interpreter
        "PYSPARK_PYTHON": settings.spark_executor_python
        if not settings.spark_master.startswith("local") and settings.spark_executor_python
        else sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # the server reads its token from here (Spark's own fallback for
        # spark.connect.authenticate.token): not on its command line
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": _new_token(settings, port),
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
            raise ConfigurationError(
                f"the Spark Connect server did not start (see {log_path}): "
                f"{start_failure(log_path.read_text(errors='replace')[-20000:])}"
            )
        time.sleep(0.2)
    try:
        _warm_up(f"sc://127.0.0.1:{port}", settings, warm_up)
    except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs the first job time
        logger.warning("the Spark Connect server answers, but its warm-up failed: %s", exc)
    return status(settings, port)


#: Words of a spark-submit or JVM line that says why a start failed (spark-submit
#: prints its usage text after the cause, so the log's tail alone hid it).
_CAUSE_WORDS = ("error", "exception", "invalid", "not found", "cannot", "denied")


def start_failure(log: str) -> str:
    """The line of a failed start's log that names its cause: the first that says
    error, exception, invalid…; else the log's last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if any(word in line.lower() for word in _CAUSE_WORDS) and not line.startswith("Usage"):
            return line[:400]
    return lines[-1][:400] if lines else "(the log is empty)"


def _warm_up(url: str, settings: Settings, jobs: Callable[[str, Settings], None] | None) -> None:
    """Run once what every real job runs, so no user pays for the first time: a
    query here, then ``jobs`` (the caller's flush and exports on a throwaway
    lake, see :func:`lakehouse_assets.lake.warm_up`)."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(authenticated_url(settings, url)).create()
    try:
        session.range(1).count()
    finally:
        session.stop()
    if jobs is not None:
        jobs(url, settings)


def stop(settings: Settings, port: int | None = None, *, grace: float = 30.0) -> ServerInfo:
    """Stop the local server by its PID (SIGTERM, then SIGKILL after ``grace`` seconds)."""
    port = port or settings.spark_connect_port
    record = _recorded(settings, port)
    if record is None or not _alive(record):
        _pid_file(settings, port).unlink(missing_ok=True)
        token_file(settings, port).unlink(missing_ok=True)
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
    token_file(settings, port).unlink(missing_ok=True)
    return ServerInfo(False, port, pid=pid, note="stopped")


def _reap(pid: int) -> None:
    """Collect a child's exit status (when this process started it) so it is really gone."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
