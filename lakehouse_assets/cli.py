"""``lakehouse``: the command line over the tenant API (:mod:`lake`).

Every error is one line on stderr: errors the lakehouse raises on purpose
name the dataset, file and line, with exit code 1; a wrong command line
(unknown option, missing argument, bad value) says what and where to look,
with exit code 2. Nothing half-written stays behind.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO, TypeVar

import click
from tqdm import tqdm

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError, LakehouseError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import MAX_RETENTION_HOURS, Settings
from lakehouse_assets.storage import check_lake_uri

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

    def open_lake(self, *, create: bool = False) -> Lakehouse:
        """The lake the command line names; a missing local lake is an error unless
        ``create`` (``datasets create``): a read never creates one."""
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


def one_line(message: str) -> str:
    """Messages of other libraries may span lines (YAML, SQL): fold them into one."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


def _undecodable(value: object) -> str | None:
    """A str (or one in a tuple) that cannot be UTF-8 text, shown safely; else None.

    An argument or environment value that is not valid UTF-8 reaches Python
    with each bad byte as a lone surrogate (``$'\\xff'`` -> ``'\\udcff'``); no
    id, name or path of the lake can hold one, and handing it on makes
    whatever encodes it first (SQLite, DuckDB, a file name) raise.
    """
    for item in value if isinstance(value, tuple | list) else (value,):
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return ascii(item if len(item) <= 60 else item[:60] + "…")
    return None


def check_text_params(ctx: click.Context) -> None:
    """Refuse, naming the argument or option, any parsed value that is not UTF-8 text."""
    for param in ctx.command.params:
        shown = _undecodable(ctx.params.get(param.name or ""))
        if shown is not None:
            raise click.BadParameter(
                f"{shown} is not valid UTF-8 text (a byte such as \\xff on its own)",
                ctx=ctx,
                param=param,
            )


