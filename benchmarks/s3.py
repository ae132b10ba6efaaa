"""A loopback S3 server for the benchmarks that run on S3 (``moto_server``, as the tests use)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from lakehouse_assets import Settings
from lakehouse_assets.storage import s3_client


@contextlib.contextmanager
def moto_server() -> Iterator[Settings]:
    """A loopback moto_server (stopped by its PID): the settings that reach it."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("moto_server not installed: pip install 'moto[server]'")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("moto_server did not start") from None
                time.sleep(0.1)
        yield Settings(
            s3_endpoint_url=f"http://127.0.0.1:{port}",
            s3_access_key_id="testing",
            s3_secret_access_key="testing",
            s3_region="us-east-1",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def new_bucket(settings: Settings) -> str:
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3_client(settings).create_bucket(Bucket=bucket)
    return bucket
