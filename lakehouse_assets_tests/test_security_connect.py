"""The local Spark Connect server on a shared host (issue 32).

A Spark Connect client runs code as the server's user, and any local user can
open a TCP connection to a loopback port. So the server admits only clients
that present its token, drawn at each start and kept in a file only its owner
can read; it never binds off loopback because of a stray ``spark_config``; and
neither the token nor ``spark_config`` appears on a command line (which every
user can read in /proc). The clients here are real pyspark Connect clients in
their own processes, some of them running as another user (uid 65534).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark import connect
from lakehouse_assets.spark.session import redacted_url, shared_session_url

from .conftest import REPO, TEST_SPARK, free_port

NOBODY = 65534
#: Runs a command as uid/gid 65534 (Python's own ``user=`` could not exec this
#: venv's interpreter here, a link into root's home, where setpriv can).
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _another_user_can_run_this_python() -> bool:
    """Whether uid 65534 finds pyspark and this package through this Python:
    not when the checkout or its venv sits in a folder only its owner may
    enter (a ``mktemp -d`` clone is 0700)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('pyspark') and u.find_spec('lakehouse_assets') else 1)"
    try:
        done = subprocess.run(
            [*AS_NOBODY, sys.executable, "-c", probe], capture_output=True, cwd="/tmp", timeout=60
        )
    except OSError:
        return False
    return done.returncode == 0


as_root = pytest.mark.skipif(
    not _another_user_can_run_this_python(),
    reason="needs root, setpriv, and a checkout whose Python, pyspark and package "
    "another user (uid 65534) can read, to run a client as that user",
)

#: A client in its own process: tries each URL with a bare pyspark Connect
#: client (what any local user can run) and prints what happened, as JSON.
BARE_CLIENT = """
import json, sys
from pyspark.sql import SparkSession
out = []
for url in sys.argv[1:]:
    try:
        session = SparkSession.builder.remote(url).create()
        out.append(["ok", session.range(3).count()])
        session.stop()
    except Exception as exc:
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""

#: A spark_config value the properties file must carry intact.
PROBE = "a=b: c#d\\e ü\n!x\\u0041"

#: A client of ours: the lakehouse's session factory with the environment's settings.
OUR_CLIENT = """
from lakehouse_assets.spark.session import get_spark
print(get_spark().range(4).count())
"""


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Settings, int, str]]:
    """A local server of our own, started by ``lakehouse spark start`` (its
    warm-up must get in with the token; in its own process, as pyspark allows
    one Connect server per process), in a cache folder another user may
    enter, so the server's own folder and token file are what keep them out.
    The cache folder is given relative to the folder the command runs in
    (``LAKEHOUSE_CACHE_DIR=cache``): spark-submit runs in the server's own
    folder, where a relative properties file path was "invalid" (issue 52).
    Yields the settings, the port and what the start printed on stderr."""
    base = Path(tempfile.mkdtemp(prefix="lakehouse-connect-security-"))
    base.chmod(0o755)  # uid 65534 gets as far as the server's folder
    cache = base / "cache"
    spark_config = {
        "spark.hadoop.fs.s3a.secret.key": "not-on-the-command-line",
        "spark.lakehouse.probe": PROBE,
    }
    settings = Settings(cache_dir=str(cache), spark_config=spark_config, **TEST_SPARK)
    port = free_port()
    env = _env(cache)
    env["LAKEHOUSE_CACHE_DIR"] = "cache"  # relative to cwd=base
    env["LAKEHOUSE_SPARK_CONFIG"] = json.dumps(spark_config)
    env.update({f"LAKEHOUSE_{k.upper()}": str(v) for k, v in TEST_SPARK.items()})
    started = subprocess.run(
        [_lakehouse(), "--lake", str(base / "lake"), "spark", "start", "--port", str(port)],
        capture_output=True,
        text=True,
        env=env,
        cwd=base,
        timeout=600,
    )
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert connect.status(settings, port).running
        yield settings, port, started.stderr
    finally:
        connect.stop(settings, port)
        shutil.rmtree(base, ignore_errors=True)


def _lakehouse() -> str:
    return str(Path(sys.executable).parent / "lakehouse")


def _env(cache: Path | None = None, remote: str | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKEHOUSE_", "SPARK_CONNECT", "PYSPARK"))
    }
    env["PYTHONPATH"] = str(REPO)
    env["HOME"] = "/tmp"
    if cache is not None:
        env["LAKEHOUSE_CACHE_DIR"] = str(cache)
    if remote is not None:
        env["LAKEHOUSE_SPARK_REMOTE"] = remote
    return env


def _run(
    code: str, *args: str, env: dict[str, str], user: int | None = None
) -> subprocess.CompletedProcess[str]:
    prefix = AS_NOBODY if user == NOBODY else []
    return subprocess.run(
        [*prefix, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/tmp",
        timeout=300,
    )


def _bare(*urls: str, user: int | None = None) -> list[list[object]]:
    done = _run(BARE_CLIENT, *urls, env=_env(), user=user)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_client_without_the_servers_token_is_refused(
    server: tuple[Settings, int, str],
) -> None:
    """The issue's attack: a bare Connect client on 127.0.0.1 ran code as the
    server's user. Now without the token, or with a wrong one, every call is
    refused (UNAUTHENTICATED); with the token from the file it works."""
    settings, port, _ = server
    token = connect.read_token(settings, port)
    assert token and len(token) >= 64
    results = _bare(
        f"sc://127.0.0.1:{port}",
        f"sc://localhost:{port}",
        f"sc://localhost:{port}/;token={'0' * len(token)}",
        connect.client_url(settings, port),
    )
    for outcome, detail in results[:3]:
        assert outcome == "refused" and "UNAUTHENTICATED" in str(detail), detail
    assert "No authentication token provided" in str(results[0][1])
    assert "Invalid authentication token" in str(results[2][1])
    assert results[3] == ["ok", 3]


@as_root
def test_another_local_user_can_neither_read_the_token_nor_get_in(
    server: tuple[Settings, int, str],
) -> None:
    """uid 65534 (who can enter the cache folder) cannot read the token file,
    is refused by the server with a bare client, and our own client tells it in
    one line where the token is and that only the server's user can read it."""
    settings, port, _ = server
    path = connect.token_file(settings, port)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    results = _bare(f"sc://127.0.0.1:{port}", user=NOBODY)
    assert results[0][0] == "refused" and "UNAUTHENTICATED" in str(results[0][1])
    ours = _run(
        OUR_CLIENT,
        env=_env(settings.cache_path, f"sc://127.0.0.1:{port}"),
        user=NOBODY,
    )
    assert ours.returncode == 1
    last = ours.stderr.strip().splitlines()[-1]
    assert "ConfigurationError" in last and str(path) in last, ours.stderr[-2000:]
    assert "only the user who started the server" in last