class LakehouseCommand(click.Command):
    """A command whose arguments are checked to be UTF-8 text before it runs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        check_text_params(ctx)
        return rest


class LakehouseSubGroup(click.Group):
    """A group under ``lakehouse`` (``datasets``, ``archive``...): its options and
    commands are checked the same way; errors are handled by the root group."""

    command_class = LakehouseCommand
    group_class = type

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        check_text_params(ctx)
        return rest


class LakehouseGroup(click.Group):
    """Every error as one line on stderr: exit 1 for bad input, 2 for a bad command line."""

    #: the commands and groups under it check their arguments (UTF-8 text)
    command_class = LakehouseCommand
    group_class = LakehouseSubGroup

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        check_text_params(ctx)
        return rest

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"Error: {one_line(exc.format_message())}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"Error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if ctx.params.get("debug") or isinstance(exc, click.ClickException | click.Abort):
                raise
            message = user_error(exc)
            if message is None:
                raise
            click.echo(f"Error: {one_line(message)}", err=True)
            sys.exit(1)


def user_error(exc: BaseException) -> str | None:
    """The one line to print for an error the user can fix (None: a bug, show it).

    Our own errors say what to fix; errors of the libraries we hand the user's
    input to (ftmq filters, the journal URL and database, the lake's storage)
    are named by where they came from.
    """
    if isinstance(exc, LakehouseError):
        return str(exc)
    if isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str):
        # a lone surrogate: undecodable bytes of an argument, a setting or a file
        # name that reached a library by another way than a checked argument
        bad = exc.object[exc.start : exc.end]
        return f"{ascii(bad)} in {ascii(exc.object[:60])} is not valid UTF-8 text"
    kind = type(exc)
    module = kind.__module__.split(".")[0]
    if module == "ftmq":
        return f"invalid query: {exc}"
    if module == "sqlalchemy":
        return f"journal database: {exc.args[0] if exc.args else exc}"
    if module in ("botocore", "boto3", "s3transfer"):
        return f"lake storage (S3): {exc}"
    if isinstance(exc, NotADirectoryError | FileExistsError | IsADirectoryError | PermissionError):
        return f"lake storage: {exc}"
    return None


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


@click.group(cls=LakehouseGroup)
@click.option(
    "--lake",
    "lake_uri",
    envvar="LAKEHOUSE_LAKE_URI",
    help="Lake URI: folder or s3://bucket/prefix.",
)
@click.option("--journal-url", envvar="LAKEHOUSE_JOURNAL_URL", help="Journal SQLAlchemy URL.")
@click.option(
    "--tenant", envvar="LAKEHOUSE_TENANT", help="Tenant name (namespaces tags and locks)."
)
@click.option("--dataset", "-d", "dataset", help="Dataset name.")
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="-v: the lakehouse's own log (step timings) and Spark's JVM output on stderr; "
    "-vv: debug logs. Progress lines are shown either way.",
)
@click.version_option(package_name="lakehouse_assets", prog_name="lakehouse")
@click.pass_context
def cli(
    ctx: click.Context,
    lake_uri: str | None,
    journal_url: str | None,
    tenant: str | None,
    dataset: str | None,
    debug: bool,
    verbose: int,
) -> None:
    """An FtM data lakehouse: archive, journal, Delta statements, exports."""
    if lake_uri is not None and not lake_uri.strip():
        raise click.BadParameter(
            "an empty lake URI: give a folder or s3://bucket/prefix", param_hint="--lake"
        )
    from lakehouse_assets import progress

    progress.configure(verbose)
    settings = Settings()
    if verbose:
        settings = settings.model_copy(update={"spark_console": True})
    if lake_uri is not None:
        settings = settings.model_copy(update={"lake_uri": lake_uri})
        settings.model_fields_set.add("lake_uri")
    ctx.obj = Context(settings, dataset, journal_url=journal_url, tenant=tenant)


# --- datasets ---------------------------------------------------------------


@cli.group()
def datasets() -> None:
    """List and create datasets."""


@datasets.command("list")
@pass_ctx
def datasets_list(obj: Context) -> None:
    """Print the datasets of the lake, one per line.

    \b
    Example:
      lakehouse --lake ./lake datasets list
    """
    for name in obj.lake.datasets():
        click.echo(name)


@datasets.command("create")
@click.argument("name")
@click.option("--title", help="Human-readable title.")
@click.option("--summary", help="One-paragraph summary.")
@pass_ctx
def datasets_create(obj: Context, name: str, title: str | None, summary: str | None) -> None:
    """Create a dataset (idempotent).

    \b
    Example:
      lakehouse --lake ./lake datasets create my_dataset --title "My dataset"
    """
    ds = obj.open_lake(create=True).create_dataset(name, title=title, summary=summary)
    click.echo(f"created {ds.name} in {obj.lake.store.uri}", err=True)


# --- archive ----------------------------------------------------------------


@cli.group()
def archive() -> None:
    """Source files: add, get, cat, ls, delete, and their extracted text."""


@archive.command("add")
@click.argument("uris", nargs=-1, required=True)
@click.option("--checksum", help="Expected SHA-256 (verified; mismatch stores nothing).")
@click.option("--file-id", help="Explicit metadata id (single file only).")
@click.option(
    "--document/--no-document", default=False, help="Also write a Document entity to the journal."
)
@click.option(
    "--follow-symlinks", is_flag=True, help="Archive the target of a local path that is a symlink."
)
@pass_ctx
def archive_add(
    obj: Context,
    uris: tuple[str, ...],
    checksum: str | None,
    file_id: str | None,
    document: bool,
    follow_symlinks: bool,
) -> None:
    """Archive files from paths or file://, s3://, http(s):// URIs.

    \b
    Example:
      lakehouse -d my_dataset archive add report.pdf --document
      lakehouse -d my_dataset archive add s3://bucket/leak/ https://example.org/a.csv
    """
    ds = obj.dataset()
    if (checksum or file_id) and len(uris) > 1:
        raise click.UsageError("--checksum and --file-id apply to a single file")
    for uri in uris:
        meta = ds.add_file(
            uri,
            checksum=checksum,
            file_id=file_id,
            create_document=document,
            follow_symlinks=follow_symlinks,
        )
        click.echo(meta.model_dump_json())


@archive.command("get")
@click.argument("checksum")
@pass_ctx
def archive_get(obj: Context, checksum: str) -> None:
    """Print a file's metadata as JSON (CHECKSUM: the SHA-256 or a unique prefix).

    \b
    Example:
      lakehouse -d my_dataset archive get 3f2a9c01b7d4
    """
    archive = obj.dataset().archive
    click.echo(archive.get(archive.resolve(checksum)).model_dump_json(indent=2))


@archive.command("cat")
@click.argument("checksum")
@pass_ctx
def archive_cat(obj: Context, checksum: str) -> None:
    """Stream a file's content to stdout (CHECKSUM: the SHA-256 or a unique prefix).

    \b
    Example:
      lakehouse -d my_dataset archive cat 5f1c0a2b9e3d > report.pdf   (a unique prefix will do)
    """
    archive = obj.dataset().archive
    with archive.open(archive.resolve(checksum)) as fh:
        shutil.copyfileobj(fh, sys.stdout.buffer, 1024 * 1024)


@archive.command("ls")
@pass_ctx
def archive_ls(obj: Context) -> None:
    """List file metadata as JSON lines.

    \b
    Example:
      lakehouse -d my_dataset archive ls
    """
    for meta in obj.dataset().archive.list():
        click.echo(meta.model_dump_json())


@archive.command("delete")
@click.argument("file_id")
@click.option("--checksum", help="The blob's checksum (faster lookup).")
@pass_ctx
def archive_delete(obj: Context, file_id: str, checksum: str | None) -> None:
    """Delete one metadata entry (the blob stays).

    \b
    Example:
      lakehouse -d my_dataset archive delete report.pdf
    """
    archive = obj.dataset().archive
    meta = archive.delete(file_id, checksum=archive.resolve(checksum) if checksum else None)
    click.echo(f"deleted {meta.file_id} ({meta.key})", err=True)


# --- entities and statements --------------------------------------------------


@cli.group()
def entities() -> None:
    """Write and delete entities."""


@entities.command("write")
@bulk_input_options("FtM JSON lines file or - for stdin.")
@pass_ctx
def entities_write(obj: Context, path: str, origin: str) -> None:
    """Validate and write FtM entities (one JSON object per line); all or nothing.

    \b
    Example:
      lakehouse -d my_dataset entities write -i entities.ftm.json --origin crawl
      cat entities.ftm.json | lakehouse -d my_dataset entities write -i -
    """
    ds = obj.dataset()
    with (
        _input(path) as (fh, source),
        tqdm(unit=" lines", desc=f"{ds.name}", file=sys.stderr, disable=None) as bar,
    ):
        bulk = ds.write_entities(fh, origin=origin, source=source, progress=bar.update)
    click.echo(
        f"wrote {bulk.entities} entities, {bulk.count} statements to {ds.name} "
        f"(write {bulk.write.write_id} by tenant {bulk.write.tenant})",
        err=True,
    )


@entities.command("delete")
@click.argument("entity_ids", nargs=-1, required=True)
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@pass_ctx
def entities_delete(obj: Context, entity_ids: tuple[str, ...], origin: str | None) -> None:
    """Tombstone all statements of entities.

    \b
    Example:
      lakehouse -d my_dataset entities delete own-omar-acme --origin crawl
    """
    ds = obj.dataset()
    for entity_id in entity_ids:
        n = ds.delete_entity(entity_id, origin=origin)
        click.echo(f"{entity_id}: {n} statements tombstoned", err=True)


@cli.group()
def statements() -> None:
    """Write statements in followthemoney's CSV format."""


@statements.command("write")
@bulk_input_options("Statement CSV file or - for stdin.")
@pass_ctx
def statements_write(obj: Context, path: str, origin: str) -> None:
    """Validate and write statements (followthemoney CSV); all or nothing.

    \b
    Example:
      lakehouse -d my_dataset statements write -i statements.csv
    """
    from lakehouse_assets.entities import read_statements_csv

    ds = obj.dataset()
    with (
        _input(path) as (fh, source),
        ds.bulk(origin) as bulk,
        tqdm(unit=" statements", desc=ds.name, file=sys.stderr, disable=None) as bar,
    ):
        for stmt in read_statements_csv(fh, dataset=ds.name, origin=bulk.origin, source=source):
            bulk.add_statement(stmt)
            bar.update()
    click.echo(
        f"wrote {bulk.count} statements to {ds.name} "
        f"(write {bulk.write.write_id} by tenant {bulk.write.tenant})",
        err=True,
    )


# --- tags -------------------------------------------------------------------


@cli.group()
def tags() -> None:
    """Freshness tags."""


@tags.command("ls")
@click.option(
    "--tenant",
    default=cv.LAKEHOUSE_TENANT,
    show_default=True,
    help="Whose tags (the lakehouse's own: the core freshness tags).",
)
@pass_ctx
def tags_ls(obj: Context, tenant: str) -> None:
    """Print a tenant's tags as ``key<TAB>timestamp``.

    \b
    Example:
      lakehouse -d my_dataset tags ls --tenant my_app
    """
    for key, ts in obj.dataset().tags(tenant).items():
        click.echo(f"{key}\t{ts.isoformat()}")


@cli.command("unlock")
@click.option(
    "--operation",
    default=None,
    help="Clear the tenant's operation lock locks/{tenant}/OPERATION instead of the "
    "dataset's .LOCK (the lock of every table writer).",
)
@pass_ctx
def unlock_cmd(obj: Context, operation: str | None) -> None:
    """Clear a lock whose holder is gone.

    Refuses while the holder is alive on this host. The lock's generation
    moves on, so a holder still running elsewhere can no longer commit.

    \b
    Example:
      lakehouse -d my_dataset unlock                  (the dataset's .LOCK)
      lakehouse -d my_dataset unlock --operation export
    """
    ds = obj.dataset()
    # `--operation ''` is an (invalid) operation name, not "no operation": it must
    # never fall through to the dataset's .LOCK
    lock = ds.operation_lock(operation) if operation is not None else ds.lock()
    click.echo(lock.force_release())


@cli.command("jobs")
@click.argument("job_type", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON lines (the whole records).")
@pass_ctx
def jobs_ls(obj: Context, job_type: str | None, as_json: bool) -> None:
    """Without JOB_TYPE: the job types with recorded runs and their counts.
    With it: its recorded runs, oldest first: state, start, duration, counts.

    \b
    Example:
      lakehouse -d my_dataset jobs          # flush  12 runs, last 2026-11-24T01:02:03Z ...
      lakehouse -d my_dataset jobs flush
      lakehouse -d my_dataset jobs optimize --json | jq .stats
    """
    from lakehouse_assets.jobs import list_runs

    ds = obj.dataset()
    if job_type is None:
        base = cv.dataset_path(ds.name, "jobs", "runs")
        types = obj.lake.store.list_dirs(base)
        if not types:
            click.echo(f"no job runs recorded in dataset {ds.name!r} yet", err=True)
        for name in sorted(types):
            runs = list_runs(obj.lake.store, ds.name, name)
            last = max((r.started_at.isoformat(timespec="seconds") for r in runs), default="-")
            if as_json:
                _echo_json({"job_type": name, "runs": len(runs), "last_started": last})
            else:
                click.echo(f"{name:<12} {len(runs):>5} runs  last {last}")
        return
    runs = list_runs(obj.lake.store, ds.name, job_type)
    if not runs:
        click.echo(f"no {job_type!r} runs recorded in dataset {ds.name!r}", err=True)
    elif not as_json:
        click.echo(f"{'state':<10} {'started (UTC)':<20} {'seconds':>8}  {'tenant':<12} counts")
    for run in runs:
        if as_json:
            click.echo(json.dumps(run.model_dump(mode="json")))
            continue
        seconds = (
            f"{(run.finished_at - run.started_at).total_seconds():.1f}"
            if run.finished_at is not None
            else "-"
        )
        counts = ", ".join(
            f"{k} {v}"
            for k, v in run.stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and v and k != "seconds"
        )
        state = run.status if run.error is None else f"{run.status}: {one_line(run.error)[:60]}"
        click.echo(
            f"{run.status:<10} {run.started_at.strftime('%Y-%m-%d %H:%M:%S'):<20} "
            f"{seconds:>8}  {run.tenant:<12} {counts or '-'}"
            + (f"  ({state})" if run.error else "")
        )


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@pass_ctx
def status_cmd(obj: Context, as_json: bool) -> None:
    """What a dataset holds and what is stale: journal rows waiting, table
    versions, each export's freshness (and why), the last job runs, the lock.

    Reads only (no flush, no Spark).

    \b
    Example:
      lakehouse -d my_dataset status
    """
    from lakehouse_assets.freshness import freshness
    from lakehouse_assets.jobs import list_runs

    ds = obj.dataset()
    pending = ds.journal.count(ds.name)
    snapshot = ds.snapshot()
    main = ds.statements_table.table()
    exports = {kind: state.as_dict() for kind, state in freshness(ds, pending).items()}
    jobs: dict[str, dict[str, Any]] = {}
    for name in sorted(ds.store.list_dirs(cv.dataset_path(ds.name, "jobs", "runs"))):
        runs = list_runs(ds.store, ds.name, name)
        if runs:
            last = max(runs, key=lambda r: r.started_at)
            jobs[name] = {
                "runs": len(runs),
                "last": last.started_at.isoformat(timespec="seconds"),
                "status": last.status,
            }
    state = ds.lock().state()
    lock = f"held: {state.describe()}" if state.held else state.problem or "free"
    # the tenants' operation locks (locks/{tenant}/{operation}): those held now
    operations = {}
    for path in ds.store.list(cv.dataset_path(ds.name, cv.LOCKS) + "/"):
        tenant, operation = path.split("/")[-2:]
        try:
            held = ds.operation_lock(operation, tenant=tenant).state()
        except LakehouseError:  # not a lock file (a name no lock would have)
            continue
        if held.held:
            operations[f"{tenant}/{operation}"] = held.describe()
    head = ds.version()
    latest = main.version() if main is not None else None
    queue_invalid = ds.queue.invalid()
    report = {
        "dataset": ds.name,
        "journal_pending": pending,
        "queue_pending": ds.queue.pending_count(),
        "queue_invalid": queue_invalid,
        "statements_version": {"published": snapshot.statements.version, "latest": latest},
        "translog_version": snapshot.translog.version,
        "version": None if head is None else {"sequence": head.sequence, "hash": head.hash},
        "exports": exports,
        "jobs": jobs,
        "lock": lock,
        "operation_locks": operations,
    }
    if as_json:
        _echo_json(report)
        return
    click.echo(f"dataset {ds.name}")
    click.echo(f"  journal: {pending} rows waiting for a flush")
    click.echo(f"  queue: {report['queue_pending']} actions waiting")
    for invalid in queue_invalid:
        click.echo(f"  queue: never consumed: {invalid['folder']} ({invalid['error']})")
    click.echo(
        f"  statements table: v{snapshot.statements.version} published"
        f" (latest v{latest}); translog v{snapshot.translog.version}"
    )
    if head is not None:
        click.echo(f"  published: version {head.sequence} ({head.hash[:21]}…)")
    for kind, info in exports.items():
        mark = "fresh" if info["fresh"] else "stale"
        click.echo(f"  {kind:<11} {mark:<6} {info['why']}")
    for name, info in jobs.items():
        click.echo(
            f"  job {name:<10} {info['runs']:>4} runs, last {info['last']} ({info['status']})"
        )
    click.echo(f"  lock: {lock}")
    for name, holder in operations.items():
        click.echo(f"  lock {name}: held: {holder}")


# --- data plane ---------------------------------------------------------------


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str))


