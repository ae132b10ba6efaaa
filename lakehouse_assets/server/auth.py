"""Bearer tokens: who a request is (the tenant) and what it may do.

Two token shapes, both HS256 JWTs signed with ``LAKEHOUSE_API_SECRET``:

- **ours**: ``sub`` the tenant (its tags, locks and queue are that tenant's),
  ``datasets`` (names or globs: ``["news_*"]``), ``actions`` (``read``,
  ``write``, ``operate``, ``admin``; ``admin`` allows every action), ``exp``;
- **the peer's** (ftm-lakehouse's ``api/auth.py`` as its repository had it until
  commit d9e5807 dropped it; no PyPI release ships it): ``methods`` (HTTP
  methods or ``*``) and ``prefixes`` (path prefixes, or globs when they hold
  ``*`` or ``?``), optional ``sub``, ``exp``. Checked against the request's
  method and path exactly as the peer does, so a deployment's tokens and its
  proxy configuration (``auth_request /_auth/validate``) move over unchanged.

A missing, malformed, expired or forged token is 401 (with
``WWW-Authenticate: Bearer``); a valid token that does not allow the request
is 403, as the peer answers. The signature is checked by PyJWT, which compares
HMACs in constant time. No token ever reaches a log line: failures are logged
with their reason only.

Tokens are issued by :mod:`lakehouse_assets.tokens` (below this package and
the sharing routes, which accept them too).

Example:
    >>> from lakehouse_assets.tokens import issue_token
    >>> token = issue_token("0" * 32, tenant="aleph", datasets=["news"],
    ...                     actions=["read"], expires=timedelta(hours=1))
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Annotated, Any, Final, Literal
from urllib.parse import unquote

from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidNameError
from lakehouse_assets.tokens import Action, Revocations, TokenRefused, verified_claims

log = logging.getLogger(__name__)

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: Routes anyone may call: the health check, the API's documentation, the validator.
PUBLIC_PATHS: Final = frozenset(
    {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/_auth/validate"}
)
#: ``/{dataset}/_api/{first}/{second}`` routes that run an operation (POST).
OPERATE_ROUTES: Final = frozenset({("entities", "flush"), ("entities", "merge")})
#: POST routes that only read (a query travels in the body, as in the peer).
READ_POSTS: Final = frozenset({("entities", "query"), ("statements", "query")})


def unauthorized(reason: str) -> HTTPException:
    log.info("auth: 401 (%s)", reason)
    return HTTPException(401, detail="Unauthorized", headers={"WWW-Authenticate": "Bearer"})


def forbidden(reason: str) -> HTTPException:
    log.info("auth: 403 (%s)", reason)
    return HTTPException(403, detail="Forbidden")


def _strings(payload: dict[str, Any], key: str) -> list[str]:
    value = payload.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise unauthorized(f"claim {key!r} is not a list of strings")
    return value


@dataclass(frozen=True, slots=True)
class Grant:
    """What a valid token allows. ``shape`` says which claims it carried."""

    shape: Literal["ours", "peer"]
    tenant: str | None
    datasets: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    #: the token's id (``jti``): listed in the revocation list, the token is refused
    jti: str | None = None

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Grant:
        sub = payload.get("sub")
        jti = payload.get("jti") if isinstance(payload.get("jti"), str) else None
        if "actions" in payload or "datasets" in payload:
            try:
                tenant = cv.tenant_name(sub)
            except InvalidNameError:
                raise unauthorized("sub is not a tenant name") from None
            return cls(
                "ours",
                tenant,
                datasets=tuple(_strings(payload, "datasets")),
                actions=tuple(_strings(payload, "actions")),
                jti=jti,
            )
        # the peer's sub is free text: it names the tenant when it is a tenant name
        peer_tenant = sub if isinstance(sub, str) and cv.TENANT_NAME.match(sub) else None
        return cls(
            "peer",
            peer_tenant,
            methods=tuple(m.upper() for m in _strings(payload, "methods")),
            prefixes=tuple(_strings(payload, "prefixes")),
            jti=jti,
        )

    def allows(self, method: str, path: str) -> bool:
        """Whether this grant allows ``method`` on ``path`` (a request's, or a proxied one's)."""
        if self.shape == "peer":  # the peer's TokenData.allows, as it was
            if "*" not in self.methods and method.upper() not in self.methods:
                return False
            return any(_match_prefix(path, prefix) for prefix in self.prefixes)
        dataset, action = required_action(method, path)
        if action is None:
            return True
        if action not in self.actions and "admin" not in self.actions:
            return False
        return dataset is not None and any(fnmatchcase(dataset, g) for g in self.datasets)


def _match_prefix(path: str, prefix: str) -> bool:
    if "*" in prefix or "?" in prefix:
        return fnmatchcase(path, prefix)
    return path.startswith(prefix)


def required_action(method: str, path: str) -> tuple[str | None, Action | None]:
    """The dataset a request is about and the action it needs (None: a public route).

    ``/{dataset}/...``: reads are GET/HEAD/OPTIONS and the query POSTs; the
    flush and merge POSTs and ``_api/operations`` are ``operate`` (a GET of a
    job's state is a read); ``_api/journal/clear`` is ``admin``; any other
    method is ``write``.
    """
    if path in PUBLIC_PATHS:
        return None, None
    parts = path.strip("/").split("/")
    dataset = parts[0] or None
    api = parts[2:4] if len(parts) > 2 and parts[1] == "_api" else []
    key = (api[0], api[1]) if len(api) == 2 else None
    method = method.upper()
    if api[:2] == ["journal", "clear"]:
        return dataset, "admin"
    if method in SAFE_METHODS:
        return dataset, "read"
    if (api and api[0] == "operations") or key in OPERATE_ROUTES:
        return dataset, "operate"
    if key in READ_POSTS:
        return dataset, "read"
    if key == ("entities", "statements") and parts[4:5] == ["query"]:
        return dataset, "read"
    return dataset, "write"


def decode(token: str, secret: str) -> Grant:
    """The grant of a token (401 unless it is well-formed, signed with ``secret`` and live)."""
    try:
        payload = verified_claims(token, secret)
    except TokenRefused as exc:
        raise unauthorized(exc.reason) from None
    return Grant.from_payload(payload)


def original_path(uri: str) -> str:
    """The path of a proxied request's URI: query dropped, percent-escapes decoded and
    ``..`` resolved, so ``/a/../b/`` is checked as ``/b/`` (what the app would serve)."""
    path = unquote(uri.split("?", 1)[0]) or "/"
    normal = posixpath.normpath("/" + path.lstrip("/"))
    return normal + "/" if path.endswith("/") and normal != "/" else normal


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def request_grant(request: Request, token: str) -> Grant:
    """The grant of a request's token: :func:`decode`, then the server's revocation
    list (``lakehouse tokens revoke``; re-read when it changes): a revoked token is
    401, as an expired one."""
    grant = decode(token, request.app.state.secret)
    revoked: Revocations = request.app.state.revoked
    if grant.jti is not None and revoked.is_revoked(grant.jti):
        raise unauthorized("revoked token")
    return grant


def authorize(request: Request) -> Grant:
    """The dependency of every dataset route: the request's grant, or 401/403."""
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise unauthorized("no bearer token")
    grant = request_grant(request, token)
    if not grant.allows(request.method, request.url.path):
        raise forbidden(f"{grant.shape} token does not allow {request.method} {request.url.path}")
    request.state.grant = grant
    return grant


Authorized = Annotated[Grant, Depends(authorize)]

router = APIRouter(prefix="/_auth", tags=["auth"])


@router.get("/validate", status_code=200, response_class=Response)
def validate(
    request: Request,
    x_original_uri: Annotated[str, Header()] = "/",
    x_original_method: Annotated[str, Header()] = "GET",
) -> Response:
    """Check a token for a reverse proxy's ``auth_request`` (the peer's route).

    The proxy forwards the ``Authorization`` header with ``X-Original-URI``
    and ``X-Original-Method``: 200 when the token allows that request, 401
    for a missing or invalid token, 403 when it does not allow it. The
    query string of the original URI is ignored.
    """
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise unauthorized("no bearer token")
    grant = request_grant(request, token)
    path = original_path(x_original_uri)
    if not grant.allows(x_original_method, path):
        raise forbidden(f"{grant.shape} token does not allow {x_original_method} {path}")
    return Response(status_code=200)
