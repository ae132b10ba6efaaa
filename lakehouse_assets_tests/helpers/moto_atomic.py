"""``moto_server`` whose conditional writes are atomic, as S3's are.

S3 (and MinIO, R2, GCS) decide a ``PutObject`` with ``If-Match`` /
``If-None-Match`` atomically: of two writers presenting the same ETag, one
wins and the other gets 412. moto's threaded server checks the condition and
then stores the object as two steps with Python in between, so two requests
that arrive together can both pass the check (a CI run once saw two holders of
a lock broken by four processes). The lake's locks and delta-rs's commits rely
on the atomic behaviour, so the tests' server must give it: this runs moto's
own server with its object writes and deletes serialised by one lock.

It also lists moto's services once, and finds a host's service once: moto's
dispatcher does both on every request (``backends.list_of_moto_modules``: a
``listdir`` of its package and a ``stat`` of each of its ~200 entries; then
about 80 URL patterns): the listing alone a fifth of the server's CPU in an S3
test of the suite (cProfile: 1.08M ``stat`` calls for 5,907 requests; the
test 55-61 -> 46-52 s).

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


def list_services_once() -> None:
    """Make moto's list of its service modules a constant (the package's folder
    does not change while the server runs), and each host's service."""
    from moto import backends

    services = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: services
    # and which service a host name means: its answer is fixed by the host (about 80
    # URL patterns tried on every request)
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    find = DomainDispatcherApplication.get_backend_for_host
    found: dict[str | None, Any] = {}

    def backend_for_host(self: Any, host: str | None) -> Any:
        if host not in found:
            found[host] = find(self, host)
        return found[host]

    DomainDispatcherApplication.get_backend_for_host = backend_for_host  # type: ignore[method-assign]


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
    list_services_once()
    moto_main()


if __name__ == "__main__":
    main()
