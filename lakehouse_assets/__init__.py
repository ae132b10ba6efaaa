"""An FtM data lakehouse as a Dagster asset graph, with Spark for the heavy work.

The public surface for tenants is :class:`Lakehouse` and :class:`Dataset`.

The names are imported on first use (PEP 562): Spark's Python workers import
this package to unpickle a task's function, and the public surface pulls in
followthemoney, SQLAlchemy and delta-rs, 0.2 GB and a second per worker that
its task may never touch.

The layers, top to bottom: a module imports only from the layers below its own
(imports under ``TYPE_CHECKING``, for annotations, aside). ``make lint`` checks
this with import-linter (the contract in ``setup.cfg``, ``[importlinter]``):

1. entry points: :mod:`.definitions` (Dagster's code location), over the CLI
   (:mod:`.cli`) and the Dagster assets, jobs and checks (:mod:`.defs`), over
   the HTTP server and its remote client (:mod:`.server`, which ``lakehouse
   serve`` starts);
2. the facade: :mod:`.lake` (:class:`Lakehouse`, :class:`Dataset`), which
   composes the operations and decides what a read sees (a flush first, or a
   published version);
   then :mod:`.collections` (a collection's tables built from its leaves and
   judgements, then published by the operations below);
3. operations, each on the :class:`~.context.DatasetContext` the facade hands
   it (a ``Dataset`` is one): :mod:`.exports`, :mod:`.maintenance`;
   :mod:`.versions`; :mod:`.mappings`, :mod:`.queue` (which replays tenant
   actions through the operations below it); :mod:`.crawl` (archiving files);
   :mod:`.graph`, :mod:`.freshness`; :mod:`.flush`, the reads (:mod:`.query`,
   which never flush), :mod:`.ingest`; then :mod:`.bulk`, the journal's bulk
   writer;
4. the dataset's parts: :mod:`.context` (what an operation needs of a dataset,
   built from the parts below); :mod:`.catalog`, :mod:`.archive`, :mod:`.spark`;
   :mod:`.sources`, :mod:`.reduce`, :mod:`.journal_duckdb`, :mod:`.staging`;
   :mod:`.access`, :mod:`.tables` (the Delta tables), :mod:`.locks`,
   :mod:`.tags`, :mod:`.jobs`, :mod:`.entities`, :mod:`.queue_ledger` (the
   queue's table in the journal's database, which it creates on first use),
   :mod:`.tokens` (the tenant API's tokens, below the server and the sharing
   routes that both read them);
5. storage: :mod:`.journal`, :mod:`.storage`; :mod:`.journal_sqlite`, :mod:`.journal_rows`;
6. ground: :mod:`.conventions` (the lake's layout), :mod:`.settings`,
   :mod:`.bounded`, :mod:`.faults`, :mod:`.progress`, :mod:`.preload`; then
   :mod:`.journal_urls`; then :mod:`.errors`.

Imports that run back up are listed in the contract's ``ignore_imports``, each
with its reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_assets.bulk import BulkWriter
    from lakehouse_assets.errors import LakehouseError
    from lakehouse_assets.lake import Dataset, Lakehouse
    from lakehouse_assets.settings import Settings

__all__ = ["BulkWriter", "Dataset", "Lakehouse", "LakehouseError", "Settings"]

_HOMES = {
    "BulkWriter": "lakehouse_assets.bulk",
    "Dataset": "lakehouse_assets.lake",
    "Lakehouse": "lakehouse_assets.lake",
    "LakehouseError": "lakehouse_assets.errors",
    "Settings": "lakehouse_assets.settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
