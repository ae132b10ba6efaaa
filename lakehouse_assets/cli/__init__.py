"""``lakehouse``: the command line over the tenant API (:mod:`lake`).

Every error is one line on stderr: errors the lakehouse raises on purpose
name the dataset, file and line, with exit code 1; a wrong command line
(unknown option, missing argument, bad value) says what and where to look,
with exit code 2. Nothing half-written stays behind.

The package holds the root group and ``main`` (:mod:`.root`), what the
commands share (:mod:`.context`), the error mapping (:mod:`.errors`), the
output formatting (:mod:`.output`) and one module per command group; those
are imported here so that their commands register on the root group.
Heavy libraries (Spark, followthemoney) are imported inside the commands
that need them, so that ``lakehouse status`` and ``--version`` start fast.
"""

from lakehouse_assets.cli import (  # noqa: F401  (importing them registers their commands)
    archive,
    build,
    collections,
    config,
    datasets,
    graph,
    ingest,
    queue,
    reads,
    server,
    sharing,
    spark,
    status,
    versions,
    writes,
)
from lakehouse_assets.cli.root import cli, main

__all__ = ["cli", "main"]