@cli.command("crawl")
@click.argument("uri")
@click.option("--prefix", default=None, help="Only files under this path of the source.")
@click.option("--glob", default=None, help="Only files matching this pattern (e.g. '*.pdf').")
@click.option("--exclude", default=None, help="Leave out files matching this pattern.")
@click.option(
    "--skip-existing/--no-skip-existing",
    default=True,
    show_default=True,
    help="Skip files archived by an earlier crawl of the same source.",
)
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Also archive files that symlinks in the source point at outside it "
    "(skipped and listed by default).",
)
@pass_ctx
def crawl_cmd(
    obj: Context,
    uri: str,
    prefix: str | None,
    glob: str | None,
    exclude: str | None,
    skip_existing: bool,
    follow_symlinks: bool,
) -> None:
    """Archive every matching file under URI (folder, file:// or s3://), one Document each.

    Prints the crawl's statistics as JSON; files that failed are listed with
    their reason (and in the job record) and do not stop the crawl.

    \b
    Example:
      lakehouse -d my_dataset crawl ./documents --glob '*.pdf'
      lakehouse -d my_dataset crawl s3://bucket/leak/ --prefix 2024/
    """
    from lakehouse_assets.crawl import crawl

    ds = obj.dataset()
    with tqdm(unit=" files", desc=f"crawl {ds.name}", file=sys.stderr, disable=None) as bar:
        result = crawl(
            ds,
            uri,
            prefix=prefix,
            glob=glob,
            exclude=exclude,
            skip_existing=skip_existing,
            follow_symlinks=follow_symlinks,
            progress=bar.update,
        )
    _echo_json({**result.as_dict(), "errors": result.errors})


