"""``RemoteLakehouse``: the tenant API of :mod:`lakehouse_assets.lake` over HTTP.

The same method names as the facade (``dataset(name).write_entities``,
``add_file``, ``get_entity``, ``query``, ``stream_entities``,
``delete_entity``, ``bulk()``...), so a tenant moves from a local lake to a
server by a URL and a token. Speaks to ``lakehouse serve``; imports nothing of
the server's app (no FastAPI), only httpx and followthemoney.

Errors come back as the lakehouse's own: 422 an ``InvalidInputError`` (its
message names the line), 404 ``DatasetNotFoundError`` / ``SourceNotFoundError``,
401/403 :class:`RemoteAccessError`, 503 a retryable ``LakehouseError``.

Example:
    >>> lake = RemoteLakehouse("http://127.0.0.1:8000", token=os.environ["LAKEHOUSE_TOKEN"])
    >>> ds = lake.dataset("my_dataset")
    >>> ds.write_entities([{"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}}])
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import httpx
import orjson

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import FileMeta
from lakehouse_assets.errors import (
    DatasetNotFoundError,
    InvalidInputError,
    LakehouseError,
    SourceNotFoundError,
)

if TYPE_CHECKING:
    from followthemoney.proxy import EntityProxy
    from followthemoney.statement import Statement
    from followthemoney.statement.entity import StatementEntity
    from ftmq.query import Query

#: bytes of a file or NDJSON body sent at a time
CHUNK = 1024 * 1024


class RemoteAccessError(LakehouseError, PermissionError):
    """The server refused the token (401: missing, expired or forged; 403: not allowed)."""


class RemoteError(LakehouseError):
    """The server answered with an error the lakehouse has no closer class for."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = status in (408, 429, 502, 503, 504)


def _detail(res: httpx.Response) -> tuple[str, str | None]:
    """The error's message and the lakehouse error class the server named."""
    try:
        data = res.json()
    except ValueError:
        return res.text[:500], None
    detail = data.get("detail") if isinstance(data, dict) else data
    error = data.get("error") if isinstance(data, dict) else None
    text = detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    return text, error if isinstance(error, str) else None


def _raise_for(res: httpx.Response, dataset: str | None) -> None:
    if res.status_code < 400:
        return
    res.read()
    detail, error = _detail(res)
    if res.status_code in (401, 403):
        raise RemoteAccessError(f"{res.status_code} {detail}")
    if res.status_code == 404:
        if error == "DatasetNotFoundError":
            raise DatasetNotFoundError(detail)
        raise SourceNotFoundError(detail)
    if res.status_code == 422:
        raise InvalidInputError(detail, dataset=None)
    raise RemoteError(f"{res.status_code} {detail}", res.status_code)


def _ndjson(items: Iterable[Any]) -> Iterator[bytes]:
    """NDJSON chunks of about CHUNK bytes from dicts, entities or ready lines."""
    buffer: list[bytes] = []
    size = 0
    for item in items:
        if isinstance(item, bytes | bytearray):
            line = bytes(item) if item.endswith(b"\n") else bytes(item) + b"\n"
        elif isinstance(item, str):
            line = item.encode() if item.endswith("\n") else (item + "\n").encode()
        else:
            data = item if isinstance(item, dict) else item.to_dict()
            line = orjson.dumps(data) + b"\n"
        buffer.append(line)
        size += len(line)
        if size >= CHUNK:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


def _file_chunks(fh: IO[bytes]) -> Iterator[bytes]:
    while chunk := fh.read(CHUNK):
        yield chunk


@dataclass
class WriteResult:
    """What a bulk write wrote (the facade's ``BulkWriter`` has the same two counts)."""

    entities: int = 0
    count: int = 0
    #: the write's id in the journal, and the tenant the server recorded (the token's)
    write_id: str | None = None
    tenant: str | None = None


class RemoteLakehouse:
    """A lake behind ``lakehouse serve``: ``RemoteLakehouse(url, token=...)``.

    ``token`` defaults to ``LAKEHOUSE_TOKEN``.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r}: a remote lake is an http(s):// URL")
        token = token or os.environ.get("LAKEHOUSE_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> RemoteLakehouse:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def dataset(self, name: str) -> RemoteDataset:
        """A dataset of the server's lake (``DatasetNotFoundError`` if it has none such)."""
        name = cv.dataset_name(name)
        _raise_for(self.http.get(f"/{name}/_api/status"), name)
        return RemoteDataset(self, name)


@dataclass
class RemoteBulk:
    """``with ds.bulk() as bulk``: entities and statements gathered, sent on exit in
    one request each, all or nothing on the server (nothing is sent after an error)."""

    dataset: RemoteDataset
    origin: str
    _entities: list[dict[str, Any]] = field(default_factory=list)
    _statements: list[dict[str, Any]] = field(default_factory=list)
    entities: int = 0
    count: int = 0

    def __enter__(self) -> RemoteBulk:
        return self

    def add_entity(self, entity: EntityProxy | dict[str, Any]) -> None:
        self._entities.append(entity if isinstance(entity, dict) else entity.to_dict())

    def add_statement(self, stmt: Statement | dict[str, Any]) -> None:
        self._statements.append(stmt if isinstance(stmt, dict) else dict(stmt.to_dict()))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            return
        if self._entities:
            done = self.dataset.write_entities(self._entities, origin=self.origin)
            self.entities, self.count = done.entities, done.count
        if self._statements:
            self.count += self.dataset.add_statements(self._statements, origin=self.origin)


