"""Recipients: who reads a share, with which token, and how a token is revoked.

A recipient is a bearer token signed with the server's ``LAKEHOUSE_API_SECRET``
(HS256, the tenant API's machinery, :mod:`lakehouse_assets.tokens`): the tenant
in ``sub``, the datasets it may read in ``datasets`` (names or globs),
``actions: ["read"]``, ``exp``. A
**profile token** (``lakehouse sharing profile``) carries two more claims:

- ``aud: "delta-sharing"``: PyJWT refuses a token with an audience where the
  decoder names none, so the tenant API (which names none) answers 401 to a
  profile token: a profile handed to an analyst opens the shared tables and
  nothing else;
- ``jti``: its id, so it can be revoked before it expires
  (``lakehouse sharing revoke``): the ids go to ``sharing/revoked.json`` in the
  server's state folder, read again whenever the file changes.

The tenant API's own tokens (ours, with ``read`` or ``admin``) are accepted
too: a tenant that may read a dataset may read its tables. They have no id,
so only their expiry ends them. The peer's tokens (methods and path
prefixes) name no dataset and are refused.

Example:
    >>> token, claims = issue("0" * 32, tenant="analysts", datasets=["news"],
    ...                       expires=timedelta(days=30))
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any, Final

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidNameError, LakehouseError
from lakehouse_assets.tokens import Revocations, TokenRefused, sign, token_claims, verified_claims

#: The audience of a profile token: the tenant API refuses it, the sharing server wants it.
AUDIENCE: Final = "delta-sharing"
#: Actions of the tenant API's tokens that allow reading a dataset's tables.
READ_ACTIONS: Final = frozenset({"read", "admin"})


class SharingError(LakehouseError):
    """A request the sharing server refuses: ``status`` and the protocol's ``errorCode``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def unauthenticated(message: str = "no valid bearer token") -> SharingError:
    return SharingError(401, "UNAUTHENTICATED", message)


@dataclass(frozen=True, slots=True)
class Recipient:
    """What a valid token may read: the datasets matching its globs."""

    tenant: str
    datasets: tuple[str, ...]
    jti: str | None
    expires: int

    def may_read(self, dataset: str) -> bool:
        return any(fnmatchcase(dataset, glob) for glob in self.datasets)


def issue(
    secret: str, *, tenant: str, datasets: list[str], expires: timedelta
) -> tuple[str, dict[str, Any]]:
    """A profile token (``aud`` delta-sharing, a fresh ``jti``) and its claims."""
    if not datasets:
        raise InvalidNameError("a profile names at least one dataset")
    if expires <= timedelta(0):
        raise InvalidNameError("a profile expires in the future")
    claims = token_claims(tenant=tenant, datasets=list(datasets), actions=["read"], expires=expires)
    claims["aud"] = AUDIENCE
    return sign(claims, secret), claims


def profile(endpoint: str, token: str, expires: int) -> dict[str, Any]:
    """The profile file of the protocol (``shareCredentialsVersion`` 1)."""
    when = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return {
        "shareCredentialsVersion": 1,
        "endpoint": endpoint.rstrip("/"),
        "bearerToken": token,
        "expirationTime": when,
    }


def decode(token: str, secret: str, revoked: Revocations) -> Recipient:
    """The recipient of a token, or a 401 :class:`SharingError` (never the token's text)."""
    try:
        payload = verified_claims(token, secret, require=("exp", "sub"), verify_aud=False)
    except TokenRefused as exc:
        raise unauthenticated(
            "the token has expired" if exc.expired else "the token is not one of this server's"
        ) from None
    aud = payload.get("aud")
    if aud is not None and aud != AUDIENCE:
        raise unauthenticated("the token is not for Delta Sharing")
    jti = payload.get("jti")
    if jti is not None and (not isinstance(jti, str) or revoked.is_revoked(jti)):
        raise unauthenticated("the token was revoked")
    datasets, actions = payload.get("datasets"), payload.get("actions")
    if not isinstance(datasets, list) or not isinstance(actions, list):
        raise SharingError(403, "PERMISSION_DENIED", "the token names no datasets")
    if not READ_ACTIONS & {a for a in actions if isinstance(a, str)}:
        raise SharingError(403, "PERMISSION_DENIED", "the token does not allow reading")
    try:
        tenant = cv.tenant_name(payload["sub"])
    except InvalidNameError:
        raise unauthenticated() from None
    globs = tuple(d for d in datasets if isinstance(d, str))
    return Recipient(tenant, globs, jti, int(payload["exp"]))