@cli.group()
def mapping() -> None:
    """Mappings of archived CSVs to FtM entities."""


@mapping.command("add")
@click.argument("csv_checksum")
@click.argument("mapping_yaml", type=click.Path(exists=True, dir_okay=False))
@pass_ctx
def mapping_add(obj: Context, csv_checksum: str, mapping_yaml: str) -> None:
    """Validate and store MAPPING_YAML for the archived CSV with CSV_CHECKSUM.

    \b
    Example:
      lakehouse -d my_dataset mapping add 7dd93923 mapping.yml   (the archived CSV's checksum)
    """
    from pathlib import Path

    ds = obj.dataset()
    checksum = ds.archive.resolve(csv_checksum)  # a unique prefix will do
    stored = ds.add_mapping(checksum, Path(mapping_yaml).read_text("utf-8"))
    state = "stored" if stored.changed else "unchanged"
    click.echo(f"{state}: {stored.path} ({stored.queries} queries)", err=True)


@mapping.command("ls")
@pass_ctx
def mapping_ls(obj: Context) -> None:
    """The stored mappings as JSON lines.

    \b
    Example:
      lakehouse -d my_dataset mapping ls
    """
    for item in obj.dataset().mappings():
        click.echo(json.dumps(item))


@mapping.command("process")
@click.argument("csv_checksum")
@click.option("--force", is_flag=True, help="Map again even if the result is fresh.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "spark", "local"]),
    default="auto",
    show_default=True,
    help="Spark for big CSVs (auto), or force one.",
)
@pass_ctx
def mapping_process(obj: Context, csv_checksum: str, force: bool, engine: str) -> None:
    """Map the archived CSV into the journal (origin mapping:CSV_CHECKSUM).

    \b
    Example:
      lakehouse -d my_dataset mapping process 7dd93923 --force
    """
    spark = None if engine == "auto" else engine == "spark"
    ds = obj.dataset()
    checksum = ds.archive.resolve(csv_checksum)  # a unique prefix will do
    _echo_json(ds.process_mapping(checksum, force=force, spark=spark).as_dict())


JSON_OPTION = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON on stdout even on a terminal (it is JSON whenever stdout is not one).",
)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _human(data: dict[str, Any]) -> list[str]:
    """A result as a few lines for a person: counts, what was written, the time."""
    lines = []
    written = data.get("written") or {}
    for kind, done in written.items():
        if not isinstance(done, dict):
            continue
        version = done.get("version") or {}
        if kind == "index" and version.get("sequence"):
            lines.append(f"published  version {version['sequence']}  {version.get('hash', '')}")
        elif kind == "index" and version.get("skipped"):
            lines.append(f"index.json kept ({version['skipped']})")
        else:
            rows = done.get("rows")
            unit = "statements" if kind == "statements" else "entities"
            count = f"{rows:>12,} {unit}" if isinstance(rows, int) else ""
            lines.append(
                f"written    {done.get('path', kind):<28}{count}  {_size(done.get('size', 0))}"
            )
    for kind in data.get("skipped") or []:
        lines.append(f"fresh      {kind} (kept)")
    flushed = data.get("flushed")
    counts = flushed if isinstance(flushed, dict) else data
    parts = [
        f"{counts[k]:,} {k.replace('_', ' ')}"
        for k in (
            "journal_rows",
            "new",
            "duplicates",
            "tombstones",
            "superseded",
            "ignored_tombstones",
            "live",
            "removed_translog",
            "files_removed",
            "files_added",
            "vacuumed",
        )
        if isinstance(counts.get(k), int)
    ]
    if parts:
        lines.insert(0, ("flushed    " if flushed else "") + ", ".join(parts))
    if data.get("pending"):
        lines.append(f"pending    {data['pending']:,} journal rows (another writer held the lock)")
    if isinstance(data.get("seconds"), int | float):
        lines.append(f"took       {data['seconds']:.1f} s")
    return lines


def _report(result: Any, as_json: bool = False) -> None:
    """JSON for scripts (stdout not a terminal, or --json), a short summary for people."""
    data = result.as_dict()
    if as_json or not sys.stdout.isatty():
        _echo_json(data)
        return
    for line in _human(data):
        click.echo(line)


@cli.command("flush")
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1000),
    default=None,
    help="Journal rows per batch (at least 1000; default LAKEHOUSE_FLUSH_BATCH_ROWS).",
)
@JSON_OPTION
@pass_ctx
def flush_cmd(obj: Context, batch_rows: int | None, as_json: bool) -> None:
    """Move the journal into the Delta tables; prints what was done (JSON for scripts).

    \b
    Example:
      lakehouse -d my_dataset flush
    """
    _report(obj.dataset().flush(batch_rows=batch_rows), as_json)


@cli.command("compact")
@JSON_OPTION
@pass_ctx
def compact_cmd(obj: Context, as_json: bool) -> None:
    """Apply the translog to the main table (drop deleted rows).

    \b
    Example:
      lakehouse -d my_dataset compact
    """
    _report(obj.dataset().compact(), as_json)


@cli.command("optimize")
@click.option("--vacuum", is_flag=True, help="Also delete files no version needs any more.")
@click.option(
    "--retention-hours",
    type=click.IntRange(min=0, max=MAX_RETENTION_HOURS),
    default=None,
    help="vacuum retention (default LAKEHOUSE_VACUUM_RETENTION_HOURS, 168).",
)
@JSON_OPTION
@pass_ctx
def optimize_cmd(obj: Context, vacuum: bool, retention_hours: int | None, as_json: bool) -> None:
    """Merge small Parquet files (and optionally vacuum).

    \b
    Example:
      lakehouse -d my_dataset optimize --vacuum --retention-hours 168
    """
    _report(obj.dataset().optimize(vacuum=vacuum, retention_hours=retention_hours), as_json)


