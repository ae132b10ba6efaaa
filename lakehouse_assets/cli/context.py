"""What every command shares: the :class:`Context` (settings, the lake opened on
first use, ``-d``), its pass decorator, and the options and input helpers
several command groups use (``--json``, ``--as-of``, ``--input/--origin``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import check_lake_uri

if TYPE_CHECKING:
    # the facade pulls in pyarrow, SQLAlchemy and delta-rs (0.5 s and more):
    # imported when a command opens the lake, not for --version or --help
    from lakehouse_assets.lake import Dataset, Lakehouse
    from lakehouse_assets.server.client import RemoteDataset, RemoteLakehouse

F = TypeVar("F", bound=Callable[..., Any])


class Context:
    """What the commands share: the settings, the lake (opened on first use) and -d."""

    def __init__(
        self,
        settings: Settings,
        dataset: str | None,
        *,
        journal_url: str | None = None,
        tenant: str | None = None,
    ) -> None:
        self.settings = settings
        self.dataset_name = dataset
        self._journal_url = journal_url
        self._tenant = tenant
        self._lake: Lakehouse | None = None
        self._remote: RemoteLakehouse | None = None

    @property
    def remote(self) -> str | None:
        """The server's URL when the lake is an ``http(s)://`` one (a tenant's
        commands then go over HTTP, :mod:`.remote`), else None."""
        uri = self.settings.lake_uri if "lake_uri" in self.settings.model_fields_set else ""
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None

    def remote_dataset(self) -> RemoteDataset:
        """The -d dataset of the server the lake URL names, with ``LAKEHOUSE_TOKEN``."""
        import os

        from lakehouse_assets.server.client import RemoteLakehouse

        if not self.dataset_name:
            raise click.UsageError("this command needs --dataset/-d NAME")
        token = os.environ.get("LAKEHOUSE_TOKEN", "").strip()
        if not token:
            raise click.UsageError(
                f"a lake over HTTP ({self.remote}) needs a token: set LAKEHOUSE_TOKEN to one "
                "the server's operator issued (`lakehouse tokens issue --tenant T --dataset D`)"
            )
        if self._remote is None:
            self._remote = RemoteLakehouse(str(self.remote), token=token)
        return self._remote.dataset(self.dataset_name)

    def open_lake(self, *, create: bool = False) -> Lakehouse:
        """The lake the command line names; a missing local lake is an error unless
        ``create`` (``datasets create``): a read never creates one."""
        if self.remote is not None:
            from lakehouse_assets.cli.remote import not_remote

            raise not_remote(click.get_current_context().command_path, self.remote)
        if self._lake is None:
            if "lake_uri" not in self.settings.model_fields_set:
                raise click.UsageError(
                    "no lake given: pass --lake FOLDER|s3://bucket/prefix, set "
                    "LAKEHOUSE_LAKE_URI, or put LAKEHOUSE_LAKE_URI=… in ./lakehouse.env"
                )
            uri = check_lake_uri(self.settings.lake_uri)
            if not create and not uri.startswith("s3://"):
                folder = Path(uri.removeprefix("file://")).expanduser()
                # a file in the way: the store says so (its error names it)
                blocked = any(p.exists() and not p.is_dir() for p in (folder, *folder.parents))
                if not folder.exists() and not blocked:
                    raise click.ClickException(
                        f"no lake at {folder}: create one with `lakehouse --lake {uri} "
                        "datasets create NAME`, or point --lake at an existing lake"
                    )
            from lakehouse_assets.lake import Lakehouse

            self._lake = Lakehouse(
                settings=self.settings, journal_url=self._journal_url, tenant=self._tenant
            )
        return self._lake

    @property
    def lake(self) -> Lakehouse:
        return self.open_lake()

    def dataset(self) -> Dataset:
        if not self.dataset_name:
            raise click.UsageError("this command needs --dataset/-d NAME")
        return self.lake.dataset(self.dataset_name)


pass_ctx = click.make_pass_decorator(Context)


@contextmanager
def _input(path: str) -> Iterator[tuple[IO[bytes], str]]:
    if path == "-":
        yield sys.stdin.buffer, "<stdin>"
        return
    p = Path(path)
    if not p.is_file():
        raise click.BadParameter(f"no such file: {path}", param_hint="--input/-i")
    with p.open("rb") as fh:
        yield fh, str(p)


def bulk_input_options(help: str) -> Callable[[F], F]:
    """``--input/-i`` (file or - for stdin) and ``--origin/-o`` of bulk writes."""

    def decorate(func: F) -> F:
        func = click.option(
            "--origin",
            "-o",
            default=cv.DEFAULT_ORIGIN,
            show_default=True,
            help="Where the data came from (a partition of the statements table).",
        )(func)
        return click.option("--input", "-i", "path", default="-", show_default=True, help=help)(
            func
        )

    return decorate


JSON_OPTION = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON on stdout even on a terminal (it is JSON whenever stdout is not one).",
)


AS_OF_HELP = (
    "Read a published version: its number, snapshot id, or an ISO 8601 time "
    "(the version published then). See `versions`."
)
