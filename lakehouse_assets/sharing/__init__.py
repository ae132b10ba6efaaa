"""Delta Sharing: the lake's tables read by recipients without storage credentials.

The open protocol (delta-io/delta-sharing, PROTOCOL.md) lets pandas, Spark,
Polars or a BI tool read a shared Delta table with only a profile file (an
endpoint and a bearer token). ``lakehouse serve`` mounts these routes under
``/delta-sharing``; ``lakehouse sharing profile`` writes a profile, and
``lakehouse sharing revoke`` ends one before it expires.

This package sits above the facade and below the server (the server mounts
it; it never imports the server): :mod:`.recipients` (profile tokens and
their revocation), :mod:`.tables` (what a table is at a version, read from
its Delta log), :mod:`.urls` (presigned or signed file URLs), :mod:`.routes`
(the protocol). See docs/sharing.md.

Example:
    >>> from lakehouse_assets.sharing import mount
    >>> mount(app, settings, secret)          # the server's app does this
"""

from lakehouse_assets.sharing.recipients import Recipient, SharingError, issue, profile
from lakehouse_assets.sharing.routes import PREFIX, SHARE, mount
from lakehouse_assets.tokens import Revocations

__all__ = [
    "PREFIX",
    "SHARE",
    "Recipient",
    "Revocations",
    "SharingError",
    "issue",
    "mount",
    "profile",
]