def test_our_clients_find_the_token_of_the_local_server(
    server: tuple[Settings, int, str],
) -> None:
    """``LAKEHOUSE_SPARK_REMOTE=sc://127.0.0.1:PORT`` (what ``spark start`` tells
    the user) keeps working for the server's user with the same cache folder,
    the CLI and the Dagster resource included; the warm-up got in too. With
    another cache folder there is no token: one line names the token file."""
    settings, port, start_stderr = server
    assert "warm-up" not in start_stderr, start_stderr
    url = f"sc://127.0.0.1:{port}"
    done = _run(OUR_CLIENT, env=_env(settings.cache_path, url))
    assert done.returncode == 0 and done.stdout.strip() == "4", done.stderr[-2000:]
    resource = _run(
        "from lakehouse_assets.defs.resources import SparkResource\n"
        "print(SparkResource().spark_session.range(5).count())\n",
        env=_env(settings.cache_path, url),
    )
    assert resource.returncode == 0 and resource.stdout.strip() == "5", resource.stderr[-2000:]
    elsewhere = _run(OUR_CLIENT, env=_env(settings.cache_path / "other", url))
    assert elsewhere.returncode == 1
    last = elsewhere.stderr.strip().splitlines()[-1]
    assert "refused this client" in last and "token" in last, elsewhere.stderr[-2000:]
    status = subprocess.run(
        [_lakehouse(), "spark", "status", "--port", str(port)],
        capture_output=True,
        text=True,
        env=_env(settings.cache_path),
        cwd="/tmp",
        timeout=120,
    )
    assert status.returncode == 0 and f"LAKEHOUSE_SPARK_REMOTE={url}" in status.stdout
    assert connect.read_token(settings, port) not in status.stdout  # type: ignore[operator]


