"""The error mapping of the command line: every error as one line on stderr.

Our own errors (:class:`LakehouseError`) and those of the libraries the
user's input reaches exit 1, a wrong command line exits 2; arguments and
options that are not UTF-8 text are refused before a command runs. The
click classes here are the root group's and its commands' classes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import click

from lakehouse_assets.errors import LakehouseError


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
    if module in ("pyspark", "py4j"):
        # a Spark task that failed on a module its Python lacks (a cluster's
        # executors): one line naming it instead of Spark's two tracebacks
        from lakehouse_assets.spark.shipping import missing_module

        return missing_module(exc) or executors_lost(exc)
    if module in ("botocore", "boto3", "s3transfer"):
        return f"lake storage (S3): {exc}"
    if isinstance(exc, NotADirectoryError | FileExistsError | IsADirectoryError | PermissionError):
        return f"lake storage: {exc}"
    return None


#: Spark's job abort when a task's attempts all ended with their executor gone
#: (``Task 0 in stage 3.0 failed 4 times, most recent failure: Lost task 0.3 …:
#: ExecutorLostFailure (executor 2 exited caused by one of the running tasks)
#: Reason: Command exited with code 137``)
_EXECUTORS_LOST = re.compile(
    r"failed (\d+) times, most recent failure: [^\n]*?ExecutorLostFailure"
    r"(?: \(([^)\n]*)\))?(?: Reason: ([^\n]*))?"
)


def executors_lost(exc: BaseException) -> str | None:
    """The one line for a Spark job that gave up because its executors kept dying, or None.

    An executor killed under a task (the system's out-of-memory killer, a
    worker stopped, a machine lost) fails the task; Spark runs it again on
    another executor and gives up after ``spark.task.maxFailures`` attempts.
    The step commits only after its Spark jobs succeed (a flush batch, an
    export's files), so the lake holds every earlier commit and nothing of
    the failed step, and the command can simply be run again.
    """
    found = _EXECUTORS_LOST.search(str(exc))
    if found is None:
        return None
    attempts, executor, reason = found.groups()
    last = "; ".join(part.strip().rstrip(".") for part in (executor, reason) if part)
    return (
        f"Spark's executors were lost repeatedly: a task failed {attempts} times, the last "
        f"time with its executor gone{f' ({last})' if last else ''}; check the Spark "
        "workers' memory and logs (an executor killed by the system, or out of memory), "
        "then rerun the command: the lake is consistent"
    )
