"""``moto_server`` whose conditional writes are atomic, as S3's are.

S3 (and MinIO, R2, GCS) decide a ``PutObject`` with ``If-Match`` /
``If-None-Match`` atomically: of two writers presenting the same ETag, one
wins and the other gets 412. moto's threaded server checks the condition and
then stores the object as two steps with Python in between, so two requests
that arrive together can both pass the check (a CI run once saw two holders of
a lock broken by four processes). The lake's locks and delta-rs's commits rely
on the atomic behaviour, so the tests' server must give it: this runs moto's
own server with its object writes and deletes serialised by one lock.

:func:`command` is the command line that starts it (the arguments of ``moto_server``).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def serialise_object_writes() -> None:
    """Wrap moto's object put and delete handlers in one process-wide lock."""
    from moto.s3.responses import S3Response

    lock = threading.Lock()

    def atomic(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                return method(self, *args, **kwargs)

        return wrapper

    for name in ("put_object", "delete_object"):
        setattr(S3Response, name, atomic(getattr(S3Response, name)))


def command(host: str, port: int) -> list[str]:
    """This server's command line: ``-P`` so the working folder shadows nothing."""
    start = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from lakehouse_assets_tests.helpers.moto_atomic import main; main()"
    )
    return [sys.executable, "-P", "-c", start, "-H", host, "-p", str(port)]


def main() -> None:
    from moto.server import main as moto_main

    serialise_object_writes()
    moto_main()


if __name__ == "__main__":
    main()
