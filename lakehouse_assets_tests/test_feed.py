"""The lake as the FtM world reads it: followthemoney's catalog and dataset model,
and yente's delta feed, checked with followthemoney's parser and yente's own
updater code (in its own virtual environment: ``make yente``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from followthemoney.dataset import DataCatalog, Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets import versions
from lakehouse_assets.errors import InvalidConfigError
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets_tests.conftest import REPO, sample_entities
from lakehouse_assets_tests.helpers.data import entities_of, normal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The Python of yente's virtual environment (``make yente``).
YENTE_PYTHON = Path(
    os.environ.get("LAKEHOUSE_TEST_YENTE_PYTHON", REPO / ".venv-yente" / "bin" / "python")
)
DRIVER = REPO / "lakehouse_assets_tests" / "helpers" / "yente_driver.py"


def _quiet_handler(directory: str) -> type[SimpleHTTPRequestHandler]:
    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A lake folder served over HTTP on 127.0.0.1 (what a static host or a
    bucket's website endpoint does), and its URL."""
    root = tmp_path / "lake"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def published_lake(root: Path, url: str | None, tmp_path: Path) -> Lakehouse:
    settings = Settings(public_url=url) if url else Settings()
    return Lakehouse(root, settings=settings, journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}")


def changed(entity: dict[str, Any], value: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(entity))
    copy["properties"].setdefault("notes", []).append(value)
    return copy


# --- followthemoney's model ----------------------------------------------------------


def test_catalog_and_dataset_index_parse_with_followthemoney(
    spark: SparkSession, served: tuple[Path, str], tmp_path: Path
) -> None:
    """followthemoney's ``DataCatalog`` / ``Dataset`` read the catalog ``index.json``
    and a dataset's ``index.json`` as written (the catalog failed: its ``version``
    was an object); ``version`` is the head's sortable id, URLs are absolute
    under ``public_url``, ``checksum`` is a resource's SHA-1 beside its SHA-256."""
    root, url = served
    lake = published_lake(root, url, tmp_path)
    ds = lake.create_dataset("parsed", title="Parsed")
    lake.create_dataset("empty_one")  # nothing published: listed by name and title
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()], origin="a")
    ds.make()
    head = ds.version()
    assert head is not None
    catalog = DataCatalog(Dataset, json.loads((root / cv.CATALOG_INDEX).read_text()))
    assert catalog.names == {"parsed", "empty_one"}
    listed = catalog.require("parsed").model
    assert listed.version == head.version_id and listed.title == "Parsed"
    assert catalog.require("empty_one").model.version is None
    index = json.loads((root / "parsed" / cv.INDEX).read_text())
    model = Dataset(index).model
    assert model.version == head.version_id
    assert index["entities_url"] == f"{url}/parsed/{cv.ENTITIES_JSON}"
    assert index["delta_url"] == f"{url}/{cv.diff_index_path('parsed')}"
    assert index[versions.LAKEHOUSE_VERSION]["sequence"] == 1
    assert index[versions.LAKEHOUSE_VERSION]["manifest"] == head.path
    resource = model.get_resource(cv.ENTITIES_JSON)
    data = (root / "parsed" / cv.ENTITIES_JSON).read_bytes()
    assert resource.url == index["entities_url"]
    assert resource.checksum == hashlib.sha1(data).hexdigest()  # noqa: S324 - yente's
    entry = next(r for r in index["resources"] if r["name"] == cv.ENTITIES_JSON)
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    # the version id sorts as the chain does, and `versions` shows it
    assert followthemoney_version_ok(head.version_id)
    assert ds.verify().ok
    # yente's delta index pointing a version at another file: verify names it
    deltas_path = root / cv.diff_index_path("parsed")
    deltas = json.loads(deltas_path.read_text())
    assert list(deltas["versions"]) == [head.version_id]
    deltas["versions"][head.version_id] = f"{url}/parsed/entities.ftm.json"
    deltas_path.write_text(json.dumps(deltas))
    problems = [str(p) for p in ds.verify().problems]
    assert any("delta index names" in p and head.version_id in p for p in problems), problems


def followthemoney_version_ok(version_id: str) -> bool:
    from followthemoney.dataset.versions import Version

    return Version.from_string(version_id).id.split("-")[0] == version_id.split("-")[0]


