"""The one Dagster ``Definitions`` object of the project (loaded by workspace.yaml).

The dataset-partitioned asset graph (archive → journal → statements + translog
→ exports → index), its checks, sensors and schedules are added by the Dagster
layer in ``lakehouse_assets/defs``; until then this code location is empty.
"""

import dagster as dg

defs = dg.Definitions()
