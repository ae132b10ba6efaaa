"""A local Spark standalone cluster: a master and N workers on 127.0.0.1.

The same shape as a user's real cluster (a master, workers whose executors run
in their own working folders with their own Python), started from the pyspark
package's own classes (it ships no ``start-master.sh``): ``spark-class
org.apache.spark.deploy.master.Master`` and ``...worker.Worker``. It is what
``lakehouse spark cluster start`` runs and what the tests' cluster mode uses;
a session reaches it by ``LAKEHOUSE_SPARK_MASTER=spark://127.0.0.1:PORT``.

Everything binds to 127.0.0.1. A standalone master runs whatever an
application submits, as this user, so the cluster is started with Spark's
shared-secret authentication (``spark.authenticate``): a random secret in a
properties file only this user can read (never on a command line), which a
session of this package on the same cache folder reads back
(:func:`auth_conf`). The state (PIDs, ports, URLs, log and work folders) is in
``{LAKEHOUSE_CACHE_DIR}/spark-cluster/``; each daemon runs in its own process
group, so ``stop`` ends it with its executors and their Python workers. A
state file whose processes are gone is recovered by the next ``status`` or
``start``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.locks import pid_alive, process_start
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark.daemons import _private_dir, _write_properties, answers, log4j_config
from lakehouse_assets.spark.java import require_java

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: Heap of each daemon (the master and a worker only schedule; executors have their own).
DAEMON_MEMORY = "256m"
HOST = "127.0.0.1"


@dataclass
class Daemon:
    """One process of the cluster (the master or a worker)."""

    role: str
    pid: int
    pid_start: int | None
    port: int
    web_port: int
    log: str
    work_dir: str | None = None
    alive: bool = False


@dataclass
class ClusterInfo:
    """What ``lakehouse spark cluster status`` shows."""

    running: bool
    master_url: str
    folder: str
    web_url: str | None = None
    executor_python: str | None = None
    daemons: list[Daemon] = field(default_factory=list)
    note: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def cluster_dir(settings: Settings) -> Path:
    return settings.cache_path / "spark-cluster"


def _state_file(settings: Settings) -> Path:
    return cluster_dir(settings) / "cluster.json"


def _secret_file(settings: Settings) -> Path:
    return cluster_dir(settings) / "cluster.properties"


def master_url(port: int) -> str:
    return f"spark://{HOST}:{port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _read_state(settings: Settings) -> dict[str, object] | None:
    try:
        data = json.loads(_state_file(settings).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _daemons(state: dict[str, object]) -> list[Daemon]:
    daemons = [Daemon(**d) for d in state.get("daemons", [])]  # type: ignore[attr-defined]
    for daemon in daemons:
        daemon.alive = pid_alive(daemon.pid) and process_start(daemon.pid) in (
            None,
            daemon.pid_start,
        )
    return daemons


def status(settings: Settings) -> ClusterInfo:
    """What runs of the cluster this cache folder started; a state whose
    processes are all gone is removed."""
    folder = cluster_dir(settings)
    state = _read_state(settings)
    if state is None:
        return ClusterInfo(False, master_url(settings.spark_cluster_port), str(folder))
    daemons = _daemons(state)
    url = str(state["master_url"])
    if not any(d.alive for d in daemons):
        _forget(settings)
        return ClusterInfo(
            False, url, str(folder), note="removed the state of a cluster whose processes are gone"
        )
    master = next(d for d in daemons if d.role == "master")
    dead = [d.role for d in daemons if not d.alive]
    return ClusterInfo(
        master.alive and not dead,
        url,
        str(folder),
        web_url=f"http://{HOST}:{master.web_port}",
        executor_python=str(state.get("executor_python")),
        daemons=daemons,
        note=f"not running: {', '.join(dead)} (restart: lakehouse spark cluster stop, then start)"
        if dead
        else None,
    )


def _forget(settings: Settings) -> None:
    _state_file(settings).unlink(missing_ok=True)
    _secret_file(settings).unlink(missing_ok=True)


def session_conf(settings: Settings, *, loopback: bool) -> dict[str, str]:
    """What a driver on a cluster master adds (an in-process one, or the local
    Connect server's): the executors' Python, its share of the cluster, and the
    local cluster's secret (:func:`auth_conf`). ``loopback``: the master is on
    127.0.0.1, so the executors reach the driver there (never a public address)."""
    return {
        "spark.pyspark.python": executor_python(settings),
        "spark.executor.memory": settings.spark_executor_memory,
        "spark.cores.max": str(settings.spark_cores_max),
        **({"spark.driver.host": HOST} if loopback else {}),
        **auth_conf(settings, settings.spark_master),
    }


def executor_python(settings: Settings) -> str:
    """The Python of a cluster's executors (``spark_executor_python``, else this one)."""
    import sys

    return settings.spark_executor_python or sys.executable


def client_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings of a session on the running local cluster, for a process
    that does not share this cache folder (a test fixture hands them to its
    children in ``LAKEHOUSE_SPARK_CONFIG``): they carry the secret."""
    state = _read_state(settings)
    return auth_conf(settings, str(state["master_url"])) if state else {}


def auth_conf(settings: Settings, master: str) -> dict[str, str]:
    """The Spark settings a session needs for ``master``: the shared secret of
    the local cluster when ``master`` is the one this cache folder started
    (and nothing for any other master: its secret is the user's to configure)."""
    state = _read_state(settings)
    if state is None or state.get("master_url") != master.rstrip("/"):
        return {}
    path = _secret_file(settings)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    secret = next(
        (ln.split("=", 1)[1] for ln in lines if ln.startswith("spark.authenticate.secret=")), None
    )
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret} if secret else {}


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env(settings: Settings, scratch: Path, python: str) -> dict[str, str]:
    """The daemons' environment: ours without PYTHONPATH (an executor must find
    only what its Python has and what the session ships) or a Spark URL."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "SPARK_CONNECT_MODE_ENABLED") and not k.startswith("LAKEHOUSE_")
    }
    env.update(
        {
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": (
                f"-Dlog4j2.configurationFile=file:{log4j_config(settings)} "
                f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData -XX:+UseSerialGC"
            ),
            "PYSPARK_PYTHON": python,
        }
    )
    return env


def _spawn(
    command: list[str], env: dict[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # its own process group: stopped with its executors, not by Ctrl-C
            start_new_session=True,
        )


def start(settings: Settings, *, timeout: float = 120.0) -> ClusterInfo:
    """Start the master and ``spark_cluster_workers`` workers (or find them
    running) and wait until every worker has registered with the master."""
    current = status(settings)
    if current.running:
        return current
    if current.daemons:  # partly running: stop what is left first
        stop(settings)
    port = settings.spark_cluster_port
    if answers(HOST, port):
        raise ConfigurationError(
            f"port {port} on {HOST} is taken by another program: choose another "
            "with --port or LAKEHOUSE_SPARK_CLUSTER_PORT"
        )
    python = executor_python(settings)
    if not Path(python).exists():
        raise ConfigurationError(
            f"the executors' Python {python} does not exist (LAKEHOUSE_SPARK_EXECUTOR_PYTHON)"
        )
    require_java()
    folder = _private_dir(cluster_dir(settings))
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    properties = _secret_file(settings)
    _write_properties(
        properties,
        {
            "spark.authenticate": "true",
            "spark.authenticate.secret": secrets.token_hex(32),
            "spark.master.rest.enabled": "false",
            "spark.ui.reverseProxy": "false",
            # a finished application's work folder (its shipped files, logs) goes
            "spark.worker.cleanup.enabled": "true",
        },
    )
    env = _env(settings, scratch, python)
    spark_class = str(_spark_home() / "bin" / "spark-class")
    url = master_url(port)
    daemons: list[Daemon] = []
    procs: list[subprocess.Popen[bytes]] = []

    def launch(role: str, command: list[str], port: int, web: int, work: Path | None) -> None:
        log = logs / f"{role}.log"
        proc = _spawn(command, env, folder, log)
        procs.append(proc)
        daemons.append(
            Daemon(
                role,
                proc.pid,
                process_start(proc.pid),
                port,
                web,
                str(log),
                str(work) if work else None,
            )
        )
        _save(settings, url, python, daemons)

    web = _free_port()
    launch(
        "master",
        [
            spark_class,
            MASTER_CLASS,
            "--host",
            HOST,
            "--port",
            str(port),
            "--webui-port",
            str(web),
            "--properties-file",
            str(properties),
        ],
        port,
        web,
        None,
    )
    deadline = time.monotonic() + timeout
    _wait(lambda: answers(HOST, port), procs, deadline, settings, "the master", daemons[0].log)
    for n in range(1, settings.spark_cluster_workers + 1):
        work = folder / f"worker-{n}"
        work.mkdir(exist_ok=True)
        wport, wweb = _free_port(), _free_port()
        launch(
            f"worker-{n}",
            [
                spark_class,
                WORKER_CLASS,
                "--host",
                HOST,
                "--port",
                str(wport),
                "--webui-port",
                str(wweb),
                "--cores",
                str(settings.spark_cluster_worker_cores),
                "--memory",
                settings.spark_cluster_worker_memory,
                "--work-dir",
                str(work),
                "--properties-file",
                str(properties),
                url,
            ],
            wport,
            wweb,
            work,
        )
    workers = settings.spark_cluster_workers
    _wait(
        lambda: _alive_workers(web) >= workers,
        procs,
        deadline,
        settings,
        f"{workers} workers to register",
        str(logs),
    )
    return status(settings)


def _save(settings: Settings, url: str, python: str, daemons: list[Daemon]) -> None:
    state = {
        "master_url": url,
        "executor_python": python,
        "started_at": time.time(),
        "daemons": [{k: v for k, v in asdict(d).items() if k != "alive"} for d in daemons],
    }
    path = _state_file(settings)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _alive_workers(web_port: int) -> int:
    """Workers the master counts as alive (its web UI's JSON)."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{web_port}/json/", timeout=2) as resp:
            return int(json.load(resp).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def _wait(
    ready: object,
    procs: list[subprocess.Popen[bytes]],
    deadline: float,
    settings: Settings,
    what: str,
    log: str,
) -> None:
    assert callable(ready)
    while not ready():
        exited = [p for p in procs if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            stop(settings)
            why = "a process exited" if exited else "timed out"
            raise ConfigurationError(
                f"the local Spark cluster did not start ({why} waiting for {what}): see {log}"
            )
        time.sleep(0.2)


def stop(settings: Settings, *, grace: float = 20.0) -> ClusterInfo:
    """Stop every process the cluster's state names (workers first, each with
    its process group: executors and their Python workers), then forget it."""
    folder = cluster_dir(settings)
    state = _read_state(settings)
    if state is None:
        return ClusterInfo(
            False, master_url(settings.spark_cluster_port), str(folder), note="nothing to stop"
        )
    daemons = _daemons(state)
    url = str(state["master_url"])
    live = [d for d in reversed(daemons) if d.alive]
    for daemon in live:
        _signal_group(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_group_alive(d.pid) for d in live) and time.monotonic() < deadline:
        for daemon in live:
            _reap(daemon.pid)
        time.sleep(0.1)
    for daemon in live:
        if _group_alive(daemon.pid):
            _signal_group(daemon.pid, signal.SIGKILL)
        _reap(daemon.pid)
    _forget(settings)
    return ClusterInfo(
        False,
        url,
        str(folder),
        daemons=daemons,
        note=f"stopped {len(live)} process(es)" if live else "not running",
    )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group a daemon leads (start_new_session made it one)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
