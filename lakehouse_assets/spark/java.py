"""Spark 4 needs Java 17+; say so in one line instead of a JVM stack trace."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from lakehouse_assets.errors import ConfigurationError

MIN_JAVA = 17
INSTALL_HINT = "install Java 17: apt-get install openjdk-17-jre-headless"


def java_executable() -> str | None:
    """The ``java`` Spark will use (``$JAVA_HOME/bin/java``, else the PATH's), or None."""
    home = os.environ.get("JAVA_HOME")
    exe = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return exe if exe and os.path.exists(exe) else None


def java_version() -> int | None:
    """The major version of the ``java`` Spark will use, or None if absent."""
    exe = java_executable()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> int:
    """Raise ``ConfigurationError`` (one line, with the install command) if Java < 17."""
    version = java_version()
    if version is None:
        raise ConfigurationError(
            f"Spark needs Java {MIN_JAVA}+ but no java was found: {INSTALL_HINT}"
        )
    if version < MIN_JAVA:
        raise ConfigurationError(
            f"Spark needs Java {MIN_JAVA}+ but found Java {version}: {INSTALL_HINT}"
        )
    return version


if __name__ == "__main__":
    import sys

    try:
        print(f"java {require_java()} ok")
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
