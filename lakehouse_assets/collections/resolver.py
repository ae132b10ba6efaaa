"""Canonical ids from judgements, by nomenklatura's rules, over a table of edges.

nomenklatura's ``Resolver`` keeps judgements (``positive``, ``negative``,
``unsure``, ``no_judgement``) between entity ids; what an export applies is
its ``Linker`` (``Resolver.get_linker()``, what zavod's exporters use):

- the clusters are the connected components of the **live positive** edges
  (``deleted_at`` null); negative and unsure edges never cut a cluster: in
  nomenklatura they only keep its tools from proposing a merge, so a negative
  edge inside a cluster (two ids a chain of positives joined anyway) is
  reported here, not applied;
- the canonical id of a cluster is its greatest member by nomenklatura's
  ``Identifier`` order, ``(weight, id)``: a Wikidata QID weighs 3, an
  ``NK-…`` id 2, any other id 1, ties broken by the id's string order. So a
  cluster with a QID is named by it (the greatest, if several), else by its
  greatest ``NK-`` id;
- an id in no cluster is its own canonical id.

The components are found on the driver by union-find over the edges (one
step per edge, never per statement: a resolver holds millions of edges, a
collection billions of statements); the result is a table ``(entity_id,
canonical_id)`` of the ids whose canonical id is another, which the Spark
build joins (:mod:`.build`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
from rigour.ids.wikidata import is_qid

#: nomenklatura's prefix of the canonical ids it makes (``Identifier.PREFIX``).
NK_PREFIX = "NK-"

#: The canonical-id table the build joins: one row per id whose canonical id
#: is another id.
CANONICAL_SCHEMA = pa.schema([("entity_id", pa.string()), ("canonical_id", pa.string())])


def weight(entity_id: str) -> int:
    """nomenklatura's ``Identifier.weight``: QID 3, ``NK-`` 2, any other id 1."""
    if entity_id.startswith(NK_PREFIX):
        return 2
    if is_qid(entity_id):
        return 3
    return 1


def order_key(entity_id: str) -> tuple[int, str]:
    """The order nomenklatura sorts identifiers in (greatest: the canonical id)."""
    return (weight(entity_id), entity_id)


def pair(left: str, right: str) -> tuple[str, str]:
    """``(target, source)`` as nomenklatura's ``Identifier.pair`` orders an edge:
    the greater id is the target."""
    if left == right:
        raise ValueError(f"an edge joins two different ids, not {left!r} with itself")
    return (left, right) if order_key(left) > order_key(right) else (right, left)


@dataclass
class Clusters:
    """The outcome of the judgements: each merged id's canonical id, and what was
    judged but not applied (negative or unsure edges inside a cluster)."""

    canonical: dict[str, str] = field(default_factory=dict)
    #: (target, source, judgement) of blocking edges whose two ids share a cluster
    conflicts: list[tuple[str, str, str]] = field(default_factory=list)

    def get(self, entity_id: str) -> str:
        return self.canonical.get(entity_id, entity_id)

    def members(self) -> dict[str, list[str]]:
        """Each canonical id's members (itself among them when it is an entity id)."""
        out: dict[str, list[str]] = {}
        for member, canon in self.canonical.items():
            out.setdefault(canon, [canon]).append(member)
        return {k: sorted(set(v)) for k, v in sorted(out.items())}

    def table(self) -> pa.Table:
        """:data:`CANONICAL_SCHEMA`, sorted by entity id (byte-stable files)."""
        rows = sorted((m, c) for m, c in self.canonical.items() if m != c)
        return pa.table(
            [
                pa.array([m for m, _ in rows], pa.string()),
                pa.array([c for _, c in rows], pa.string()),
            ],
            schema=CANONICAL_SCHEMA,
        )


def clusters(
    positive: Iterable[tuple[str, str]], blocking: Iterable[tuple[str, str, str]] = ()
) -> Clusters:
    """Connected components of the positive edges, named as nomenklatura names them.

    ``positive``: (target, source) of the live positive edges; ``blocking``:
    (target, source, judgement) of the live negative and unsure ones."""
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        root = node
        while parent[root] != root:
            root = parent[root]
        while parent[node] != root:  # path compression
            parent[node], node = root, parent[node]
        return root

    for left, right in positive:
        parent.setdefault(left, left)
        parent.setdefault(right, right)
        a, b = find(left), find(right)
        if a != b:
            # the root is the greater id: the root of a component is its canonical id
            if order_key(a) < order_key(b):
                a, b = b, a
            parent[b] = a
    result = Clusters({node: find(node) for node in parent})
    for target, source, judgement in blocking:
        if target in parent and source in parent and find(target) == find(source):
            result.conflicts.append((target, source, judgement))
    result.conflicts.sort()
    return result
