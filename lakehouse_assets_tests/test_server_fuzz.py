"""A fuzz run of the HTTP API from its OpenAPI schema (schemathesis), on a real server.

Each operation gets generated requests (``LAKEHOUSE_TEST_PROFILE``: 5 examples an
operation in ``make test``, 100 in ``make test-thorough``) with an admin token,
most of them aimed at an existing dataset. Checked: no 5xx, every documented
answer matches its schema, and a rejected request stores nothing (the
dataset's journal rows and archive entries are the same before and after it).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from lakehouse_assets import Lakehouse
from lakehouse_assets_tests.conftest import examples
from lakehouse_assets_tests.helpers.server import Server, running_server

DATASET = "fuzz"


@schemathesis.serializer("application/x-ndjson", "application/vnd.apache.arrow.stream")
def _raw(ctx: object, value: object) -> bytes:
    """The NDJSON and Arrow bodies as the text schemathesis generated for them."""
    return value if isinstance(value, bytes) else str(value).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("fuzz")
    lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
    lake.create_dataset(DATASET)
    (base / "state").mkdir()
    # operations would run Spark jobs: the fuzz submits none (see the hook below)
    with running_server(lake, base / "state", LAKEHOUSE_API_OPERATION_WAIT_SECONDS="0") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


@pytest.fixture(scope="module")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.client(server.token(actions=("admin",))) as client:
        yield client


def stored(admin: httpx.Client) -> tuple[str, str]:
    """What the dataset holds that a request could have written."""
    return (
        admin.get(f"/{DATASET}/_api/journal/count").text,
        admin.get(f"/{DATASET}/_api/archive").text,
    )


def check(case: schemathesis.Case, server: Server, admin: httpx.Client) -> None:
    """One generated request: no 5xx, a documented answer matching its schema, and
    nothing stored when it is refused."""
    if "dataset" in (case.path_parameters or {}) and zlib.crc32(repr(case.query).encode()) % 5:
        case.path_parameters["dataset"] = DATASET  # four in five at the real dataset
    if case.method.upper() == "POST" and case.path.endswith(
        ("/operations", "/entities/flush", "/entities/merge")
    ):
        case.path_parameters["dataset"] = "no_such_dataset"  # no Spark job from the fuzz
    before = stored(admin)
    response = case.call(
        base_url=server.url, headers={"Authorization": admin.headers["authorization"]}
    )
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
    if response.status_code >= 400:
        assert stored(admin) == before, (case.method, case.formatted_path, response.status_code)


def test_fuzz_every_operation(
    api: schemathesis.BaseSchema, server: Server, admin: httpx.Client
) -> None:
    """schemathesis' pytest plugin does not run on pytest 9 (``Function._nodeid``): the
    operations' strategies are driven with hypothesis here instead."""
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 30
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples(5, 100),
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def run(case: schemathesis.Case) -> None:
                check(case, server, admin)

            try:
                run()
            except Unsatisfiable:
                # nothing to make invalid (/health takes no input)
                assert mode == GenerationMode.NEGATIVE, operation.label
