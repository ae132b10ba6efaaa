"""The tenant API's bearer tokens: issued, and the signing key they need.

HS256 JWTs signed with ``LAKEHOUSE_API_SECRET``: ``sub`` the tenant,
``datasets`` (names or globs), ``actions``, ``iat``, ``exp``. This is the core
both HTTP packages build on: the tenant API's server checks these tokens
against each request (:mod:`.server.auth`), the Delta Sharing routes accept
them and issue profile tokens of the same shape (:mod:`.sharing.recipients`).
It sits below both, so neither imports the other for it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

import jwt

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


def issue_token(
    secret: str,
    *,
    tenant: str,
    datasets: list[str],
    actions: list[str],
    expires: timedelta,
) -> str:
    """A token of our shape; every name is checked before it is signed."""
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
    claims = {
        "sub": tenant,
        "datasets": datasets,
        "actions": actions,
        "iat": int(now.timestamp()),
        "exp": int((now + expires).timestamp()),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)