def test_the_warm_up_is_one_line_of_explanation_not_a_throwaway_flush(
    server: tuple[Settings, int, str],
) -> None:
    """``spark start``'s warm-up (a flush and export on a throwaway lake) used to
    print that dataset's stages, as if it were the person's data: now one line
    says what it is and why, one that it is done."""
    _, _, start_stderr = server
    lines = start_stderr.splitlines()
    assert sum("warming the new server up with a throwaway flush" in line for line in lines) == 1
    assert sum("spark start: warm after" in line for line in lines) == 1
    assert "warm_up" not in start_stderr, start_stderr  # none of its dataset's stages


def test_neither_the_token_nor_spark_config_is_on_a_command_line(
    server: tuple[Settings, int, str],
) -> None:
    """Every user can read every process's command line; the server gets its
    token in its environment (readable by its own user only) and its settings
    in a 0600 properties file."""
    settings, port, _ = server
    token = connect.read_token(settings, port)
    assert token
    info = connect.status(settings, port)
    assert info.pid
    tree = {info.pid} | _descendants(info.pid)
    for pid in tree:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert token.encode() not in cmdline
        assert b"not-on-the-command-line" not in cmdline
    probe = _run(
        "import json\n"
        "from lakehouse_assets.spark.session import get_spark\n"
        "print(json.dumps(get_spark().conf.get('spark.lakehouse.probe')))\n",
        env=_env(settings.cache_path, f"sc://127.0.0.1:{port}"),
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == PROBE  # the file carried it intact
    environ = Path(f"/proc/{info.pid}/environ")
    assert environ.stat().st_mode & 0o077 == 0
    properties = connect.server_dir(settings, port) / "server.properties"
    assert properties.stat().st_mode & 0o777 == 0o600
    assert token not in properties.read_text()


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            child = int(entry.name)
            found |= {child} | _descendants(child)
    return found


# --- no Spark needed --------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("spark.connect.grpc.binding.address", "0.0.0.0"),
        ("spark.driver.bindAddress", "0.0.0.0"),
        ("spark.driver.host", "spark.example.org"),
        ("spark.connect.grpc.binding.address", "::"),
    ],
)
def test_spark_config_cannot_move_the_server_off_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str
) -> None:
    """LAKEHOUSE_SPARK_CONFIG used to be applied after the binding keys: it could
    move the server onto every interface. Now start refuses, naming the key,
    before any process starts; the explicit setting allows it."""
    monkeypatch.setenv("LAKEHOUSE_SPARK_CONFIG", json.dumps({key: value}))
    monkeypatch.setenv("LAKEHOUSE_CACHE_DIR", str(tmp_path))
    settings = Settings()
    port = free_port()
    with pytest.raises(ConfigurationError, match=f"{key}={value}.*off the loopback") as caught:
        connect.start(settings, port)
    assert "LAKEHOUSE_SPARK_CONNECT_ALLOW_NON_LOOPBACK" in str(caught.value)
    assert not connect.status(settings, port).running
    assert not connect.token_file(settings, port).exists()
    monkeypatch.setenv("LAKEHOUSE_SPARK_CONNECT_ALLOW_NON_LOOPBACK", "true")
    allowed = Settings()
    assert connect.server_confs(allowed, port, tmp_path)[key] == value


def test_loopback_values_pass_and_the_lakehouse_keys_win(tmp_path: Path) -> None:
    """A spark_config that names loopback is harmless (the lakehouse's binding wins);
    the port and the token are the lakehouse's own (a spark_config that sets
    them is refused, naming the key)."""
    port = free_port()
    settings = Settings(
        cache_dir=str(tmp_path),
        spark_config={"spark.driver.host": "localhost", "spark.executor.memory": "1g"},
    )
    confs = connect.server_confs(settings, port, tmp_path)
    assert confs["spark.driver.host"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.port"] == str(port)
    assert confs["spark.executor.memory"] == "1g"
    assert confs["spark.authenticate"] == "true"  # the driver's own RPC ports
    for key in connect.OWN_KEYS:
        bad = settings.model_copy(update={"spark_config": {key: "1"}})
        with pytest.raises(ConfigurationError, match=key):
            connect.server_confs(bad, port, tmp_path)


def test_a_token_file_others_could_read_or_plant_is_refused(tmp_path: Path) -> None:
    """The token file must be this user's and private: a readable one is no
    secret, a symlink could be anyone's, a server folder of another user could
    be swapped under the server."""
    settings = Settings(cache_dir=str(tmp_path))
    port = free_port()
    folder = connect._private_dir(connect.server_dir(settings, port))
    assert folder.stat().st_mode & 0o777 == 0o700
    path = connect.token_file(settings, port)
    assert connect.read_token(settings, port) is None  # no server: no token
    token = connect._new_token(settings, port)
    assert path.stat().st_mode & 0o777 == 0o600
    assert connect.read_token(settings, port) == token
    path.chmod(0o644)
    with pytest.raises(ConfigurationError, match="not private to this user"):
        connect.read_token(settings, port)
    path.unlink()
    (tmp_path / "elsewhere").write_text("planted\n")
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigurationError, match="cannot read the Spark Connect server's token"):
        connect.read_token(settings, port)
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)
        with pytest.raises(ConfigurationError, match="not a folder of this user"):
            connect.start(settings, port)