EXPORT_KINDS = ("statements", "entities", "statistics", "index")


AS_OF_HELP = (
    "Read a published version: its number, snapshot id, or an ISO 8601 time "
    "(the version published then). See `versions`."
)


@cli.command("export")
@click.argument("kinds", nargs=-1, type=click.Choice([*EXPORT_KINDS, "all"]))
@click.option("--force", is_flag=True, help="Export even when the export is fresh.")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Writes one export to -o.")
@click.option(
    "--output",
    "-o",
    type=click.File("wb"),
    default="-",
    help="With --as-of: where to write the export (default: stdout).",
)
@JSON_OPTION
@pass_ctx
def export_cmd(
    obj: Context,
    kinds: tuple[str, ...],
    force: bool,
    as_of: str | None,
    output: IO[bytes],
    as_json: bool,
) -> None:
    """Write exports (default: all) unless they are fresh.

    With --as-of, re-make one export (statements, entities or statistics) of an
    earlier published version from the tables as they were then.

    \b
    Examples:
      lakehouse -d my_dataset export statements entities
      lakehouse -d my_dataset export statements --as-of 3 -o statements-v3.csv
    """
    if as_of is not None:
        if len(kinds) != 1 or kinds[0] not in ("statements", "entities", "statistics"):
            raise click.UsageError("--as-of writes one export: statements, entities or statistics")
        obj.dataset().export_as_of(as_of, kinds[0], output)
        return
    chosen = list(EXPORT_KINDS) if not kinds or "all" in kinds else list(kinds)
    _report(obj.dataset().export(chosen, force=force), as_json)


@cli.command("make")
@click.option("--force", is_flag=True, help="Re-export even fresh exports.")
@JSON_OPTION
@pass_ctx
def make_cmd(obj: Context, force: bool, as_json: bool) -> None:
    """Flush if needed, then every export that is not fresh.

    \b
    Example:
      lakehouse -d my_dataset make
    """
    _report(obj.dataset().make(force=force), as_json)


@cli.command("get")
@click.argument("entity_id")
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@click.option(
    "--flush/--no-flush",
    default=False,
    show_default=True,
    help="Flush the journal first, so unflushed writes are seen.",
)
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@pass_ctx
def get_cmd(
    obj: Context, entity_id: str, origin: str | None, flush: bool, as_of: str | None
) -> None:
    """Print one entity as FtM JSON (exit 1 if it does not exist).

    \b
    Example:
      lakehouse -d my_dataset get acme-holding
      lakehouse -d my_dataset get acme-holding --as-of 1
    """
    ds = obj.dataset()
    entity = ds.get_entity(entity_id, origin=origin, flush=flush, as_of=as_of)
    if entity is None:
        raise click.ClickException(f"no entity {entity_id!r} in dataset {ds.name!r}")
    _echo_json(entity.to_dict())


@cli.command("query")
@click.option("--id", "entity_ids", multiple=True, help="Entity id (repeatable).")
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@click.option("--schema", "-s", "schemata", multiple=True, help="FtM schema (repeatable).")
@click.option(
    "--prop",
    "-p",
    "props",
    multiple=True,
    help="PROPERTY=VALUE filter (repeatable, all must match).",
)
@click.option(
    "--flush/--no-flush",
    default=True,
    show_default=True,
    help="Flush the journal first (waits at most LAKEHOUSE_READ_WAIT_SECONDS for a writer).",
)
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Never flushes.")
@pass_ctx
def query_cmd(
    obj: Context,
    entity_ids: tuple[str, ...],
    origin: str | None,
    schemata: tuple[str, ...],
    props: tuple[str, ...],
    flush: bool,
    as_of: str | None,
) -> None:
    """Print matching entities as FtM JSON lines (filters are ftmq queries).

    \b
    Example:
      lakehouse -d my_dataset query -s Company -p country=de
      lakehouse -d my_dataset query --id acme-holding --no-flush
    """
    from ftmq.query import P, Query

    q: Query | None = None
    if props:
        q = Query()
        for item in props:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise click.BadParameter(
                    f"expected PROPERTY=VALUE, got {item!r}", param_hint="--prop"
                )
            q = q.where(P(**{key: value}))
    for entity in obj.dataset().query(
        q,
        entity_ids=list(entity_ids) or None,
        origin=origin,
        schemata=list(schemata) or None,
        flush=flush,
        as_of=as_of,
    ):
        _echo_json(entity.to_dict())


@cli.command("stream")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@pass_ctx
def stream_cmd(obj: Context, as_of: str | None) -> None:
    """Print the entities of the last entities.ftm.json export (or of a version).

    \b
    Example:
      lakehouse -d my_dataset stream | jq -r .caption
    """
    for data in obj.dataset().stream_entities(as_of=as_of):
        _echo_json(data)


# --- graph --------------------------------------------------------------------


@cli.command("refs")
@click.argument("entity_id")
@click.option(
    "--in", "direction", flag_value="in", default=True, help="Who points at it (default)."
)
@click.option("--out", "direction", flag_value="out", help="What it points at.")
@click.option("--both", "direction", flag_value="both", help="Both directions.")
@click.option("--prop", "props", multiple=True, help="Only this property (repeatable).")
@click.option(
    "--schema", "-s", "schemata", multiple=True, help="Only other entities of this schema."
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines even on a terminal.")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Scans that version.")
@pass_ctx
def refs_cmd(
    obj: Context,
    entity_id: str,
    direction: str,
    props: tuple[str, ...],
    schemata: tuple[str, ...],
    as_json: bool,
    as_of: str | None,
) -> None:
    """The edges at an entity, from the graph index (no Spark): its id, schema and
    caption for the entity at the other end.

    \b
    Examples:
      lakehouse -d my_dataset refs acme-trading            (who points at it)
      lakehouse -d my_dataset refs anna-schmidt --out --prop owner
    """
    from lakehouse_assets import graph

    ds = obj.dataset()
    edges = graph.refs(
        ds,
        entity_id,
        direction=direction,
        props=list(props) or None,
        schemata=list(schemata) or None,
        as_of=as_of,
    )
    if not edges:
        click.echo(f"no edges at {entity_id!r} in dataset {ds.name!r}", err=True)
        return
    if as_json or not sys.stdout.isatty():
        for edge in edges:
            _echo_json(edge)
        return
    for edge in edges:
        arrow = "←" if edge["direction"] == "in" else "→"
        caption = edge["other_caption"] or "(not in this dataset)"
        click.echo(
            f"{arrow} {edge['prop']:<14} {edge['other_id']:<42} "
            f"{edge['other_schema'] or '-':<14} {caption}"
        )


