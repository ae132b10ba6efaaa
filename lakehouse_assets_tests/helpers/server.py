"""A real ``lakehouse serve`` on 127.0.0.1 (a free port) for the server tests.

Started as a child process from this checkout (``PYTHONPATH`` is the checkout
root, computed from this file, so any clone tests its own code), stopped by
its own process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets.tokens import issue_token
from lakehouse_assets_tests.conftest import free_port, spawn, stop_process

REPO = Path(__file__).resolve().parents[2]
SECRET = "test-secret-" + "s" * 40


@dataclass
class Server:
    url: str
    lake: Lakehouse
    state_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def token(
        self,
        *,
        tenant: str = "tester",
        datasets: tuple[str, ...] = ("*",),
        actions: tuple[str, ...] = ("read", "write", "operate"),
        expires: timedelta = timedelta(hours=1),
    ) -> str:
        return issue_token(
            SECRET, tenant=tenant, datasets=list(datasets), actions=list(actions), expires=expires
        )

    def client(self, token: str | None = None, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120, **kwargs)  # type: ignore[arg-type]


def s3_env(s3_settings: Settings, cache: Path) -> dict[str, str]:
    """The environment a server on the loopback S3 server's lake needs (its endpoint
    and test keys, a cache folder of the test's own)."""
    return {
        "LAKEHOUSE_S3_ENDPOINT_URL": str(s3_settings.s3_endpoint_url),
        "LAKEHOUSE_S3_ACCESS_KEY_ID": "testing",
        "LAKEHOUSE_S3_SECRET_ACCESS_KEY": "testing",
        "LAKEHOUSE_CACHE_DIR": str(cache),
    }


@contextmanager
def running_server(
    lake: Lakehouse, state_dir: Path, *, workers: int = 1, port: int | None = None, **env: str
) -> Iterator[Server]:
    """``lakehouse serve`` over ``lake`` (``--workers``; on ``port``, else a free one)
    until the block ends."""
    port = port or free_port()
    log = state_dir / "server.log"
    # no Dagster instance unless the test names one (make test exports DAGSTER_HOME)
    environ = {
        **{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        "PYTHONPATH": str(REPO),
        "LAKEHOUSE_API_SECRET": SECRET,
        "LAKEHOUSE_API_STATE_DIR": str(state_dir),
        **env,
    }
    args = [
        sys.executable,
        "-m",
        "lakehouse_assets.cli",
        "--lake",
        lake.store.uri,
        "--journal-url",
        lake.settings.resolved_journal_url(),
        "serve",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with log.open("wb") as out:
        proc = spawn(args, env=environ, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {proc.returncode} before answering /health: "
                    f"{log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server (pid {proc.pid}) did not answer /health within 60 s: "
                    f"{log.read_text()[-3000:]}"
                )
            time.sleep(0.1)
        yield Server(url, lake, state_dir, log, proc)
    finally:
        stop_process(proc)
