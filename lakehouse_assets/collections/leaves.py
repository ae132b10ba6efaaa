"""A collection's leaves: the datasets its ``children`` name, nested collections resolved.

A collection is a dataset whose ``config.yml`` has ``children`` (followthemoney's
``DatasetModel``; OpenSanctions' ``default`` is one). A child may itself be a
collection; its statements are those of its leaves, so the tree is walked down
to the datasets that hold statements. A child that does not exist, or a child
that is its own ancestor, stops the walk with :class:`CollectionError` naming
the collection's config file: a typo must not quietly publish a smaller
collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import load_dataset_config
from lakehouse_assets.errors import CollectionError

if TYPE_CHECKING:
    from lakehouse_assets.storage import Store


def children(store: Store, name: str) -> list[str]:
    """The ``children`` of a dataset's config.yml, sorted and validated as names
    (a set in followthemoney's model; sorted so every walk and listing has one order)."""
    raw = load_dataset_config(store, name).get("children") or []
    where = store.full_uri(cv.dataset_path(name, cv.CONFIG))
    if not isinstance(raw, list | tuple | set):
        raise CollectionError(f"{where}: children must be a list of dataset names")
    names = []
    for child in raw:
        try:
            names.append(cv.dataset_name(child))
        except ValueError as exc:
            raise CollectionError(f"{where}: children: {exc}") from None
    return sorted(set(names))


def is_collection(store: Store, name: str) -> bool:
    """Whether the dataset is a collection (its config.yml names children)."""
    return bool(children(store, name))


def leaves(store: Store, name: str) -> list[str]:
    """The datasets holding the collection's statements, sorted: its children,
    with each child that is a collection replaced by its own leaves.

    A collection with no children is no collection (an error, not an empty
    export); a missing child or a cycle is an error naming the config file."""
    found: set[str] = set()
    _walk(store, cv.dataset_name(name), (), found)
    return sorted(found)


def _walk(store: Store, name: str, ancestors: tuple[str, ...], found: set[str]) -> None:
    where = store.full_uri(cv.dataset_path(name, cv.CONFIG))
    kids = children(store, name)
    if not ancestors and not kids:
        raise CollectionError(f"{where}: dataset {name!r} has no children; it is not a collection")
    for child in kids:
        if child == name or child in ancestors:
            path = " -> ".join((*ancestors, name, child))
            raise CollectionError(f"{where}: children form a cycle: {path}")
        if not store.exists(cv.dataset_path(child, cv.CONFIG)):
            raise CollectionError(
                f"{where}: child dataset {child!r} does not exist; create it "
                f"(`lakehouse datasets create {child}`) or remove it from children"
            )
        if children(store, child):
            _walk(store, child, (*ancestors, name), found)
        else:
            found.add(child)