@as_root
def test_the_token_goes_only_to_a_port_this_user_listens_on(tmp_path: Path) -> None:
    """After the server stops anyone may take its port: a client must not hand
    the token (and its plans) to another user's listener."""
    settings = Settings(cache_dir=str(tmp_path))
    listener = subprocess.Popen(
        [
            *AS_NOBODY,
            sys.executable,
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/tmp",
    )
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        connect._private_dir(connect.server_dir(settings, port))
        connect._new_token(settings, port)
        assert NOBODY in connect.listener_uids(port)
        with pytest.raises(ConfigurationError, match="another user's program"):
            connect.authenticated_url(settings, f"sc://127.0.0.1:{port}")
    finally:
        listener.kill()
        listener.wait()
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen()
        port = int(own.getsockname()[1])
        connect._private_dir(connect.server_dir(settings, port))
        token = connect._new_token(settings, port)
        url = connect.authenticated_url(settings, f"sc://127.0.0.1:{port}/;session_id=x")
        assert url == f"sc://localhost:{port}/;session_id=x;token={token}"


def test_urls_the_user_gives_pass_through_and_tokens_stay_out_of_messages(
    tmp_path: Path,
) -> None:
    """A cluster's URL, or one that names its own token or TLS, is used as given;
    the shared session id is added as a parameter (a URL with parameters used
    to get a second ``/;``); messages show ``token=***``."""
    settings = Settings(cache_dir=str(tmp_path))
    port = free_port()
    connect._private_dir(connect.server_dir(settings, port))
    connect._new_token(settings, port)
    for url in (
        f"sc://spark.example.org:{port}",
        f"sc://127.0.0.1:{port}/;token=mine",
        f"sc://127.0.0.1:{port}/;use_ssl=true",
    ):
        assert connect.authenticated_url(settings, url) == url
    assert shared_session_url("sc://localhost:1/;token=t").startswith(
        "sc://localhost:1/;token=t;session_id="
    )
    # every spelling of the local server's URL shares one server-side session
    # (its warm Python workers), whatever the token
    ids = {
        shared_session_url(url).rsplit("session_id=", 1)[1]
        for url in ("sc://127.0.0.1:1", "sc://localhost:1/;token=t", "sc://localhost:1/;token=u")
    }
    assert len(ids) == 1
    assert shared_session_url("sc://h:1").startswith("sc://h:1/;session_id=")
    assert redacted_url("sc://localhost:1/;token=abc;x=1") == "sc://localhost:1/;token=***;x=1"


def test_a_local_spark_authenticates_its_own_rpc_ports(tmp_path: Path) -> None:
    """The driver's RPC and block-transfer ports (in process and in the Connect
    server) take Java-serialized messages: with a local master Spark draws a
    secret for them; a cluster master needs its own, so it is left alone."""
    from lakehouse_assets.spark.session import spark_conf

    local = Settings(cache_dir=str(tmp_path))
    assert spark_conf(local)["spark.authenticate"] == "true"
    assert connect.server_confs(local, free_port(), tmp_path)["spark.authenticate"] == "true"
    cluster = local.model_copy(update={"spark_master": "spark://spark.example.org:7077"})
    assert "spark.authenticate" not in spark_conf(cluster)


def test_a_failed_start_names_its_cause_not_the_usage_text() -> None:
    """spark-submit prints its usage after the cause; the error shows the cause."""
    log = (
        "Error: Properties file cache/connect-15002/server.properties does not exist\n"
        "Usage: spark-submit [options] <app jar | python file | R file> [app arguments]\n"
        "Options:\n  --master MASTER_URL         spark://host:port, mesos://host:port\n"
    )
    assert connect.start_failure(log).startswith("Error: Properties file")
    assert connect.start_failure("") == "(the log is empty)"
    assert Settings(cache_dir="cache").cache_path.is_absolute()
