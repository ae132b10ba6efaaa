"""Our lakehouse against the peer ftm-lakehouse 0.9.0: same data, same machine.

    python -m benchmarks.peer                      # the real kek set (25,776 statements), cold
    python -m benchmarks.peer --warm               # ours on a warm Spark Connect server
    python -m benchmarks.peer --statements 1000000 --rounds 3
    python -m benchmarks.peer --statements 10000000 --only ours   # one system's figures
    python -m benchmarks.peer --statements 10000000 --steps flush,exports   # a first build

What it measures, for both systems, each in a fresh lake (a SQLite journal file
beside it) and each step as its own process:

1. journal write of the scaled kek FtM JSON lines (``benchmarks/data.py``);
2. flush of the journal into the statement store;
3. all exports (statements.csv, entities.ftm.json, statistics.json, index.json;
   the peer also writes documents.csv and parents.csv in the same pass);
4. optimize;
5. get: one process doing 100 gets of ids sampled from the data (seed 42),
   each get timed inside the process (median, p95 and the first one);
6. query with a filter (schema=Company): one process, results counted;
7. ours only: ``make`` of a copy of the lake taken after the journal write (the
   whole first build in one process: flush, graph index, exports, the first
   version), reported beside the peer's flush + exports (it has no make).

Beside the totals the report splits our flush and exports into their phases:
the step timings our CLI logs with ``-v`` (median over the rounds), and the rest
of the step's wall time (process start, imports, untimed work). The peer runs
at its ``warning`` log level, where it times no phases: its steps show as totals.

Wall time of each step is taken by this process from start to exit of the
child, so interpreter start-up, imports and (cold) the Spark JVM count, as they
do for a user running the command. Peak memory is the highest resident set of
the child's process tree, sampled from /proc every 50 ms. With ``--warm`` ours
runs on a Spark Connect server started before the steps (start-up time printed,
not counted) and our peak memory is the client tree plus the server tree
sampled at the same instants (the server is sampled during the peer's steps
too, so both pay the same sampling cost). Without ``--warm`` every one of our
Spark steps starts its own JVM.

The systems alternate step by step (round 1: ours, peer; round 2: peer,
ours; ...) so the machine's load affects both alike; ``--rounds R`` repeats the
whole comparison with fresh lakes and prints the median of each figure. After
the exports both entities.ftm.json files must have the same number of lines.
``--only ours`` (or ``peer``) runs one system: for a re-measure of one side
(its memory at 10M, say) without the other's hour; its table has no ratios.

The peer is installed once into ``benchmarks/.data/peer/`` (git-ignored): a
Python 3.12 venv with ftm-lakehouse 0.9.0, duckdb 1.5.5 and its delta/httpfs
extensions installed offline into a private extension folder. Everything else
lives in a temp folder, removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType

from benchmarks.data import KEK_STATEMENTS
from benchmarks.data import write as write_data
from benchmarks.dataplane import tree_rss

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / ".data"
PEER_DIR = DATA_DIR / "peer"
PEER_VENV = PEER_DIR / "venv"
PEER_EXTENSIONS = PEER_DIR / "duckdb_extensions"
PEER_VERSION = "0.9.0"
# ftmq[lake] asks duckdb>=1.5.6, but the newest extension wheels are 1.5.5.
DUCKDB_VERSION = "1.5.5"
PYENV_PYTHON312 = "/root/.pyenv/versions/3.12.1/bin/python3.12"

DATASET = "bench"
ORIGIN = "bench"
SEED = 42
SAMPLE_SECONDS = 0.05
MiB = 2**20

OURS, PEER = "ours", "peer"
SYSTEMS = (OURS, PEER)
STEPS = ("write", "flush", "exports", "optimize", "get", "query", "make")
STEP_LABELS = {
    "write": "journal write",
    "flush": "flush",
    "exports": "all exports",
    "optimize": "optimize",
    "get": "get (process, 100 gets)",
    "query": "query schema=Company",
    "make": "make of a new dataset",
}

# --- the code the child processes run ---------------------------------------------

#: Times ``get(entity_id)`` for every id of the JSON list in argv[2]; prints JSON.
GET_LOOP = """
ids = json.loads(open(sys.argv[2]).read())
times, found = [], 0
for entity_id in ids:
    clock = time.perf_counter()
    entity = get(entity_id)
    times.append((time.perf_counter() - clock) * 1000)
    found += entity is not None
print(json.dumps({"ms": times, "found": found}))
"""

OURS_GET = (
    """