def test_without_a_public_url_the_metadata_has_paths_not_urls(
    spark: SparkSession, tmp_path: Path
) -> None:
    """followthemoney takes only absolute http(s) URLs: without ``public_url`` the
    index carries lake-relative ``path`` fields and no ``url``/``entities_url``/
    ``delta_url``, and still parses; the delta index lists its files by name."""
    lake = published_lake(tmp_path / "lake", None, tmp_path)
    ds = lake.create_dataset("plain")
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()], origin="a")
    ds.make()
    index = json.loads(ds.store.read_text(cv.dataset_path("plain", cv.INDEX)))
    assert Dataset(index).model.version == index["version"]
    assert "entities_url" not in index and "delta_url" not in index
    assert all("url" not in r and r["path"] for r in index["resources"])
    deltas = json.loads(ds.store.read_text(cv.diff_index_path("plain")))
    head = ds.version()
    assert head is not None
    assert deltas["versions"] == {head.version_id: head.manifest["diff"]["path"].rsplit("/", 1)[-1]}


def test_the_catalog_parses_on_s3(
    spark: SparkSession, s3_settings: Settings, tmp_path: Path
) -> None:
    """The same on an S3 lake (its public URL: the bucket's HTTP endpoint)."""
    from lakehouse_assets_tests.conftest import make_bucket

    bucket = make_bucket(s3_settings)
    public = f"{s3_settings.s3_endpoint_url}/{bucket}/lake"
    lake = Lakehouse(
        f"s3://{bucket}/lake",
        settings=s3_settings.model_copy(update={"public_url": public}),
        journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}",
    )
    ds = lake.create_dataset("on_s3")
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()], origin="a")
    ds.make()
    catalog = DataCatalog(Dataset, json.loads(lake.store.read_text(cv.CATALOG_INDEX)))
    model = catalog.require("on_s3").model
    head = ds.version()
    assert head is not None and model.version == head.version_id
    assert model.get_resource(cv.ENTITIES_JSON).url == f"{public}/on_s3/{cv.ENTITIES_JSON}"


def test_a_bad_delta_retention_fails_before_publishing(spark: SparkSession, tmp_path: Path) -> None:
    """``delta_retention`` in the dataset's config.yml: a number of versions; a
    bad value names the file and fails before a version is written."""
    lake = published_lake(tmp_path / "lake", None, tmp_path)
    ds = lake.create_dataset("badret")
    config = cv.dataset_path("badret", cv.CONFIG)
    data = yaml.safe_load(ds.store.read_text(config))
    ds.store.write_text(config, yaml.safe_dump({**data, "delta_retention": 0}))
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()], origin="a")
    with pytest.raises(InvalidConfigError, match="badret/config.yml.*delta_retention"):
        ds.make()
    assert ds.version() is None


# --- yente's delta feed --------------------------------------------------------------


