"""The tenant API's bearer tokens: issued, verified, revoked, and the key they need.

HS256 JWTs signed with ``LAKEHOUSE_API_SECRET``: ``sub`` the tenant,
``datasets`` (names or globs), ``actions``, ``iat``, ``exp``. This is the core
both HTTP packages build on: the tenant API's server checks these tokens
against each request (:mod:`.server.auth`), the Delta Sharing routes accept
them and issue profile tokens of the same shape (:mod:`.sharing.recipients`),
and :class:`Revocations` is the list of token ids refused before their
expiry. It sits below both, so neither imports the other for it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import jwt
from jwt.types import Options

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import ConfigurationError, InvalidNameError
from lakehouse_assets.settings import Settings

Action = Literal["read", "write", "operate", "admin"]
ACTIONS: Final[tuple[Action, ...]] = ("read", "write", "operate", "admin")
#: HS256 keys shorter than the hash are guessable offline from one token (RFC 7518 §3.2).
MIN_SECRET_CHARS: Final = 32
ALGORITHM: Final = "HS256"


def server_secret(settings: Settings) -> str:
    """The signing key, or a :class:`ConfigurationError` naming the setting."""
    secret = settings.api_secret.get_secret_value() if settings.api_secret else ""
    if len(secret) < MIN_SECRET_CHARS:
        have = "is not set" if not secret else f"has {len(secret)} characters"
        raise ConfigurationError(
            f"LAKEHOUSE_API_SECRET {have}: the server needs a secret of at least "
            f"{MIN_SECRET_CHARS} characters to sign tokens (e.g. `openssl rand -hex 32`)"
        )
    return secret


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``7d`` as a ``timedelta`` (positive)."""
    match = _DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration such as 30m, 1h or 7d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def token_claims(
    *, tenant: str, datasets: list[str], actions: list[str], expires: timedelta
) -> dict[str, Any]:
    """The claims of a token of our shape, every name checked (what :func:`issue_token`
    signs, and a sharing profile extends with its audience and id)."""
    tenant = cv.tenant_name(tenant)
    for pattern in datasets:
        if not pattern or not re.fullmatch(r"[a-z0-9_*?\[\]]+", pattern):
            raise InvalidNameError(f"dataset {pattern!r}: a dataset name or a glob such as news_*")
    for action in actions:
        if action not in ACTIONS:
            raise InvalidNameError(f"action {action!r}: one of {', '.join(ACTIONS)}")
    if not datasets or not actions:
        raise InvalidNameError("a token names at least one dataset and one action")
    now = datetime.now(UTC)
    return {
        "sub": tenant,
        "datasets": datasets,
        "actions": actions,
        # its id: what `lakehouse tokens revoke` lists to end it before it expires
        "jti": uuid.uuid4().hex,
        "iat": int(now.timestamp()),
        "exp": int((now + expires).timestamp()),
    }


def issue_token(
    secret: str,
    *,
    tenant: str,
    datasets: list[str],
    actions: list[str],
    expires: timedelta,
) -> str:
    """A token of our shape; every name is checked before it is signed."""
    claims = token_claims(tenant=tenant, datasets=datasets, actions=actions, expires=expires)
    return sign(claims, secret)


def sign(claims: dict[str, Any], secret: str) -> str:
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


class TokenRefused(Exception):
    """A token that is not a live one of this server. ``reason`` says why, for a log
    line or an answer; it never holds the token's text."""

    def __init__(self, reason: str, *, expired: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expired = expired


def verified_claims(
    token: str,
    secret: str,
    *,
    require: tuple[str, ...] = ("exp",),
    verify_exp: bool = True,
    verify_aud: bool = True,
) -> dict[str, Any]:
    """The claims of a token signed with ``secret`` (HS256 only: PyJWT compares the
    HMAC in constant time and refuses ``alg: none`` and other algorithms), or
    :class:`TokenRefused`.

    With ``verify_aud`` (the tenant API), a token that names an audience is
    refused, since no audience is expected: that is what keeps a sharing
    profile out of the tenant API. The sharing routes pass ``False`` and check
    the audience themselves."""
    options: Options = {
        "require": list(require),
        "verify_exp": verify_exp,
        "verify_aud": verify_aud,
    }
    try:
        payload = jwt.decode(token, secret, algorithms=[ALGORITHM], options=options)
    except jwt.ExpiredSignatureError:
        raise TokenRefused("expired token", expired=True) from None
    except jwt.InvalidTokenError as exc:
        raise TokenRefused(f"invalid token: {type(exc).__name__}") from None
    if not isinstance(payload, dict):
        raise TokenRefused("payload is not an object")
    return payload


def claims_of(token: str, secret: str) -> dict[str, Any]:
    """The claims of a well-signed token, expired or not (what ``revoke`` needs)."""
    try:
        return verified_claims(token, secret, require=(), verify_exp=False, verify_aud=False)
    except TokenRefused as exc:
        raise InvalidNameError(f"not a token of this server: {exc.reason}") from None


def revoke(settings: Settings, token_or_id: str) -> tuple[str, Path]:
    """Refuse a token from now on, given the token or its id: (the id, the list's path).

    A token's own expiry bounds how long its id stays listed; an id alone is
    kept for the longest lifetime a token can have
    (``LAKEHOUSE_API_TOKEN_MAX_HOURS``). A token without an id (issued before
    tokens had one) cannot be revoked: :class:`InvalidNameError` says so."""
    if token_or_id.count(".") == 2:  # a JWT: header.payload.signature
        claims = claims_of(token_or_id, server_secret(settings))
        jti = claims.get("jti")
        if not isinstance(jti, str) or not jti:
            raise InvalidNameError("this token has no id: it ends at its expiry")
        expires = int(claims["exp"])
    else:
        jti = token_or_id.strip()
        if not jti:
            raise InvalidNameError("give a token or its id")
        expires = int(datetime.now(UTC).timestamp() + settings.api_token_max_hours * 3600)
    revocations = Revocations(settings)
    revocations.revoke(jti, expires)
    return jti, revocations.path


def state_dir(settings: Settings) -> Path:
    """The server's state folder (``LAKEHOUSE_API_STATE_DIR``, as the server
    defaults it): the revocation list lives there, beside its staging and jobs."""
    return settings.api_state_path


class Revocations:
    """The revoked token ids (``{state}/sharing/revoked.json``: ``{jti: exp}``).

    Re-read when the file's mtime or size changes, so a ``revoke`` on the host
    takes effect on the next request of every worker process. Entries past
    their token's expiry are dropped on the next revocation.
    """

    def __init__(self, settings: Settings) -> None:
        self.path = state_dir(settings) / "sharing" / "revoked.json"
        self._seen: tuple[int, int] | None = None
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def _load(self) -> dict[str, int]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        key = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if key != self._seen:
                data = json.loads(self.path.read_text() or "{}")
                self._ids = {str(k): int(v) for k, v in data.items()}
                self._seen = key
            return self._ids

    def is_revoked(self, jti: str) -> bool:
        return jti in self._load()

    def revoke(self, jti: str, expires: int) -> None:
        """Add ``jti`` (written atomically: a reader sees the old list or the new one)."""
        now = int(datetime.now(UTC).timestamp())
        ids = {k: v for k, v in self._load().items() if v > now}
        ids[jti] = expires
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".revoked-")
        with os.fdopen(fd, "w") as out:
            json.dump(ids, out, sort_keys=True)
        os.replace(tmp, self.path)
