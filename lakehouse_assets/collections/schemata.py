"""The one check a build makes before it writes: every cluster has a common schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lakehouse_assets.errors import CollectionError

#: How many incompatible clusters an error lists (the count is always given).
SHOWN = 10


def check_clusters(
    rows: Sequence[tuple[str, Sequence[str], Sequence[str]]], collection: str
) -> None:
    """Refuse clusters whose schemata have no common schema (followthemoney's
    ``common_schema``), naming each: a merged entity is never dropped silently.
    ``rows``: each cluster of more than one schema, its sorted schemata and members."""
    from followthemoney import model
    from followthemoney.exc import InvalidData

    bad = []
    for canonical_id, schemata, members in sorted(rows, key=lambda r: r[0]):
        try:
            common: Any = schemata[0]
            for schema in schemata[1:]:
                common = model.common_schema(common, schema)
        except InvalidData:
            bad.append(
                f"{canonical_id} (schemata {', '.join(schemata)}; members {', '.join(members)})"
            )
    if bad:
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise CollectionError(
            f"collection {collection}: {len(bad)} cluster(s) merge entities with no common "
            f"schema: {'; '.join(bad[:SHOWN])}{more}; fix the judgements "
            "(`lakehouse resolver decide A B negative` and remove the positive edge)"
        )
