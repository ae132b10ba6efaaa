"""The Dagster layer: assets, checks, sensors, schedules and jobs over the library.

Every module here is thin: the operations (flush, exports, compact, optimize)
live in the library and are the same ones the CLI runs. This layer decides
*when* they run (lineage, automation, sensors, schedules) and records *what*
they did (materializations with metadata, check results).
"""
