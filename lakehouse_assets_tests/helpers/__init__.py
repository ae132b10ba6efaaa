"""Helpers that several test modules share, so that no test module imports another.

By concern: ``data`` (input entities, normalised entity dicts, a Delta table's rows),
``defs`` (the Dagster layer: asset keys, resources of a lake), ``graph`` (reading a
Cypher script back as a graph; followthemoney's own GraphML and Neo4j exports to
compare with), ``model`` (what a dataset acknowledged, and what its exports say) and
``crash`` (an operation killed at a fault point in a child process). Fixtures stay in
``conftest.py``.
"""