@cli.command("neighbours")
@click.argument("entity_id")
@click.option(
    "--depth", type=click.IntRange(min=0, max=5), default=1, show_default=True, help="Hops."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many entities.",
)
@pass_ctx
def neighbours_cmd(obj: Context, entity_id: str, depth: int, limit: int) -> None:
    """The network around an entity (itself first), breadth first over edges in both
    directions, as FtM JSON lines.

    \b
    Example:
      lakehouse -d my_dataset neighbours acme-trading --depth 2 --limit 50
    """
    from lakehouse_assets import graph

    for data in graph.neighbours(obj.dataset(), entity_id, depth=depth, limit=limit):
        _echo_json(data)


@cli.group("graph")
def graph_group() -> None:
    """The graph index: edges of entity-typed statements, both ways."""


@graph_group.command("update")
@pass_ctx
def graph_update(obj: Context) -> None:
    """Bring the index up to the tables (builds it the first time).

    \b
    Example:
      lakehouse -d my_dataset graph update
    """
    from lakehouse_assets import graph

    _echo_json(graph.update(obj.dataset()).as_dict())


@graph_group.command("rebuild")
@pass_ctx
def graph_rebuild(obj: Context) -> None:
    """Build the index from scratch (folds tombstones in).

    \b
    Example:
      lakehouse -d my_dataset graph rebuild
    """
    from lakehouse_assets import graph

    _echo_json(graph.rebuild(obj.dataset()).as_dict())


@graph_group.command("export")
@click.option("--force", is_flag=True, help="Write even when the graph exports are fresh.")
@click.option(
    "--ftm-cypher",
    type=click.File("w"),
    default=None,
    help="Instead: write exactly what `ftm export-cypher` writes to this file ('-': stdout).",
)
@pass_ctx
def graph_export(obj: Context, force: bool, ftm_cypher: TextIO | None) -> None:
    """graph.cypher (batched), graph.graphml and Neo4j bulk CSVs of the entities export.

    \b
    Examples:
      lakehouse -d my_dataset graph export
      lakehouse -d my_dataset graph export --ftm-cypher graph-ftm.cypher
    """
    from lakehouse_assets.graph import exports as graph_exports

    ds = obj.dataset()
    if ftm_cypher is not None:
        graph_exports.write_cypher(ds, ftm_cypher, ftm_compatible=True)
        return
    _echo_json(graph_exports.export_graph(ds, force=force))


@graph_group.command("status")
@pass_ctx
def graph_status(obj: Context) -> None:
    """What the index reflects and whether that is current; edge counts.

    \b
    Example:
      lakehouse -d my_dataset graph status
    """
    from lakehouse_assets import graph

    _echo_json(graph.status(obj.dataset()))


# --- versions -----------------------------------------------------------------


@cli.command("versions")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@pass_ctx
def versions_cmd(obj: Context, as_json: bool) -> None:
    """The published versions of a dataset, oldest first: time, counts, logical
    hash, what changed (entities added / modified / deleted).

    \b
    Example:
      lakehouse -d my_dataset versions
    """
    ds = obj.dataset()
    history = ds.versions()
    if as_json:
        for version in history:
            _echo_json(version.summary())
        return
    if not history:
        click.echo(f"dataset {ds.name} has no published version yet (run make)", err=True)
        return
    click.echo(
        f"{'#':>4}  {'published':<20} {'statements':>10} {'entities':>9}  changes{'':<14} hash"
    )
    for version in history:
        info = version.summary()
        changes = info["changes"] or {}
        change = " ".join(f"{k.lower()} {v}" for k, v in changes.items()) or "-"
        click.echo(
            f"{info['sequence']:>4}  {info['created_at'][:19]:<20} "
            f"{info.get('live_statements', 0):>10} {info.get('entities') or 0:>9}  "
            f"{change:<21} {info['hash'][:21]}…"
        )


@cli.command("trace")
@click.argument("key")
@pass_ctx
def trace_cmd(obj: Context, key: str) -> None:
    """Where statements came from: an entity id (all its statements) or a statement id
    (exit 1 if there is none).

    One JSON line per statement: its values, origin and what the origin names
    (the archived file, the mapping, the crawl runs), first_seen / last_seen /
    deleted_at, the tenant and journal write that first wrote it and that last
    wrote or deleted it, and the versions that published and removed it.

    \b
    Example:
      lakehouse -d my_dataset trace 5f1c…   (an entity or statement id)
    """
    ds = obj.dataset()
    found = ds.trace(key)
    if not found:  # a typo must not look like success to a script: exit 1
        raise click.ClickException(f"no statements for id {key!r} in dataset {ds.name!r}")
    for item in found:
        _echo_json(item)


