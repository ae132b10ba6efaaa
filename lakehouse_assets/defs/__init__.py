"""The Dagster layer: assets, checks, sensors, schedules and jobs over the library.

Every module here is thin: the operations (flush, exports, compact, optimize)
live in the library and are the same ones the CLI runs. This layer decides
*when* they run (lineage, automation, sensors, schedules) and records *what*
they did (materializations with metadata, check results).
"""

import warnings

from dagster import BetaWarning, PreviewWarning

# Two of Dagster's APIs we use on purpose carry a notice that repeats at every code
# server and run start (seven blocks): single-run backfills (the runs that share
# one Spark session over many datasets) and partitioned asset checks (one
# freshness verdict per dataset). A third comes from Dagster itself: loading the
# repository copies each of our sensors with its (empty) `owners`, a beta
# parameter, once per sensor. Those notices, matched by their text, are not
# shown; any other beta or preview notice still is.
warnings.filterwarnings(
    "ignore", message=r"Parameter `backfill_policy` of function `asset`", category=BetaWarning
)
warnings.filterwarnings(
    "ignore",
    message=r"Specifying a partitions_def on an AssetCheckSpec",
    category=PreviewWarning,
)
warnings.filterwarnings(
    "ignore",
    message=r"Parameter `owners` of initializer `SensorDefinition.__init__`",
    category=BetaWarning,
)