import json, sys, time
from lakehouse_assets import Lakehouse
get = Lakehouse().dataset(sys.argv[1]).get_entity  # lake and journal from LAKEHOUSE_* env
"""
    + GET_LOOP
)

PEER_GET = (
    """
import json, sys, time
from ftm_lakehouse import get_entities
get = get_entities(sys.argv[1]).get
"""
    + GET_LOOP
)

PEER_CREATE = """
import sys
from ftm_lakehouse import ensure_dataset
ensure_dataset(sys.argv[1])
"""

PEER_WRITE = """
import sys
from ftmq.io import smart_read_proxies
from ftm_lakehouse import get_entities
get_entities(sys.argv[1]).add_many(smart_read_proxies(sys.argv[2]), origin=sys.argv[3])
"""

#: Installs duckdb's delta and httpfs extensions from their wheels (offline).
PEER_INSTALL_EXTENSIONS = """
import pathlib, sys
import duckdb, duckdb_extension_delta, duckdb_extension_httpfs
con = duckdb.connect(config={"extension_directory": sys.argv[1]})
for mod, name in ((duckdb_extension_delta, "delta"), (duckdb_extension_httpfs, "httpfs")):
    folder = pathlib.Path(mod.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    con.execute(f"INSTALL '{folder / (name + '.duckdb_extension')}'")
    con.execute(f"LOAD {name}")
"""

#: Exits 0 only if the peer venv has the right versions and loads both extensions.
PEER_CHECK = """
import sys
from importlib.metadata import version
import duckdb
assert version("ftm-lakehouse") == sys.argv[2], version("ftm-lakehouse")
assert duckdb.__version__ == sys.argv[3], duckdb.__version__
con = duckdb.connect(
    config={"extension_directory": sys.argv[1], "autoinstall_known_extensions": False}
)
for name in ("delta", "httpfs"):
    con.execute(f"LOAD {name}")
import ftm_lakehouse, ftmq.io  # noqa
"""


# --- processes ----------------------------------------------------------------------


def session_members(sid: int) -> list[int]:
    """Live processes of the session ``sid`` (from /proc).

    Every child runs in a session of its own, so this finds all it started,
    also processes that moved to a process group of their own (pyspark's
    worker daemons do) or lost their parent.
    """
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def signal_session(sid: int, signum: int) -> None:
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_session(sid: int, grace: float = 5.0) -> None:
    """SIGTERM the session we started, SIGKILL what is left after ``grace`` s."""
    signal_session(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_session(sid, signal.SIGKILL)


def reap_session(sid: int, grace: float = 15.0) -> int:
    """Wait for a finished child's session to empty; SIGKILL stragglers. Returns their count."""
    deadline = time.monotonic() + grace
    while (left := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        signal_session(sid, signal.SIGKILL)
    return len(left)


class RssSampler(threading.Thread):
    """Peak resident set of a process tree (and, summed at the same instants, of others)."""

    def __init__(self, root: int, others: Sequence[int]) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.others = list(others)
        self.peak = 0  # the root's tree
        self.peak_with_others = 0  # the root's tree plus the other trees
        self._finished = threading.Event()

    def run(self) -> None:
        while True:
            own = tree_rss(self.root)
            total = own + sum(tree_rss(pid) for pid in self.others)
            self.peak = max(self.peak, own)
            self.peak_with_others = max(self.peak_with_others, total)
            if self._finished.wait(SAMPLE_SECONDS):
                return

    def stop(self) -> None:
        self._finished.set()
        self.join()


@dataclass
class Run:
    """One child process: how long it took from here, its exit and its memory."""

    seconds: float
    returncode: int
    peak_rss: int
    peak_rss_with_others: int
    stdout: Path
    stderr: Path
    stragglers: int = 0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def stderr_tail(self, chars: int = 1500) -> str:
        try:
            text = self.stderr.read_text(errors="replace").strip()
        except OSError:
            return ""
        return text[-chars:]


def run(
    command: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    logs: Path,
    name: str,
    watch: Sequence[int] = (),
    timeout: float | None = None,
) -> Run:
    """Run ``command`` in a session of its own, timing it and sampling its memory."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    timed_out = False
    with stdout.open("wb") as out, stderr.open("wb") as err:
        clock = time.perf_counter()
        proc = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        sampler = RssSampler(proc.pid, watch)
        sampler.start()
        try:
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_session(proc.pid)
                returncode = proc.wait()
            seconds = time.perf_counter() - clock
        except BaseException:  # Ctrl-C, SIGTERM: leave nothing running
            kill_session(proc.pid)
            proc.wait()
            raise
        finally:
            sampler.stop()
    stragglers = reap_session(proc.pid)
    if timed_out:
        with stderr.open("a") as fh:
            fh.write(f"\n[peer.py] killed after the step timeout of {timeout} s\n")
    return Run(
        seconds=seconds,
        returncode=returncode,
        peak_rss=sampler.peak,
        peak_rss_with_others=sampler.peak_with_others,
        stdout=stdout,
        stderr=stderr,
        stragglers=stragglers,
        timed_out=timed_out,
    )


def clean_env() -> dict[str, str]:
    """This environment without anything either lakehouse (or its logging) would read."""
    drop = ("LAKEHOUSE_", "PYTHONPATH", "VIRTUAL_ENV", "LOG_LEVEL", "DEBUG", "PYSPARK_", "SPARK_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the peer's installation -----------------------------------------------------------


def find_python312(explicit: str | None) -> str:
    """A Python 3.12 that really runs (a pyenv shim may exist and fail)."""
    candidates: list[str | None] = [explicit, shutil.which("python3.12"), PYENV_PYTHON312]
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"), reverse=True)
    for candidate in candidates:
        if not candidate:
            continue
        try:
            done = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip().startswith("Python 3.12"):
            return candidate
    sys.exit("the peer needs Python 3.12: none of python3.12, " + PYENV_PYTHON312 + " works")


def peer_ready() -> bool:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        return False
    done = subprocess.run(
        [str(python), "-c", PEER_CHECK, str(PEER_EXTENSIONS), PEER_VERSION, DUCKDB_VERSION],
        capture_output=True,
        cwd=tempfile.gettempdir(),
        env=clean_env(),
    )
    return done.returncode == 0


def ensure_peer(python312: str | None) -> None:
    """Create the peer's venv once; a venv that already works is left alone."""
    if peer_ready():
        return
    interpreter = find_python312(python312)
    say(f"installing ftm-lakehouse {PEER_VERSION} into {PEER_VENV} (once) with {interpreter}")
    shutil.rmtree(PEER_VENV, ignore_errors=True)
    shutil.rmtree(PEER_EXTENSIONS, ignore_errors=True)
    PEER_DIR.mkdir(parents=True, exist_ok=True)
    pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    pip.append("--disable-pip-version-check")
    steps = [
        [interpreter, "-m", "venv", str(PEER_VENV)],
        [*pip, f"ftm-lakehouse=={PEER_VERSION}"],
        [
            *pip,
            "--no-deps",
            f"duckdb=={DUCKDB_VERSION}",
            f"duckdb-extension-delta=={DUCKDB_VERSION}",
            f"duckdb-extension-httpfs=={DUCKDB_VERSION}",
        ],
        [
            str(PEER_VENV / "bin" / "python"),
            "-c",
            PEER_INSTALL_EXTENSIONS,
            str(PEER_EXTENSIONS),
        ],
    ]
    for command in steps:
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=tempfile.gettempdir(), env=clean_env()
        )
        if done.returncode != 0:
            sys.exit(
                f"peer install failed: {' '.join(command[:4])} ...\n"
                f"{(done.stdout + done.stderr).strip()[-3000:]}"
            )
    if not peer_ready():
        sys.exit(f"the peer venv {PEER_VENV} was installed but does not pass its check")


# --- the two systems ------------------------------------------------------------------------


@dataclass
class System:
    """How to run each step of one lakehouse in one fresh lake."""

    name: str
    root: Path  # this system's folder of this round
    env: dict[str, str]
    commands: dict[str, list[str]]
    create: list[str]
    cli: list[str]  # its command line on the benchmark's dataset (for other workloads)
    entities_json: Path
    statements_csv: Path

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def ours(root: Path, data: Path, ids: Path, cache: Path, remote: str | None) -> System:
    lake, journal = root / "lake", root / "journal.sqlite"
    url = f"sqlite:///{journal}"
    env = clean_env()
    env.update(
        LAKEHOUSE_LAKE_URI=str(lake),
        LAKEHOUSE_JOURNAL_URL=url,
        LAKEHOUSE_CACHE_DIR=str(cache),
        # the code of the checkout this script is in (a worktree's), not whichever
        # checkout the venv's editable install points at
        PYTHONPATH=str(HERE.parent),
    )
    if remote:
        env["LAKEHOUSE_SPARK_REMOTE"] = remote
    cli = [lakehouse_cli(), "--lake", str(lake), "--journal-url", url]
    on = [*cli, "-d", DATASET]
    timed = [*cli, "-v", "-d", DATASET]  # -v: the step timings the report shows as phases
    return System(
        name=OURS,
        root=root,
        env=env,
        create=[*cli, "datasets", "create", DATASET],
        cli=on,
        commands={
            "write": [*on, "entities", "write", "-i", str(data), "-o", ORIGIN],
            "flush": [*timed, "flush"],
            "exports": [*timed, "export", "--force"],
            "optimize": [*on, "optimize"],
            "get": [sys.executable, "-c", OURS_GET, DATASET, str(ids)],
            "query": [*on, "query", "-s", "Company"],
            # the whole first build (flush, graph index, exports, first version) in
            # one process, of a copy of the lake taken after the journal write
            "make": [
                lakehouse_cli(),
                "--lake",
                str(root / "make" / "lake"),
                "--journal-url",
                f"sqlite:///{root / 'make' / 'journal.sqlite'}",
                "-v",
                "-d",
                DATASET,
                "make",
            ],
        },
        entities_json=lake / DATASET / "entities.ftm.json",
        statements_csv=lake / DATASET / "exports" / "statements.csv",
    )


def peer(root: Path, data: Path, ids: Path) -> System:
    lake, journal = root / "lake", root / "journal.db"
    env = clean_env()
    env.update(
        LAKEHOUSE_URI=str(lake),
        LAKEHOUSE_JOURNAL_URI=f"sqlite:///{journal}",  # the default is in memory
        LAKEHOUSE_DUCKDB_EXTENSION_DIRECTORY=str(PEER_EXTENSIONS),
        LAKEHOUSE_DUCKDB_TEMP_DIRECTORY=str(root / "duckdb_tmp"),
        LOG_LEVEL="warning",
    )
    python = str(PEER_VENV / "bin" / "python")
    cli = [str(PEER_VENV / "bin" / "ftm-lakehouse"), "-d", DATASET]
    return System(
        name=PEER,
        root=root,
        env=env,
        create=[python, "-c", PEER_CREATE, DATASET],
        cli=cli,
        commands={
            "write": [python, "-c", PEER_WRITE, DATASET, str(data), ORIGIN],
            "flush": [*cli, "maintenance", "flush"],
            "exports": [*cli, "export", "--force"],
            "optimize": [*cli, "maintenance", "optimize", "--force"],
            "get": [python, "-c", PEER_GET, DATASET, str(ids)],
            "query": [*cli, "entities", "iterate", "-q", "filter:schema=Company"],
        },
        entities_json=lake / DATASET / "entities.ftm.json",
        statements_csv=lake / DATASET / "exports" / "statements.csv",
    )


def lakehouse_cli() -> str:
    beside = Path(sys.executable).with_name("lakehouse")
    if beside.exists():
        return str(beside)
    found = shutil.which("lakehouse")
    if not found:
        sys.exit("the `lakehouse` command is not installed beside this interpreter")
    return found


class SparkServer:
    """Our local Spark Connect server for ``--warm``, always stopped on exit."""

    def __init__(self, cache: Path, work: Path, timeout: float) -> None:
        self.cache = cache
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.env = clean_env()
        self.env["LAKEHOUSE_CACHE_DIR"] = str(cache)
        self.work = work
        self.timeout = timeout
        self.pid: int | None = None
        self.start_seconds = 0.0

    def _cli(self, action: str) -> list[str]:
        return [
            lakehouse_cli(),
            "--lake",
            str(self.work / "lake"),
            "spark",
            action,
            "--port",
            str(self.port),
        ]

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        done = run(
            self._cli("start"),
            env=self.env,
            cwd=self.work,
            logs=self.work,
            name="spark-start",
            timeout=self.timeout,
        )
        self.start_seconds = done.seconds
        record = self.cache / "spark-connect" / str(self.port) / "server.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.pid = int(json.loads(record.read_text())["pid"])
        if not done.ok or self.pid is None:
            raise RuntimeError(
                f"`lakehouse spark start --port {self.port}` failed (exit {done.returncode}):\n"
                f"{done.stderr_tail()}"
            )

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            run(
                self._cli("stop"),
                env=self.env,
                cwd=self.work,
                logs=self.work,
                name="spark-stop",
                timeout=90,
            )
        if self.pid is not None and session_members(self.pid):
            say(f"the Spark Connect server (pid {self.pid}) outlived `spark stop`: killing it")
            kill_session(self.pid)  # it runs in a session of its own, led by its pid


# --- one comparison -----------------------------------------------------------------------


@dataclass
class StepResult:
    run: Run
    memory: int  # peak RSS to report (client tree, plus the server's when warm)
    figures: dict[str, float] = field(default_factory=dict)
    problem: str | None = None  # a step that exited 0 but whose output makes no sense
    #: (label, seconds) of each phase the step's log timed (ours: the ``-v`` steps)
    phases: list[tuple[str, float, float | None]] = field(default_factory=list)


@dataclass
class Round:
    number: int
    steps: dict[str, dict[str, StepResult]] = field(default_factory=dict)
    lines: dict[str, dict[str, int | None]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def count_lines(path: Path) -> int | None:
    if not path.exists():
        return None
    count = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def count_json_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.lstrip().startswith(b"{"))


def step_figures(step: str, done: Run) -> tuple[dict[str, float], str | None]:
    """What a step's stdout says: get timings, query result count."""
    if step == "query":
        return {"count": float(count_json_lines(done.stdout))}, None
    if step == "get":
        lines = done.stdout.read_text(errors="replace").strip().splitlines()
        try:
            data = json.loads(lines[-1])
            times = sorted(float(t) for t in data["ms"])
            found = int(data["found"])
        except (IndexError, ValueError, KeyError, TypeError):
            return {}, "get printed no timings"
        figures = {
            "median_ms": statistics.median(times),
            "p95_ms": times[max(0, math.ceil(0.95 * len(times)) - 1)],
            "first_ms": float(data["ms"][0]),
            "found": float(found),
        }
        problem = None if found == len(times) else f"found {found} of {len(times)} ids"
        return figures, problem
    return {}, None


#: A step timing of our ``-v`` log (:class:`lakehouse_assets.progress.Steps`):
#: ``  12.3s info lakehouse_assets.flush.spark_batch: flush bench: wrote 5 files (4.20 s, CPU 6.10 s)``
PHASE_LINE = re.compile(
    r"^\s*[\d.]+s (?:info [\w.]+: )?(?:flush|export|make) [^:\s]+: (?P<label>.+) "
    r"\((?P<seconds>[\d.]+) s(?:, CPU (?P<cpu>[\d.]+) s)?\)$"
)


def step_phases(done: Run) -> list[tuple[str, float, float | None]]:
    """The phases a step's log timed, in order, with the process's CPU seconds
    where the log gives them (none where it logs no timings)."""
    found = []
    for line in done.stderr.read_text(errors="replace").splitlines():
        if match := PHASE_LINE.match(line):
            cpu = float(match["cpu"]) if match["cpu"] else None
            found.append((match["label"], float(match["seconds"]), cpu))
    return found


def run_round(
    number: int,
    root: Path,
    data: Path,
    ids: Path,
    cache: Path,
    server: SparkServer | None,
    timeout: float,
    only: Sequence[str] = SYSTEMS,
    steps: Sequence[str] = STEPS,
) -> Round:
    result = Round(number)
    systems = {
        OURS: ours(root / OURS, data, ids, cache, server.url if server else None),
        PEER: peer(root / PEER, data, ids),
    }
    systems = {name: system for name, system in systems.items() if name in only}
    order = [name for name in (SYSTEMS if number % 2 == 1 else SYSTEMS[::-1]) if name in only]
    watch = [server.pid] if server and server.pid else []
    for system in systems.values():
        system.cwd.mkdir(parents=True, exist_ok=True)  # clean: the peer reads a .env here
    for name in order:  # not timed: an empty dataset to write into
        system = systems[name]
        done = run(
            system.create,
            env=system.env,
            cwd=system.cwd,
            logs=system.logs,
            name="create",
            timeout=timeout,
        )
        if not done.ok:
            result.failures.append(
                f"round {number} {name} create dataset: exit {done.returncode}\n"
                f"{done.stderr_tail()}"
            )
    for step in (s for s in STEPS if s in steps):
        for name in order:
            system = systems[name]
            if step not in system.commands:  # the peer has no make: its flush + exports
                continue
            done = run(
                system.commands[step],
                env=system.env,
                cwd=system.cwd,
                logs=system.logs,
                name=step,
                watch=watch,
                timeout=timeout,
            )
            memory = done.peak_rss_with_others if name == OURS else done.peak_rss
            figures, problem = step_figures(step, done) if done.ok else ({}, None)
            phases = step_phases(done) if done.ok else []
            outcome = StepResult(done, memory, figures, problem, phases)
            result.steps.setdefault(name, {})[step] = outcome
            status = "ok" if done.ok else f"FAILED (exit {done.returncode})"
            say(
                f"round {number}: {name:<4} {step:<9} {done.seconds:8.2f} s "
                f"{memory / MiB:8.0f} MiB  {status}"
                + (f"  {problem}" if problem else "")
                + (f"  ({done.stragglers} stragglers killed)" if done.stragglers else "")
            )
            if not done.ok:
                result.failures.append(
                    f"round {number} {name} {step}: exit {done.returncode}"
                    + (" (timed out)" if done.timed_out else "")
                    + f"; stderr tail ({done.stderr.relative_to(root.parent)}):\n"
                    + done.stderr_tail()
                )
            elif problem:
                result.failures.append(f"round {number} {name} {step}: {problem}")
        if step == "write" and "make" in steps:
            for system in systems.values():
                if "make" in system.commands:
                    copy_for_make(system)
        if step == "exports":
            for name, system in systems.items():
                result.lines[name] = {
                    "entities": count_lines(system.entities_json),
                    "statements": count_lines(system.statements_csv),
                }
    return result


def copy_for_make(system: System) -> None:
    """The lake and journal as the journal write left them, for ``make`` (not timed)."""
    target = system.root / "make"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copytree(system.root / "lake", target / "lake")
    for journal in system.root.glob("journal.sqlite*"):
        shutil.copy2(journal, target / journal.name)


# --- the report ----------------------------------------------------------------------------

Figure = Callable[[dict[str, StepResult]], float | None]


def seconds_of(*steps: str) -> Figure:
    def figure(results: dict[str, StepResult]) -> float | None:
        if any(s not in results or not results[s].run.ok for s in steps):
            return None
        return sum(results[s].run.seconds for s in steps)

    return figure


def memory_of(step: str) -> Figure:
    def figure(results: dict[str, StepResult]) -> float | None:
        found = results.get(step)
        return found.memory / MiB if found and found.run.ok else None

    return figure


def figure_of(step: str, key: str) -> Figure:
    def figure(results: dict[str, StepResult]) -> float | None:
        found = results.get(step)
        return found.figures.get(key) if found and found.run.ok else None

    return figure


def rows() -> Iterator[tuple[str, str, Figure, tuple[str, ...]]]:
    """(label, format, figure, steps it needs) of each line of the table."""
    for step in STEPS:
        yield f"{STEP_LABELS[step]} [s]", "{:.2f}", seconds_of(step), (step,)
    target = ("flush", "exports")
    yield "= flush + all exports [s]  (target)", "{:.2f}", seconds_of(*target), target

    def first_build(results: dict[str, StepResult]) -> float | None:
        """Ours: make of a new dataset; the peer (no make): its flush + exports."""
        return seconds_of("make")(results) if "make" in results else seconds_of(*target)(results)

    yield "make / peer's flush + exports [s]", "{:.2f}", first_build, target
    both = tuple(s for s in STEPS if s != "make")
    yield "= all steps (make aside) [s]", "{:.2f}", seconds_of(*both), both
    yield "get: median per get [ms]", "{:.1f}", figure_of("get", "median_ms"), ("get",)
    yield "get: p95 per get [ms]", "{:.1f}", figure_of("get", "p95_ms"), ("get",)
    yield "get: first get [ms]", "{:.1f}", figure_of("get", "first_ms"), ("get",)
    yield "query: entities found", "{:.0f}", figure_of("query", "count"), ("query",)
    for step in STEPS:
        yield f"peak RSS {STEP_LABELS[step]} [MiB]", "{:.0f}", memory_of(step), (step,)


def phase_report(rounds: Sequence[Round], only: Sequence[str]) -> list[str]:
    """Each system's flush and exports split into the phases its log timed
    (median over the rounds, numbers in a label shown as #), beside the step's
    total; ``(rest)`` is what no phase covers: process start, imports, the JVM's
    start where no phase times it, work between the timed steps."""
    lines: list[str] = []
    for name in only:
        for step in ("flush", "exports", "make"):
            results = [r.steps.get(name, {}).get(step) for r in rounds]
            done = [res for res in results if res is not None and res.run.ok]
            if not done or not any(res.phases for res in done):
                continue
            order: list[str] = []
            values: dict[str, list[float]] = {}
            cpus: dict[str, list[float]] = {}
            rests: list[float] = []
            for res in done:
                summed: dict[str, float] = {}
                summed_cpu: dict[str, float] = {}
                for label, seconds, cpu in res.phases:
                    key = re.sub(r"\d[\d,.]*", "#", label)
                    if key not in summed and key not in order:
                        order.append(key)
                    summed[key] = summed.get(key, 0.0) + seconds
                    if cpu is not None:
                        summed_cpu[key] = summed_cpu.get(key, 0.0) + cpu
                for key, seconds in summed.items():
                    values.setdefault(key, []).append(seconds)
                for key, cpu in summed_cpu.items():
                    cpus.setdefault(key, []).append(cpu)
                rests.append(res.run.seconds - sum(summed.values()))
            total = median([res.run.seconds for res in done]) or 0.0
            lines.append(f"{name} {STEP_LABELS[step]:<55} {total:8.2f} s   CPU")
            for key in order:
                cpu_cell = f"{median(cpus[key]) or 0.0:8.2f}" if key in cpus else ""
                lines.append(f"  {key[:60]:<60} {median(values[key]) or 0.0:8.2f} {cpu_cell}")
            lines.append(
                f"  {'(rest: start-up, imports, untimed work)':<60} {median(rests) or 0.0:8.2f}"
            )
    return lines


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(
    rounds: Sequence[Round],
    *,
    statements: int,
    entities: int,
    warm: bool,
    server: SparkServer | None,
    load: tuple[float, float, float],
    logs: str,
    only: Sequence[str] = SYSTEMS,
) -> bool:
    """Print the table; returns False if the entity counts of the exports differ."""
    mode = "warm (ours on a Spark Connect server)" if warm else "cold (each process its own Spark)"
    print()
    print(
        f"{datetime.now().isoformat(timespec='seconds')} | load {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (1/5/15 min, {os.cpu_count()} CPUs) | N = {statements:,} statements "
        f"requested ({entities:,} entities) | mode: {mode} | rounds: {len(rounds)}"
        + (" (median)" if len(rounds) > 1 else "")
    )
    print(f"peer: ftm-lakehouse {PEER_VERSION} (duckdb {DUCKDB_VERSION}); ours: {git_version()}")
    if server:
        print(f"ours: Spark Connect server start {server.start_seconds:.1f} s (not counted)")
    width = 40
    print()
    print(f"{'step':<{width}} | {'peer':>10} | {'ours':>10} | ratio (ours/peer)")
    print(f"{'-' * width}-+-{'-' * 10}-+-{'-' * 10}-+-{'-' * 17}")
    partial = False
    for label, fmt, figure, steps in rows():
        values: dict[str, float | None] = {}
        cells: dict[str, str] = {}
        for name in SYSTEMS:
            results = [r.steps.get(name, {}) for r in rounds]
            failed = sum(any(s in res and not res[s].run.ok for s in steps) for res in results)
            value = values[name] = median([figure(res) for res in results])
            if value is None:
                cells[name] = "FAILED" if failed else "-"
            else:
                cells[name] = fmt.format(value) + ("*" if failed else "")
                partial = partial or bool(failed)
        p, o = values[PEER], values[OURS]
        ratio = f"{o / p:.2f}" if p and o is not None else "-"
        print(f"{label:<{width}} | {cells[PEER]:>10} | {cells[OURS]:>10} | {ratio}")
    if partial:
        print("* the median of the rounds in which the step did not fail")
    print()
    phases = phase_report(rounds, only)
    if phases:
        print("phases [s] (median of the rounds; ours: the `-v` step timings):")
        for line in phases:
            print(line)
        print()
    if warm:
        print(
            "peak RSS of ours = client process tree + Spark Connect server tree; "
            "of the peer: its process tree."
        )
    print(
        "the peer's export also writes documents.csv and parents.csv; both exports "
        "write statements.csv, entities.ftm.json, statistics.json and index.json."
    )
    same = True
    for r in rounds:
        ent = {n: r.lines.get(n, {}).get("entities") for n in SYSTEMS}
        stm = {n: r.lines.get(n, {}).get("statements") for n in SYSTEMS}
        print(
            f"round {r.number}: entities.ftm.json lines: "
            + ", ".join(f"{n} {ent[n]}" for n in only)
            + "; statements.csv lines: "
            + ", ".join(f"{n} {stm[n]}" for n in only)
        )
        if any(ent[n] is None for n in only) or len({ent[n] for n in only}) > 1:
            same = False
    if not same:
        print()
        print("!" * 78)
        print("!!! WARNING: the two entities.ftm.json exports have DIFFERENT line counts")
        print("!!! (or one is missing): the systems did not produce the same entities.")
        print("!" * 78)
    failures = [f for r in rounds for f in r.failures]
    if failures:
        print()
        print(f"{len(failures)} failure(s) ({logs}):")
        for failure in failures:
            print("--- " + failure.rstrip())
    return same


def git_version() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(HERE.parent), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "lakehouse_assets (git unknown)"
    return f"lakehouse_assets at {rev or '?'}" + (" + uncommitted changes" if dirty else "")


# --- main ------------------------------------------------------------------------------------


def class_archive(cache: Path) -> str:
    """Ours as installed: the Makefile's ``java`` step prepares the JVM's class archive of
    Spark in the default cache folder (once); this run's own cache folder links
    to it, so our Spark starts as a user's would."""
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.spark import cds

    installed = cds.prepare(Settings())
    target = cds.archive_path(Settings(cache_dir=str(cache)))
    assert target is not None  # prepare found java
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(installed.path)
    return f"{installed.path} ({'built' if installed.built else 'there'})"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sample_ids(path: Path, count: int) -> tuple[list[str], int]:
    """``count`` distinct entity ids of the data file (seeded), and its number of entities."""
    with path.open("rb") as fh:
        total = sum(1 for _ in fh)
    picks = random.Random(SEED).sample(range(total), min(count, total))
    wanted = set(picks)
    found: dict[int, str] = {}
    with path.open("rb") as fh:
        for number, line in enumerate(fh):
            if number in wanted:
                found[number] = str(json.loads(line)["id"])
    return [found[n] for n in picks], total


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # runs every finally: children killed, server stopped


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--statements",
        type=int,
        default=KEK_STATEMENTS,
        help=f"statements of scaled kek data (default {KEK_STATEMENTS:,}: the real kek set)",
    )
    parser.add_argument("--warm", action="store_true", help="ours on a Spark Connect server")
    parser.add_argument(
        "--no-class-archive",
        dest="class_archive",
        action="store_false",
        help="ours without the JVM's class archive of `lakehouse spark prepare`",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat; print medians")
    parser.add_argument("--gets", type=int, default=100, help="ids the get step fetches")
    parser.add_argument("--keep", action="store_true", help="keep the lakes and logs")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temp folder")
    parser.add_argument(
        "--step-timeout", type=float, default=4 * 3600, help="kill a step after this many s"
    )
    parser.add_argument("--peer-python", default=None, help="a Python 3.12 for the peer venv")
    parser.add_argument(
        "--only", choices=SYSTEMS, default=None, help="run one system only (no ratios)"
    )
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help="the steps to run, comma-separated (the journal write always runs): "
        "`--steps flush,exports` for the first build's figures at 10M without an hour "
        "of the others",
    )
    args = parser.parse_args()
    steps = ("write", *(s.strip() for s in args.steps.split(",") if s.strip() != "write"))
    if unknown := [s for s in steps if s not in STEPS]:
        parser.error(
            f"--steps: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}"
        )
    only = (args.only,) if args.only else SYSTEMS
    if args.rounds < 1 or args.gets < 1:
        parser.error("--rounds and --gets must be at least 1")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)

    if PEER in only:
        ensure_peer(args.peer_python)
    DATA_DIR.mkdir(exist_ok=True)
    say(f"data: {args.statements:,} statements of scaled kek")
    data = write_data(DATA_DIR / f"kek-{args.statements}.ftm.json", args.statements)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakehouse-peer-bench-", dir=args.workdir))
    ids_path = work / "ids.json"
    ids, entities = sample_ids(data, args.gets)
    ids_path.write_text(json.dumps(ids))
    cache = work / "cache"
    if args.class_archive:
        say(f"the JVM's class archive (as `make` prepares it): {class_archive(cache)}")
    load = os.getloadavg()
    server: SparkServer | None = None
    rounds: list[Round] = []
    same = True
    try:
        if args.warm:
            server = SparkServer(cache, work / "spark", timeout=600)
            say(f"starting our Spark Connect server on port {server.port}")
            try:
                server.start()
            except RuntimeError as exc:
                print(f"--warm: {exc}", file=sys.stderr)
                sys.exit(1)
            say(f"server up in {server.start_seconds:.1f} s (pid {server.pid})")
        for number in range(1, args.rounds + 1):
            round_root = work / f"round-{number}"
            rounds.append(
                run_round(
                    number,
                    round_root,
                    data,
                    ids_path,
                    cache,
                    server,
                    args.step_timeout,
                    only,
                    steps,
                )
            )
        same = report(
            rounds,
            statements=args.statements,
            entities=entities,
            warm=args.warm,
            server=server,
            load=load,
            logs=f"logs in {work}" if args.keep else "logs removed: rerun with --keep to see them",
            only=only,
        )
        print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if server is not None:
            say("stopping our Spark Connect server")
            server.stop()
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = any(r.failures for r in rounds)
    sys.exit(0 if same and not failed else 1)


if __name__ == "__main__":
    main()
