"""The full export pass in DuckDB, on the driver (see :mod:`.full_pass`): the same
statements.csv, entities.ftm.json and statistics.json as Spark's pass, for the
snapshots ``export_engine`` gives it, and the lines of the entities a large
incremental export changed (:mod:`.rows`)."""

from lakehouse_assets.export_duckdb.full_pass import run_pass, takes_pass
from lakehouse_assets.export_duckdb.rows import entity_rows

__all__ = ["entity_rows", "run_pass", "takes_pass"]