@cli.command("verify")
@click.option(
    "--deep", is_flag=True, help="Also recompute the head's logical hash from the tables."
)
@click.option(
    "--head",
    "trusted_head",
    default=None,
    help="A head hash you trust (say, one published elsewhere): the chain must end in it.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@pass_ctx
def verify_cmd(obj: Context, deep: bool, trusted_head: str | None, as_json: bool) -> None:
    """Check the version chain and re-hash what it references; exit 1 on any problem.

    Replays the chain (sequence, parent hashes, times, latest.json), checks
    the Delta commits that carry each version's hash (the newest must be the
    head: a rolled-back version is caught) and the log entries it hashed,
    re-hashes data files, the published index.json and diffs of every version,
    the head's exports, the graph index and the catalog entry. Every file the
    tables read now must be covered by the head or added by a lakehouse commit
    after it (a note until make); a commit no lakehouse operation made is a
    problem. --deep recomputes the logical hash from the tables.

    \b
    Examples:
      lakehouse -d my_dataset verify
      lakehouse -d my_dataset verify --deep --head f1220…
    """
    report = obj.dataset().verify(deep=deep, trusted_head=trusted_head)
    if as_json:
        _echo_json(report.as_dict())
    else:
        for note in report.notes:
            click.echo(f"note: {note}", err=True)
        for problem in report.problems:
            click.echo(f"FAILED {report.dataset}: {problem}", err=True)
        if report.ok:
            mb = report.bytes_hashed / 1e6
            click.echo(
                f"ok: {report.dataset}: {report.versions} versions, head {report.head}, "
                f"{report.files_hashed} files ({mb:.1f} MB) hashed"
                + (", logical hash recomputed" if deep else "")
            )
    if not report.ok:
        sys.exit(1)


# --- the local Spark Connect server ----------------------------------------------


@cli.group("spark")
def spark_group() -> None:
    """The local Spark Connect server: one warm Spark for every command.

    \b
    Example:
      lakehouse spark start
      export LAKEHOUSE_SPARK_REMOTE=sc://127.0.0.1:15002
      lakehouse -d my_dataset make      # no JVM start: runs on the server
      lakehouse spark stop
    """


PORT_OPTION = click.option(
    "--port",
    type=click.IntRange(1024, 65535),
    default=None,
    help="Port on 127.0.0.1 (default LAKEHOUSE_SPARK_CONNECT_PORT, 15002).",
)


def _server_line(info: Any) -> str:
    if not info.running:
        return f"Spark Connect server on port {info.port}: not running" + (
            f" ({info.note})" if info.note else ""
        )
    if info.stale_code:
        return f"Spark Connect server running at {info.url} (pid {info.pid}), {info.note}"
    return (
        f"Spark Connect server running at {info.url} (pid {info.pid}, log {info.log}); "
        f"use it: export LAKEHOUSE_SPARK_REMOTE={info.url}"
    )


@spark_group.command("start")
@PORT_OPTION
@pass_ctx
def spark_start(obj: Context, port: int | None) -> None:
    """Start the local server (bound to 127.0.0.1) and wait until it answers.

    Does nothing if it is already running. Its PID file, log and token live
    under LAKEHOUSE_CACHE_DIR/spark-connect/PORT/: the server admits only
    clients with its token (a file only its user can read); the lakehouse's
    clients of the same user and LAKEHOUSE_CACHE_DIR find it themselves.

    \b
    Example:
      lakehouse spark start --port 15002
    """
    from lakehouse_assets.spark import connect

    click.echo(_server_line(connect.start(obj.settings, port)))


@spark_group.command("prepare")
@click.option("--force", is_flag=True, help="Build it again even if it exists.")
@pass_ctx
def spark_prepare(obj: Context, force: bool) -> None:
    """Build the JVM's class archive of Spark, once per install: every Spark
    start after it (in-process, or the local server) loads its classes from
    the archive, about 3 s faster. The Makefile's java step (make demo, test,
    ui) runs it; it takes about a minute and about 190 MB under
    LAKEHOUSE_CACHE_DIR/jvm/.

    \b
    Example:
      lakehouse spark prepare
    """
    from lakehouse_assets.spark import cds

    done = cds.prepare(obj.settings, force=force)
    verb = "built and checked" if done.built else "already there"
    click.echo(
        f"class archive {verb}: {done.path} ({done.size / 1e6:.0f} MB, {done.seconds:.1f} s)"
    )


@spark_group.command("stop")
@PORT_OPTION
@pass_ctx
def spark_stop(obj: Context, port: int | None) -> None:
    """Stop the local server by its PID (SIGTERM, then SIGKILL after 30 s).

    \b
    Example:
      lakehouse spark stop
    """
    from lakehouse_assets.spark import connect

    info = connect.stop(obj.settings, port)
    click.echo(f"Spark Connect server on port {info.port}: {info.note}")


@spark_group.command("status")
@PORT_OPTION
@pass_ctx
def spark_status(obj: Context, port: int | None) -> None:
    """Say whether the local server runs (exit 1 if not); a stale PID file is removed.

    \b
    Example:
      lakehouse spark status
    """
    from lakehouse_assets.spark import connect

    info = connect.status(obj.settings, port)
    click.echo(_server_line(info))
    if not info.running:
        sys.exit(1)


# --- extracted text -----------------------------------------------------------


@archive.group("text")
def archive_text() -> None:
    """Text extracted from archived files, one per engine: put, get, ls."""


def _read_utf8(path: str, dataset: str) -> str:
    """A text file (or stdin for -) as a string; InvalidInputError if it is not UTF-8."""
    if path == "-":
        data, source = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.is_file():
            raise click.BadParameter(f"no such file: {path}", param_hint="FILE")
        data, source = p.read_bytes(), str(p)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"not UTF-8 ({exc.reason} at byte {exc.start}): extracted text must be UTF-8",
            dataset=dataset,
            source=source,
        ) from None


ENGINE_OPTION = click.option(
    "--engine",
    "-e",
    required=True,
    help="The extraction engine (tika, ocr, pdftotext...): the text is stored as {ENGINE}.txt.",
)


@archive_text.command("put")
@click.argument("checksum")
@click.argument("path", default="-", required=False, metavar="[FILE|-]")
@ENGINE_OPTION
@pass_ctx
def archive_text_put(obj: Context, checksum: str, path: str, engine: str) -> None:
    """Store the text ENGINE extracted from an archived file (UTF-8, from FILE or stdin).

    CHECKSUM is the file's SHA-256 or a unique prefix; the engine's earlier
    text is replaced.

    \b
    Example:
      lakehouse -d my_dataset archive text put 3f2a9c01b7d4 --engine tika report.txt
      pdftotext report.pdf - | lakehouse -d my_dataset archive text put 3f2a9c01b7d4 -e pdftotext
    """
    ds = obj.dataset()
    text = _read_utf8(path, ds.name)
    full = ds.archive.put_text(checksum, engine, text)
    click.echo(f"stored {len(text):,} characters of {engine} text for {full}", err=True)


@archive_text.command("get")
@click.argument("checksum")
@ENGINE_OPTION
@pass_ctx
def archive_text_get(obj: Context, checksum: str, engine: str) -> None:
    """Print the text ENGINE extracted from an archived file.

    \b
    Example:
      lakehouse -d my_dataset archive text get 3f2a9c01b7d4 --engine tika > report.txt
    """
    click.echo(obj.dataset().archive.get_text(checksum, engine), nl=False)


@archive_text.command("ls")
@click.argument("checksum")
@JSON_OPTION
@pass_ctx
def archive_text_ls(obj: Context, checksum: str, as_json: bool) -> None:
    """The engines that have text for an archived file, with its size.

    \b
    Example:
      lakehouse -d my_dataset archive text ls 3f2a9c01b7d4
    """
    ds = obj.dataset()
    full = ds.archive.resolve(checksum)
    rows: list[dict[str, Any]] = [
        {
            "checksum": full,
            "engine": engine,
            "bytes": ds.store.size(cv.archive_text(ds.name, full, engine)),
        }
        for engine in ds.archive.texts(full)
    ]
    if as_json or not sys.stdout.isatty():
        for row in rows:
            _echo_json(row)
        return
    if not rows:
        click.echo(f"no extracted text for {full}", err=True)
        return
    click.echo(f"{'engine':<24} {'size':>10}")
    for row in rows:
        click.echo(f"{row['engine']:<24} {_size(row['bytes']):>10}")


# --- catalog config.yml ---------------------------------------------------------


def _hide_password(url: str | None) -> str | None:
    if not url:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@cli.group("config")
def config_group() -> None:
    """The lake's catalog config.yml."""