def yente_python() -> Path:
    """yente's interpreter, or a skip saying why there is none."""
    if not YENTE_PYTHON.exists():
        pytest.skip(f"yente is not installed ({YENTE_PYTHON} missing: run `make yente`)")
    probe = subprocess.run(
        [str(YENTE_PYTHON), "-c", "import yente.data.updater"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"yente cannot be imported from {YENTE_PYTHON}: {probe.stderr[-300:]}")
    return YENTE_PYTHON


def run_yente(
    python: Path, catalog_url: str, name: str, state: Path, *extra: str
) -> dict[str, Any]:
    out = state.with_suffix(".out.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("YENTE_")}
    env["YENTE_DATA_PATH"] = str(state.parent)
    proc = subprocess.run(
        [str(python), str(DRIVER), catalog_url, name, str(state), str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_yente_applies_the_delta_feed_to_reach_the_head(
    spark: SparkSession, served: tuple[Path, str], tmp_path: Path
) -> None:
    """yente's own ``DatasetUpdater`` (and its indexer's entity actions), pointed
    at the catalog ``index.json`` of a lake served over HTTP: it loads version 1
    fully, then takes the incremental path through versions 2-4 (adds, a
    change, a delete) and ends with the head's entities.ftm.json; once the
    retention window no longer reaches its version, it reloads fully."""
    python = yente_python()
    root, url = served
    lake = published_lake(root, url, tmp_path)
    ds = lake.create_dataset("feed", title="Feed")
    catalog_url = f"{url}/{cv.CATALOG_INDEX}"
    state = tmp_path / "yente-state.json"
    entities = sample_entities()
    first, rest = entities[:4], entities[4:]

    def write(batch: list[dict[str, Any]]) -> None:
        ds.write_entities([json.dumps(e).encode() for e in batch], origin="a")
        ds.make()

    def head_entities() -> dict[str, dict[str, Any]]:
        return entities_of((root / "feed" / cv.ENTITIES_JSON).read_bytes())

    write(first)
    loaded = run_yente(python, catalog_url, "feed", state)
    v1 = ds.version()
    assert v1 is not None
    assert (loaded["incremental"], loaded["version"]) == (False, v1.version_id)
    assert {k: normal(v) for k, v in loaded["entities"].items()} == head_entities()
    assert loaded["ops"]["ADD"] == len(first) and loaded["refused"] == 0

    write(rest)  # v2: adds
    write([changed(first[0], "changed in version 3")])  # v3: a change
    ds.delete_entity(str(first[1]["id"]))  # v4: a delete
    ds.make()
    head = ds.version()
    assert head is not None and head.sequence == 4
    result = run_yente(python, catalog_url, "feed", state)
    assert result["dataset_version"] == head.version_id
    assert result["incremental"] is True, result["delta_versions"]
    assert result["delta_versions"] == [
        v.version_id for v in versions.history(ds) if v.sequence > 1
    ]
    assert result["version"] == head.version_id
    assert result["ops"]["ADD"] == len(rest) and result["ops"]["DEL"] == 1
    assert result["ops"]["MOD"] >= 1 and result["refused"] == 0
    assert {k: normal(v) for k, v in result["entities"].items()} == head_entities()
    assert str(first[1]["id"]) not in result["entities"]

    # nothing new: yente has nothing to load
    assert run_yente(python, catalog_url, "feed", state)["needs_update"] is False

    # a window of one version: a yente at version 4 when 6 is the head reloads
    config = cv.dataset_path("feed", cv.CONFIG)
    data = yaml.safe_load(ds.store.read_text(config))
    ds.store.write_text(config, yaml.safe_dump({**data, "delta_retention": 1}))
    write([changed(first[2], "version 5")])
    write([changed(first[3], "version 6")])
    deltas = json.loads(ds.store.read_text(cv.diff_index_path("feed")))
    assert list(deltas["versions"]) == [ds.version().version_id]  # type: ignore[union-attr]
    reloaded = run_yente(python, catalog_url, "feed", state)
    assert reloaded["incremental"] is False and reloaded["needs_update"] is True
    assert {k: normal(v) for k, v in reloaded["entities"].items()} == head_entities()


def test_yente_checks_the_resource_checksum(
    spark: SparkSession, served: tuple[Path, str], tmp_path: Path
) -> None:
    """yente loading ``entities.ftm.json`` as a resource (no ``entities_url``)
    checks its SHA-1 against the resource's ``checksum``: it passes, and a file
    changed behind the index fails yente's check."""
    python = yente_python()
    root, url = served
    lake = published_lake(root, url, tmp_path)
    ds = lake.create_dataset("summed")
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()], origin="a")
    ds.make()
    catalog_url = f"{url}/{cv.CATALOG_INDEX}"
    args = ("--by-resource", cv.ENTITIES_JSON)
    loaded = run_yente(python, catalog_url, "summed", tmp_path / "a.json", *args)
    assert loaded["entities_url"] == f"{url}/summed/{cv.ENTITIES_JSON}"
    assert len(loaded["entities"]) == len(sample_entities())
    path = root / "summed" / cv.ENTITIES_JSON
    path.write_bytes(path.read_bytes() + b"\n")  # one more byte: another SHA-1
    with pytest.raises(AssertionError, match="ChecksumError"):
        run_yente(python, catalog_url, "summed", tmp_path / "b.json", *args)


# --- lakehouse diff --------------------------------------------------------------------


def _apply(state: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(state)
    for op in ops:
        if op["op"] == "DEL":
            del out[op["entity"]["id"]]
        else:
            assert (op["entity"]["id"] in out) == (op["op"] == "MOD"), op
            out[op["entity"]["id"]] = op["entity"]
    return out


def _direct(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    ops = [{"op": "DEL", "entity": e} for k, e in old.items() if k not in new]
    for k, e in new.items():
        if k not in old:
            ops.append({"op": "ADD", "entity": e})
        elif old[k] != e:
            ops.append({"op": "MOD", "entity": e})
    return ops


@settings(deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from("abcde"), st.sampled_from(["x", "y"]), max_size=5),
        min_size=2,
        max_size=6,
    )
)
def test_composed_diffs_equal_the_diff_of_the_ends(states: list[dict[str, str]]) -> None:
    """``lakehouse diff`` composes the versions' diffs: for any run of states, the
    composed lines turn the first into the last, with the ops the direct diff has
    (and a MOD of an entity changed and changed back, at most)."""
    from lakehouse_assets.versions.diffs import Composed, _compose

    def entities(state: dict[str, str]) -> dict[str, Any]:
        return {
            k: {"id": k, "schema": "Thing", "properties": {"name": [v]}} for k, v in state.items()
        }

    changed: dict[str, Composed] = {}
    for old, new in zip(states, states[1:], strict=False):
        for op in _direct(entities(old), entities(new)):
            eid = op["entity"]["id"]
            changed[eid] = _compose(changed.get(eid), op["op"], op["entity"])
    composed = [{"op": c[0], "entity": c[1]} for c in changed.values() if c[0] is not None]
    first, last = entities(states[0]), entities(states[-1])
    assert _apply(first, composed) == last
    direct = {(op["op"], op["entity"]["id"]) for op in _direct(first, last)}
    extra = [op for op in composed if (op["op"], op["entity"]["id"]) not in direct]
    # only a change undone later, which a MOD line cannot tell (it has no old entity)
    assert all(op["op"] == "MOD" and first[op["entity"]["id"]] == op["entity"] for op in extra)


def test_diff_command_prints_the_changes_between_two_versions(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``lakehouse diff DS V1 V2`` (or ``-d DS diff V1 V2``): the ADD/MOD/DEL lines
    that turn V1's entities.ftm.json into V2's, consecutive or not, by sequence or
    version id; an unknown version or a reversed pair is an error naming them."""
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    lake = published_lake(tmp_path / "lake", None, tmp_path)
    ds = lake.create_dataset("diffed")
    entities = sample_entities()
    exports: dict[int, dict[str, Any]] = {}

    def publish(batch: list[dict[str, Any]] | None = None) -> None:
        if batch:
            ds.write_entities([json.dumps(e).encode() for e in batch], origin="a")
        ds.make()
        head = ds.version()
        assert head is not None
        exports[head.sequence] = entities_of(
            ds.store.read_bytes(cv.dataset_path("diffed", cv.ENTITIES_JSON))
        )

    publish(entities[:4])
    publish(entities[4:])  # 2: adds
    ds.delete_entity(str(entities[0]["id"]))
    publish([changed(entities[1], "in version 3")])  # 3: a change and a delete
    runner = CliRunner()
    base = ["--lake", lake.store.uri, "--journal-url", lake.settings.resolved_journal_url()]
    v3 = ds.version(3)
    assert v3 is not None
    for args, old, new in (
        (["diff", "diffed", "1", "3"], 1, 3),
        (["-d", "diffed", "diff", "2", v3.version_id], 2, 3),
        (["diff", "diffed", "1", "2"], 1, 2),
    ):
        out = runner.invoke(cli, [*base, *args])
        assert out.exit_code == 0, out.output
        ops = [json.loads(line) for line in out.output.splitlines()]
        state = _apply(exports[old], [{**op, "entity": normal(op["entity"])} for op in ops])
        assert state == exports[new]
    ops = [
        json.loads(x)
        for x in runner.invoke(cli, [*base, "diff", "diffed", "1", "3"]).output.splitlines()
    ]
    assert sorted(op["op"] for op in ops) == ["ADD"] * len(entities[4:]) + ["DEL", "MOD"]
    for args, message in (
        (["diff", "diffed", "1", "9"], "Dataset 'diffed' has no version 9"),
        (
            ["diff", "diffed", "20991231000000-000000", "3"],
            "has no version '20991231000000-000000'",
        ),
        (["diff", "diffed", "3", "1"], "the second version must be the newer one"),
        (["diff", "nosuch", "1", "2"], "nosuch"),
    ):
        out = runner.invoke(cli, [*base, *args])
        assert out.exit_code == 1 and message in out.output, out.output
