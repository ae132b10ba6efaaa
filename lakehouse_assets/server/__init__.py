"""The lakehouse over HTTP: ``lakehouse serve`` and the remote client.

A FastAPI app over the tenant API (:mod:`lakehouse_assets.lake`), above it in
the layers like ``cli/`` and ``defs/``: nothing below imports this package.
Every route calls the facade or an operation, never a table, so the HTTP
surface and the CLI cannot drift apart. One module per route group:

- :mod:`.auth`       bearer tokens (ours and the peer's shape), ``/_auth/validate``
- :mod:`.archive`    upload, metadata, download, delete of archived files
- :mod:`.writes`     NDJSON bulk writes of entities and statements, deletes
- :mod:`.reads`      get entity, queries streamed as NDJSON, versions, status
- :mod:`.exports`    the dataset's export files with ETag, If-None-Match and Range
- :mod:`.operations` flush, make, export, compact, optimize on a background worker
  (as Dagster runs when ``DAGSTER_HOME`` names an instance)
- :mod:`.queue`      the queue push, as the token's tenant
- :mod:`.app`        the app factory: middleware, error mapping, health
- :mod:`.deps`, :mod:`.files` what the routes share; ETag/Range file answers
- :mod:`.serve`      ``lakehouse serve`` on uvicorn

:mod:`.client` (``RemoteLakehouse``) speaks to the app over HTTP and imports
none of it; this ``__init__`` imports nothing, so the client does not pull in
FastAPI.
"""