@config_group.command("show")
@JSON_OPTION
@pass_ctx
def config_show(obj: Context, as_json: bool) -> None:
    """Print the catalog config.yml and the settings it fills, with where each
    value comes from: argument > environment > config.yml > default.

    An invalid config.yml is an error naming the file and the problem.

    \b
    Example:
      lakehouse --lake ./lake config show
    """
    from lakehouse_assets.catalog import CatalogConfig

    lake = obj.lake
    config = lake.catalog_config or CatalogConfig()
    shown = config.model_dump(mode="json")
    shown["journal_url"] = _hide_password(shown["journal_url"])
    effective = {
        "journal_url": _hide_password(lake.settings.resolved_journal_url()),
        "vacuum_retention_hours": lake.settings.vacuum_retention_hours,
    }
    sources = {
        name: {"value": value, "source": lake.setting_sources.get(name, "default")}
        for name, value in effective.items()
    }
    report = {
        "path": lake.store.full_uri(cv.CATALOG_CONFIG),
        "exists": lake.catalog_config is not None,
        "config": shown,
        "effective": sources,
    }
    if as_json or not sys.stdout.isatty():
        _echo_json(report)
        return
    click.echo(f"catalog config  {report['path']}" + ("" if report["exists"] else " (none yet)"))
    click.echo(f"  name          {config.name}")
    click.echo(f"  title         {config.title or '-'}")
    for name, value in sorted(config.dataset_defaults.items()):
        click.echo(f"  dataset default {name}: {json.dumps(value, default=str)}")
    for name, info in sources.items():
        click.echo(f"  {name:<24} {info['value']}  ({info['source']})")


# --- queue ----------------------------------------------------------------------


@cli.group("queue")
def queue_group() -> None:
    """Queued actions of tenants on entities and files: push, ls, consume."""


@queue_group.command("push")
@click.argument("action", type=click.Choice(["UPSERT", "DELETE"], case_sensitive=False))
@click.argument("resource", type=click.Choice(["entity", "file"], case_sensitive=False))
@click.argument("payload", default="-", required=False, metavar="[PAYLOAD_JSON|-]")
@pass_ctx
def queue_push(obj: Context, action: str, resource: str, payload: str) -> None:
    """Queue an action as the tenant of --tenant; print the item as JSON.

    \b
    Payloads (JSON; - reads stdin):
      UPSERT entity  an FtM entity, or {"entity": {...}, "origin": "..."}
      DELETE entity  {"entity_id": "...", "origin": "..."}   (origin optional)
      UPSERT file    {"uri": "path|s3://|https://", "checksum"?, "key"?, "document"?: true}
      DELETE file    {"file_id": "...", "checksum"?: "..."}

    \b
    Example:
      lakehouse --tenant my_app -d my_dataset queue push UPSERT entity \\
        '{"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}}'
      echo '{"uri": "s3://bucket/a.pdf"}' | lakehouse -d my_dataset queue push UPSERT file -
    """
    ds = obj.dataset()
    source = "<stdin>" if payload == "-" else None
    text = payload
    if payload == "-":
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"payload is not UTF-8 ({exc.reason} at byte {exc.start})",
                dataset=ds.name,
                source=source,
            ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"payload is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            dataset=ds.name,
            source=source,
        ) from None
    item = ds.queue.push(action, resource, data)
    click.echo(item.model_dump_json())
    click.echo(
        f"queued {item.action} {item.resource} {item.summary()} as {item.tenant}/{item.id}",
        err=True,
    )


@queue_group.command("ls")
@click.option("--tenant", "tenant", default=None, help="Only this tenant's items (default: all).")
@click.option(
    "--all", "show_all", is_flag=True, help="Also the items done and those set aside as failed."
)
@JSON_OPTION
@pass_ctx
def queue_ls(obj: Context, tenant: str | None, show_all: bool, as_json: bool) -> None:
    """The queue's pending items in the order they will be applied (UUID7: time).

    \b
    Example:
      lakehouse -d my_dataset queue ls
      lakehouse -d my_dataset queue ls --tenant my_app --all --json | jq .error
    """
    ds = obj.dataset()
    entries = ds.queue.list(tenant, state="all" if show_all else "pending")
    if as_json or not sys.stdout.isatty():
        for entry in entries:
            _echo_json(entry.as_dict())
        return
    if not entries:
        click.echo(
            f"the queue of {ds.name} is empty" + (" (pending)" if not show_all else ""), err=True
        )
        return
    click.echo(f"{'id':<36}  {'tenant':<14} {'state':<8} {'action':<7} {'resource':<8} subject")
    for entry in entries:
        info = entry.as_dict()
        subject = info["subject"] or ""
        if entry.error:
            subject = f"{subject}  ({one_line(entry.error)[:80]})".strip()
        click.echo(
            f"{entry.id:<36}  {entry.tenant:<14} {entry.state:<8} {info['action'] or '?':<7} "
            f"{info['resource'] or '?':<8} {subject}"
        )


@queue_group.command("consume")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Apply at most this many items."
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for another consumer of this dataset to finish.",
)
@JSON_OPTION
@pass_ctx
def queue_consume(obj: Context, limit: int | None, wait: float, as_json: bool) -> None:
    """Apply the pending items of every tenant now, in UUID7 order, each exactly once.

    Bad items are set aside (queue/_failed/) and reported; an error that may
    pass (an unreachable source) stops before its item, which stays pending
    (exit 1).

    \b
    Example:
      lakehouse -d my_dataset queue consume
    """
    result = obj.dataset().queue.consume(limit=limit, wait=wait)
    data = result.as_dict()
    if as_json or not sys.stdout.isatty():
        _echo_json(data)
    else:
        click.echo(
            f"applied {result.applied}, recovered {result.recovered}, "
            f"failed {len(result.failed)}, pending {result.remaining} ({result.seconds:.1f} s)"
        )
    for failed in result.failed:
        click.echo(f"failed {failed['tenant']}/{failed['id']}: {failed['error']}", err=True)
    for invalid in result.invalid:
        click.echo(f"invalid {invalid['folder']}: {invalid['error']}", err=True)
    if result.stopped:
        raise click.ClickException(
            f"the queue stopped at {result.stopped}; the item stays pending: consume again later"
        )


def main() -> None:
    try:
        cli(prog_name="lakehouse")
    except SystemExit as done:
        exit_without_teardown(done.code)
        raise


def exit_without_teardown(code: object) -> None:
    """End the process as ``sys.exit(code)`` would, but skip the interpreter's teardown.

    After a command CPython clears every module and collects what they held:
    about 0.45 s of a warm kek export's 3 s, CPU time after the last exit
    handler (followthemoney's model, pandas, pyarrow, gRPC; seen with strace).
    The exit handlers still run (logging's flush, temporary folders, the
    in-process Spark's stop, multiprocessing's), and the standard streams are
    flushed; only the teardown is skipped. While another non-daemon thread
    runs this returns, and the caller exits the usual way, which waits for it.
    """
    import atexit
    import os
    import threading

    first = threading.main_thread()
    if any(t is not first and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, exit 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: 120, as CPython's own exit
            if stream is sys.stdout and status == 0:
                status = 120
    os._exit(status)


if __name__ == "__main__":
    main()
