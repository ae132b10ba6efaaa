"""Deterministic benchmark data: ../shared/data/kek.ftm.json scaled up.

Each replica gives every entity a new id (sha1 of replica number and the
original id) and rewrites entity references to the replica's ids, so the
graph stays consistent at any scale. Replica 0 keeps the original ids.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
from followthemoney import model

HERE = Path(__file__).resolve().parent
KEK = HERE.parent.parent / "shared" / "data" / "kek.ftm.json"
KEK_STATEMENTS = 25_776  # statements of one replica (ids + property values)


def _new_id(replica: int, entity_id: str) -> str:
    if replica == 0:
        return entity_id
    return hashlib.sha1(f"{replica}:{entity_id}".encode()).hexdigest()


def scaled_entities(statements: int, source: Path = KEK) -> Iterator[bytes]:
    """FtM JSON lines with about ``statements`` statements in total."""
    if not source.exists():
        sys.exit(f"benchmark data needs {source} (the shared/ folder beside the checkout)")
    base = [orjson.loads(line) for line in source.read_bytes().splitlines() if line.strip()]
    refs: dict[str, set[str]] = {}
    for schema in model.schemata.values():
        refs[schema.name] = {p.name for p in schema.properties.values() if p.type.name == "entity"}
    replicas = max(1, round(statements / KEK_STATEMENTS))
    for replica in range(replicas):
        for ent in base:
            props = dict(ent.get("properties", {}))
            for prop in refs.get(ent["schema"], ()):
                if prop in props:
                    props[prop] = [_new_id(replica, v) for v in props[prop]]
            yield (
                orjson.dumps(
                    {
                        "id": _new_id(replica, ent["id"]),
                        "schema": ent["schema"],
                        "properties": props,
                    }
                )
                + b"\n"
            )


def write(path: Path, statements: int) -> Path:
    """Write the scaled file once (cached by size in the name)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            for line in scaled_entities(statements):
                fh.write(line)
        tmp.replace(path)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("statements", type=int, help="approximate number of statements")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    write(args.out, args.statements)
    print(args.out)
