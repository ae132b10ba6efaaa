"""Queue item ids: UUIDv7 (RFC 9562), whose string order is their time order.

The consumer applies the items of all tenants in the order of their ids, and
an item's journal write id is derived from its id (:func:`write_id`), so the
same item writes the same rows whoever applies it. See :mod:`lakehouse_assets.queue`.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from datetime import UTC, datetime

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidNameError

# --- UUIDv7 -------------------------------------------------------------------

_uuid_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    """A UUIDv7 (RFC 9562, method 1): 48-bit Unix milliseconds, a 12-bit counter,
    62 random bits.

    Monotonic within a process: the counter starts at a random value below
    2048 each millisecond and counts up within it; when it runs out, or the
    clock steps back, the next id borrows the following millisecond, so an
    id is always greater than the one before it.
    """
    global _last_ms, _counter
    with _uuid_lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms, _counter = now, secrets.randbits(11)
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    value = (
        (ms & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76
        | counter << 64
        | 0b10 << 62
        | secrets.randbits(62)
    )
    return str(uuid.UUID(int=value))


def uuid7_time(item_id: str) -> datetime:
    """The time a UUIDv7 was made (millisecond precision, UTC).

    ``InvalidNameError`` for an id whose time lies beyond what a date can say
    (48 bits of milliseconds reach the year 10889).
    """
    ms = int(cv.queue_item_id(item_id).replace("-", "")[:12], 16)
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        raise InvalidNameError(
            f"Invalid queue item id {item_id!r}: its time lies beyond the year 9999"
        ) from None


def write_id(item_id: str) -> str:
    """The journal write id of an item: its time and id, the same on every apply."""
    stamp = uuid7_time(item_id).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{item_id.replace('-', '')[12:]}"
