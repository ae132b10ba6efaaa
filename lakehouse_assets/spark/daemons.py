"""Files and probes of the Spark daemons we start (the Connect server, the
standalone cluster's master and workers): the quiet log4j configuration, a
private folder for their secrets, a Java properties file, a port probe.

Shared by :mod:`.connect` and :mod:`.cluster`, below both, so neither imports
the other for them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.settings import Settings

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


def log4j_config(settings: Settings) -> Path:
    """The quiet log4j2 configuration file (written once into the cache folder)."""
    path = settings.cache_path / "log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(LOG4J)
        os.replace(tmp, path)
    return path


def _private_dir(path: Path) -> Path:
    """``path`` as a folder that this user owns and no one else can enter.

    The cache folder may be shared (or planted by another user): a folder that
    is a symlink or someone else's would let them read the token or swap the
    server's files, so it is refused rather than used."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"{path} is not a folder of this user (uid {os.geteuid()}): the Spark Connect "
            "server keeps its token there; remove it or choose another LAKEHOUSE_CACHE_DIR"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def _write_properties(path: Path, confs: dict[str, str]) -> None:
    lines = [f"{_escape(key)}={_escape(value)}\n" for key, value in confs.items()]
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.writelines(lines)


def _escape(text: str) -> str:
    """``text`` escaped for a Java properties file: every character but letters,
    digits and ``._-/,+@%`` as ``\\uXXXX`` (UTF-16 units), so no key or value can
    end its line, start a comment or lose a backslash."""
    out = []
    for char in text:
        if char.isascii() and (char.isalnum() or char in "._-/,+@%"):
            out.append(char)
        else:
            raw = char.encode("utf-16-be")
            out.extend(f"\\u{raw[i : i + 2].hex()}" for i in range(0, len(raw), 2))
    return "".join(out)


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
