"""``lakehouse serve``: the app on uvicorn, with request ids in its log lines.

The lake, journal and tenant of the command line reach the worker processes
through their ``LAKEHOUSE_*`` variables (each worker builds its app with
:func:`~lakehouse_assets.server.app.create_app` from the environment). The
secret is checked before anything starts: without it the command fails with
one line naming ``LAKEHOUSE_API_SECRET``. SIGTERM or Ctrl-C stops accepting
connections, lets the open requests and the running operation finish (up to
``GRACE_SECONDS``), cancels the queued operations, then exits.
"""

from __future__ import annotations

import os
from typing import Any, Final

from lakehouse_assets.settings import Settings
from lakehouse_assets.tokens import server_secret

GRACE_SECONDS: Final = 30
LOG_FORMAT: Final = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging: one format with the request id, uvicorn's access log off
    (the app logs each request itself, without its query string)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "lakehouse_assets.server.app.RequestIdFilter"}},
        "formatters": {"plain": {"format": LOG_FORMAT}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "filters": ["request_id"],
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "lakehouse_assets": {
                "handlers": ["stderr"],
                "level": level.upper(),
                "propagate": False,
            },
        },
    }


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    log_level: str = "info",
) -> None:
    """Run the server until it is stopped (blocks)."""
    import uvicorn

    server_secret(settings)  # refuse to start without one
    env = {
        "LAKEHOUSE_LAKE_URI": settings.lake_uri,
        "LAKEHOUSE_JOURNAL_URL": settings.resolved_journal_url(),
        "LAKEHOUSE_TENANT": settings.tenant,
    }
    os.environ.update(env)
    uvicorn.run(
        "lakehouse_assets.server.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=log_config(log_level),
        access_log=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
        server_header=False,
    )