class RemoteDataset:
    """One dataset of a remote lake, with the facade's ``Dataset`` methods."""

    def __init__(self, lake: RemoteLakehouse, name: str) -> None:
        self.lake = lake
        self.name = name
        self.http = lake.http
        self.base = f"/{name}/_api"

    def _check(self, res: httpx.Response) -> httpx.Response:
        _raise_for(res, self.name)
        return res

    # --- writes -------------------------------------------------------------

    def write_entities(
        self,
        lines: IO[bytes] | Iterable[bytes | str | dict[str, Any] | EntityProxy],
        *,
        origin: str = cv.DEFAULT_ORIGIN,
    ) -> WriteResult:
        """Bulk-write FtM entities (an NDJSON file, lines, dicts or proxies); all or nothing."""
        body = _file_chunks(lines) if hasattr(lines, "read") else _ndjson(lines)  # type: ignore[arg-type]
        res = self._check(
            self.http.post(f"{self.base}/entities", params={"origin": origin}, content=body)
        )
        data = res.json()
        return WriteResult(
            entities=data["entities"],
            count=data["statements"],
            write_id=data.get("write_id"),
            tenant=data.get("tenant"),
        )

    def add_entity(
        self, entity: EntityProxy | dict[str, Any], origin: str = cv.DEFAULT_ORIGIN
    ) -> int:
        return self.write_entities([entity], origin=origin).count

    def add_statements(
        self, statements: Iterable[Statement | dict[str, Any]], origin: str = cv.DEFAULT_ORIGIN
    ) -> int:
        return self.write_statements(statements, origin=origin).count

    def write_statements(
        self, statements: Iterable[Statement | dict[str, Any]], origin: str = cv.DEFAULT_ORIGIN
    ) -> WriteResult:
        """Bulk-write statements (followthemoney's statement dicts); all or nothing."""
        rows = (s if isinstance(s, dict) else s.to_dict() for s in statements)
        res = self._check(
            self.http.post(
                f"{self.base}/statements", params={"origin": origin}, content=_ndjson(rows)
            )
        )
        data = res.json()
        return WriteResult(
            count=int(data["statements"]), write_id=data.get("write_id"), tenant=data.get("tenant")
        )

    def bulk(self, origin: str = cv.DEFAULT_ORIGIN) -> RemoteBulk:
        return RemoteBulk(self, origin)

    def delete_entity(self, entity_id: str, origin: str | None = None) -> int:
        params = {"origin": origin} if origin else {}
        res = self.http.delete(f"{self.base}/entities/{_segment(entity_id)}", params=params)
        return int(self._check(res).text)

    def delete_statement(self, stmt: Statement) -> None:
        path = (
            f"{self.base}/entities/{_segment(stmt.entity_id)}/statements/{_segment(stmt.id or '')}"
        )
        self._check(self.http.delete(path))

    # --- the archive ----------------------------------------------------------

    def add_file(
        self,
        uri: str | os.PathLike[str],
        *,
        checksum: str | None = None,
        create_document: bool = False,
        name: str | None = None,
        file_id: str | None = None,
        key: str | None = None,
        mimetype: str | None = None,
    ) -> FileMeta:
        """Upload a local file (the server never reads a path of yours: the bytes travel)."""
        path = Path(uri)
        params: dict[str, Any] = {"name": name or path.name, "document": create_document}
        for k, v in (("checksum", checksum), ("file_id", file_id), ("key", key)):
            if v is not None:
                params[k] = v
        headers = {"Content-Type": mimetype} if mimetype else {}
        with path.open("rb") as fh:
            res = self.http.post(
                f"{self.base}/archive", params=params, content=_file_chunks(fh), headers=headers
            )
        return FileMeta.model_validate_json(self._check(res).content)

    def get_file(self, checksum: str) -> FileMeta:
        res = self._check(self.http.get(f"{self.base}/archive/{cv.checksum(checksum)}"))
        return FileMeta.model_validate_json(res.content)

    def list_files(self) -> Iterator[FileMeta]:
        """Every metadata entry of the archive, streamed."""
        for data in self._lines("GET", f"{self.base}/archive"):
            yield FileMeta.model_validate(data)

    def delete_file(self, file_id: str, checksum: str) -> None:
        """Remove one metadata entry (the blob stays, as the spec says)."""
        path = f"{self.base}/archive/{cv.checksum(checksum)}/{_segment_id(file_id)}"
        self._check(self.http.delete(path))

    def push(self, action: str, resource: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Queue an action as the token's tenant; the queued item."""
        body = {"action": action, "resource": resource, "payload": payload}
        item: dict[str, Any] = self._check(self.http.post(f"{self.base}/queue", json=body)).json()
        return item

    def open_file(self, checksum: str) -> Iterator[bytes]:
        """A file's content, streamed."""
        with self.http.stream("GET", f"{self.base}/archive/{cv.checksum(checksum)}/data") as res:
            self._check(res)
            yield from res.iter_bytes(CHUNK)

    # --- reads ----------------------------------------------------------------

    def _lines(self, method: str, path: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        with self.http.stream(method, path, **kwargs) as res:
            self._check(res)
            for line in res.iter_lines():
                if line.strip():
                    yield orjson.loads(line)

    def get_entity(
        self,
        entity_id: str,
        *,
        origin: str | None = None,
        flush: bool = False,
        as_of: str | int | None = None,
    ) -> StatementEntity | None:
        from followthemoney.statement.entity import StatementEntity

        params: dict[str, Any] = {"flush": flush}
        if origin is not None:
            params["origin"] = origin
        if as_of is not None:
            params["as_of"] = str(as_of)
        res = self.http.get(f"{self.base}/entities/{_segment(entity_id)}", params=params)
        if res.status_code == 404 and _detail(res)[1] != "DatasetNotFoundError":
            return None
        return StatementEntity.from_data(_ftm_dataset(self.name), self._check(res).json())

    def query(
        self,
        q: Query | None = None,
        *,
        entity_ids: Iterable[str] | None = None,
        origin: str | None = None,
        schemata: Iterable[str] | None = None,
        flush: bool = True,
        as_of: str | int | None = None,
    ) -> Iterator[StatementEntity]:
        """Entities matching the filters, streamed (``q`` an ftmq ``Query``)."""
        from followthemoney.statement import Statement
        from followthemoney.statement.entity import StatementEntity

        body: dict[str, Any] = {"flush_first": flush}
        if q is not None:
            body["query"] = q.to_dict()
        if entity_ids is not None:
            body["entity_ids"] = list(entity_ids)
        if schemata is not None:
            body["schemata"] = list(schemata)
        if origin is not None:
            body["origin"] = origin
        if as_of is not None:
            body["as_of"] = str(as_of)
        meta = _ftm_dataset(self.name)
        for data in self._lines("POST", f"{self.base}/entities/query", json=body):
            statements = [Statement.from_dict(s) for s in data["statements"]]
            yield StatementEntity.from_statements(meta, statements)

    def stream_entities(self, as_of: str | int | None = None) -> Iterator[dict[str, Any]]:
        """The entities of the last ``entities.ftm.json`` export (or of a version)."""
        params = {"as_of": str(as_of)} if as_of is not None else {}
        return self._lines("GET", f"{self.base}/entities", params=params)

    def export_file(self, name: str, as_of: str | int | None = None) -> Iterator[bytes]:
        """An export file's bytes (``statements.csv``, ``entities.ftm.json``,
        ``statistics.json``, ``index.json``), or a published version's, streamed."""
        params = {"as_of": str(as_of)} if as_of is not None else {}
        path = f"{self.base}/exports/{name}"
        with self.http.stream("GET", path, params=params) as res:
            self._check(res)
            yield from res.iter_bytes(CHUNK)

    def versions(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._check(self.http.get(f"{self.base}/versions")).json()
        return data

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self._check(self.http.get(f"{self.base}/status")).json()
        return data

    # --- operations -----------------------------------------------------------

    def submit(self, operation: str, **options: Any) -> dict[str, Any]:
        """Submit an operation (flush, make, export, compact, optimize); its job."""
        res = self.http.post(f"{self.base}/operations", json={"name": operation, **options})
        job: dict[str, Any] = self._check(res).json()
        return job

    def wait(self, job: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
        """The job once it has finished (``LakehouseError`` if it failed)."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            state: dict[str, Any] = self._check(
                self.http.get(f"{self.base}/operations/{job['id']}")
            ).json()
            if state["state"] in ("succeeded", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise RemoteError(f"job {job['id']} still {state['state']} after {timeout} s", 408)
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        if state["state"] != "succeeded":
            raise RemoteError(f"job {job['id']} {state['state']}: {state.get('error')}", 500)
        return state

    def flush(self) -> dict[str, Any]:
        return dict(self.wait(self.submit("flush"))["result"])

    def make(self, force: bool = False) -> dict[str, Any]:
        return dict(self.wait(self.submit("make", force=force))["result"])


def _segment(value: str) -> str:
    """An id as one URL path segment (``/`` and the rest percent-escaped)."""
    from urllib.parse import quote

    return quote(cv.entity_id(value), safe="")


def _segment_id(value: str) -> str:
    """A file id as one URL path segment."""
    from urllib.parse import quote

    return quote(cv.file_id(value), safe="")


def _ftm_dataset(name: str) -> Any:
    from followthemoney.dataset import Dataset as FtmDataset

    return FtmDataset.make({"name": name, "title": name})


__all__ = ["RemoteAccessError", "RemoteDataset", "RemoteError", "RemoteLakehouse", "WriteResult"]
