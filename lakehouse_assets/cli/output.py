"""Output formatting shared by the commands: JSON lines, sizes, and a result as
JSON for scripts or a short summary for people.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click


def _echo_json(data: Any) -> None:
    """One JSON line (of a stream of them: entities, edges, records)."""
    click.echo(json.dumps(data, default=str))


def _echo_document(data: Any) -> None:
    """One JSON document: indented on a terminal, for a person to read; a single
    line on a pipe or in a file, for ``jq`` and scripts."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(data, default=str, indent=indent))


#: when this module was imported: the process's start where /proc cannot say
_IMPORTED = time.monotonic()


def process_seconds() -> float:
    """Seconds since this process started (the interpreter's own start and the
    imports included), from ``/proc/self/stat`` on Linux: what a person waiting
    for the command counted. Elsewhere, since the CLI was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # the fields after the command's name (in parentheses, may hold spaces);
            # field 22, the start in clock ticks after boot, is the 20th of them
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


def _wall_time(result: Any, started: float) -> None:
    """Make ``result.seconds`` the command's wall time so far and ``result.parts``
    its parts: ``startup`` (the interpreter, imports, options: until the command
    began at ``started``), the result's own parts, and ``other`` (what no part
    names: opening the lake, reading tags, the summary). The parts add up to
    the total."""
    total = process_seconds()
    parts = {"startup": round(started, 3), **result.parts}
    parts["other"] = round(max(total - sum(parts.values()), 0.0), 3)
    result.seconds = total
    result.parts = parts


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
    if isinstance(data.get("graph"), dict):
        lines.append(_graph_line(data["graph"]))
    if isinstance(data.get("seconds"), int | float):
        timed = data.get("parts") or {}
        named = ", ".join(f"{name} {s:.1f}" for name, s in timed.items())
        lines.append(f"took       {data['seconds']:.1f} s" + (f" ({named})" if named else ""))
    return lines


def _report(result: Any, as_json: bool = False) -> None:
    """JSON for scripts (stdout not a terminal, or --json), a short summary for people."""
    data = result.as_dict()
    if as_json or not sys.stdout.isatty():
        _echo_document(data)
        return
    for line in _human(data):
        click.echo(line)


def _graph_line(graph: dict[str, Any]) -> str:
    """``make``'s graph step: what it did to the index, and its time."""
    if graph.get("skipped"):
        return f"graph      index not updated ({graph['skipped']})"
    done = "built" if graph.get("mode") == "rebuild" else "updated"
    return (
        f"graph      index {done}: {graph.get('edges', 0):,} edges "
        f"(+{graph.get('added', 0):,}, -{graph.get('tombstoned', 0):,}) "
        f"in {graph.get('seconds', 0.0):.1f} s"
    )


def print_versions(dataset: str, history: list[dict[str, Any]], as_json: bool) -> None:
    """``lakehouse versions``: the versions' summaries as JSON lines or a table
    (of a local lake or of a server's: the same summaries)."""
    if as_json:
        for info in history:
            _echo_json(info)
        return
    if not history:
        click.echo(f"dataset {dataset} has no published version yet (run make)", err=True)
        return
    click.echo(
        f"{'#':>4}  {'published':<20} {'statements':>10} {'entities':>9}  changes{'':<14} hash"
    )
    for info in history:
        changes = info.get("changes") or {}
        change = " ".join(f"{k.lower()} {v}" for k, v in changes.items()) or "-"
        click.echo(
            f"{info['sequence']:>4}  {str(info['created_at'])[:19]:<20} "
            f"{info.get('live_statements', 0):>10} {info.get('entities') or 0:>9}  "
            f"{change:<21} {str(info['hash'])[:21]}…"
        )
