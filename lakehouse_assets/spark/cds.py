"""A class-data sharing (CDS) archive of Spark's classes: faster JVM starts.

Every in-process Spark (the embedded default: each CLI command, Dagster run
and test process that needs Spark) starts a JVM that loads and verifies about
fifteen thousand classes from Spark's jars before the first job. Java 17 can
dump the classes one run loaded into an archive and map it at the next start
instead (JEP 350, dynamic CDS archives). Measured here, in-process
``local[*]``: the session 5.3-5.7 s -> 3.3-3.7 s, its first job 2.4-2.6 s ->
1.3-1.7 s.

``lakehouse spark prepare`` (run by the Makefile's ``java`` step) builds
the archive once: a training process runs a small flush and export on a
throw-away lake with ``-XX:ArchiveClassesAtExit`` and waits for its JVM to
exit, which writes the archive; it is moved into place whole and checked
by starting Spark with ``-Xshare:on`` (a JVM that cannot map it refuses
to start). Drivers use
it when it exists: the in-process Spark and the local Connect server.

The archive belongs to one JVM and one install of Spark's jars, so its name
carries pyspark's version and a digest of the JVM's files and the jars'
folder (paths, sizes, times); after an upgrade or a reinstall it is not used
(a JVM also checks an archive against its class path and ignores one that
does not match) until ``prepare`` runs again, which removes the archives of
installs that are gone or were reinstalled. One is about 190 MB, in
``{LAKEHOUSE_CACHE_DIR}/jvm/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets import progress
from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark.java import java_executable


def _java() -> Path | None:
    exe = java_executable()
    return Path(exe).resolve() if exe else None


def _pyspark_version() -> str:
    from importlib.metadata import version

    return version("pyspark")


def _spark_jars() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigurationError("pyspark is not installed")
    return Path(spec.origin).resolve().parent / "jars"


def _identity() -> list[str] | None:
    """What an archive is valid for: the JVM (its files' paths, sizes, times)
    and the Spark jars (their folder, and its time: a reinstall rewrites it)."""
    java = _java()
    if java is None:
        return None
    identity = [_pyspark_version()]
    jars = _spark_jars()
    for part in (java, java.parent.parent / "lib" / "server" / "libjvm.so", jars):
        if part.exists():
            stat = part.stat()
            identity.append(f"{part}:{stat.st_size}:{stat.st_mtime_ns}")
    return identity


def archive_path(settings: Settings) -> Path | None:
    """Where the archive for this JVM and these Spark jars lives (None: no java)."""
    identity = _identity()
    if identity is None:
        return None
    digest = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return settings.cache_path / "jvm" / f"spark-{identity[0]}-{digest}.jsa"


def java_options(settings: Settings) -> str:
    """The JVM option that maps the archive, when there is one and
    ``spark_class_archive`` is on ("" otherwise)."""
    if not settings.spark_class_archive:
        return ""
    path = archive_path(settings)
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path}"


@dataclass(frozen=True)
class Prepared:
    path: Path
    size: int
    seconds: float
    #: False when the archive was there already
    built: bool


#: The training run: a small lake's whole chain, then the JVM's exit (which
#: writes the archive). Run by ``python -c`` in a fresh process.
_TRAINING = """
import sys, tempfile
from pathlib import Path
from lakehouse_assets import progress
progress.configure(0)  # its stage lines, into the log the parent follows
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark import session

settings = Settings()
with tempfile.TemporaryDirectory(prefix="cds-", dir=settings.cache_path) as tmp:
    lake = Lakehouse(str(Path(tmp) / "lake"), journal_url=f"sqlite:///{tmp}/journal.sqlite")
    ds = lake.create_dataset("training")
    sample = Path(session.__file__).parent.parent / "sample" / "entities.ftm.json"
    with sample.open("rb") as fh:
        ds.write_entities(fh, origin="training")
    ds.make()
    ds.compact()
    spark = session.get_spark(settings)
    gateway = spark.sparkContext._gateway
    session.stop_spark()
    proc = gateway.proc
    proc.stdin.close()  # the JVM exits when its stdin closes: the archive is written
    sys.exit(proc.wait(timeout=600))
"""


def prepare(settings: Settings, *, force: bool = False) -> Prepared:
    """Build the archive for this JVM and these jars, unless it exists."""
    clock = time.monotonic()
    path = archive_path(settings)
    if path is None:
        raise ConfigurationError("no java found: install Java 17 (see `make java`)")
    if path.is_file() and not force:
        return Prepared(path, path.stat().st_size, time.monotonic() - clock, False)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    log = path.with_suffix(".log")
    env = _spark_env(settings)
    env["LAKEHOUSE_SPARK_CLASS_ARCHIVE"] = "false"  # train without an old archive
    env["LAKEHOUSE_SPARK_DRIVER_JAVA_OPTIONS"] = (
        f"{settings.spark_driver_java_options} -XX:ArchiveClassesAtExit={partial}"
    )
    progress.stage(
        "spark prepare: 1/3 a training run (a small flush and export on a throw-away lake) "
        "records the classes Spark loads; its log: %s",
        log,
    )
    try:
        with log.open("wb") as out:
            code = _follow(
                subprocess.Popen(
                    [sys.executable, "-c", _TRAINING], env=env, stdout=out, stderr=subprocess.STDOUT
                ),
                log,
                timeout=1200,
            )
        if code != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise ConfigurationError(f"the class archive was not built (exit {code}; see {log})")
        progress.stage(
            "spark prepare: 2/3 the archive is written (%.0f MB); checking that a Spark "
            "start maps it",
            partial.stat().st_size / 1e6,
        )
        problem = check(settings, partial)
        if problem:
            raise ConfigurationError(f"the class archive does not load: {problem} (see {log})")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"identity": _identity()}))
    _remove_outdated(path.parent)
    progress.stage("spark prepare: 3/3 checked, in place: %s", path)
    return Prepared(path, path.stat().st_size, time.monotonic() - clock, True)


#: Seconds between two "still going" lines when the training run says nothing new.
HEARTBEAT = 10.0


def _follow(proc: subprocess.Popen[bytes], log: Path, *, timeout: float) -> int:
    """Wait for the training run, passing on its stage lines from ``log`` as they
    come (``training: flush training: batch 1/1 done``) and, when it says
    nothing for :data:`HEARTBEAT` seconds, that it is still going: a JVM start,
    a flush and an export take minutes on a busy machine, and a silent
    command looks hung. Its exit code (it is killed after ``timeout``)."""
    started = time.monotonic()
    said = started
    offset = 0
    while True:
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        with log.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # whole lines only
        offset += end
        for raw in chunk[:end].decode("utf-8", "replace").splitlines():
            line = raw.strip()
            # the child's stage lines: "  12.3s flush training: ..."
            head, _, rest = line.partition("s ")
            if rest and head.replace(".", "", 1).isdigit():
                progress.stage("spark prepare: training: %s", rest)
                said = time.monotonic()
        if code is not None:
            return code
        now = time.monotonic()
        if now - started > timeout:
            proc.kill()
            proc.wait()
            raise ConfigurationError(f"the training run took over {timeout:.0f} s (see {log})")
        if now - said >= HEARTBEAT:
            progress.stage("spark prepare: training run still going (%.0f s)", now - started)
            said = now


def _remove_outdated(folder: Path) -> None:
    """Remove the archives of Spark installs that are gone or were reinstalled
    (each is about 190 MB); those of other live installs sharing the cache stay."""
    for record in folder.glob("spark-*.json"):
        try:
            identity = json.loads(record.read_text())["identity"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        jars = [entry for entry in identity[1:] if entry.split(":")[0].endswith("/jars")]
        current = True
        for entry in jars:
            where, size, mtime = entry.rsplit(":", 2)
            try:
                stat = Path(where).stat()
            except OSError:
                current = False
                continue
            current = current and f"{stat.st_size}:{stat.st_mtime_ns}" == f"{size}:{mtime}"
        if not current:
            record.with_suffix(".jsa").unlink(missing_ok=True)
            record.with_suffix(".log").unlink(missing_ok=True)
            record.unlink(missing_ok=True)


#: A Spark start that must map the archive: ``-Xshare:on`` makes the JVM
#: refuse to start rather than run without it.
_CHECK = """
from lakehouse_assets.settings import Settings
from lakehouse_assets.spark.session import get_spark
assert get_spark(Settings()).range(3).count() == 3
"""


def check(settings: Settings, path: Path) -> str | None:
    """Why Spark's driver JVM, launched as the lakehouse launches it, cannot map
    the archive at ``path`` (None: it can)."""
    env = _spark_env(settings)
    env["LAKEHOUSE_SPARK_CLASS_ARCHIVE"] = "false"
    env["LAKEHOUSE_SPARK_CONSOLE"] = "true"  # the JVM's refusal on our stderr
    env["LAKEHOUSE_SPARK_DRIVER_JAVA_OPTIONS"] = (
        f"{settings.spark_driver_java_options} -Xshare:on -XX:SharedArchiveFile={path}"
    )
    res = subprocess.run(
        [sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    if res.returncode == 0:
        return None
    lines = [line for line in (res.stderr + res.stdout).splitlines() if "archive" in line]
    return lines[-1].strip() if lines else f"a Spark start failed (exit {res.returncode})"


def _spark_env(settings: Settings) -> dict[str, str]:
    """This process's environment for an in-process Spark with ``settings``' cache."""
    env = {k: v for k, v in os.environ.items() if k != "LAKEHOUSE_SPARK_REMOTE"}
    env["LAKEHOUSE_CACHE_DIR"] = str(settings.cache_path)
    return env
