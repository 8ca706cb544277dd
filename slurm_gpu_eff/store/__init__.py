"""Where node summaries go: the store engines, and delivery from the node spool.

`open_store(url)` picks the engine from the URL: `sqlite:///PATH` (the embedded default,
sqlite.py) or `postgresql://...` (postgres.py, for many nodes writing at once). Both keep
the same schema and the same rules (see base.py); an engine's module and its driver are
imported only when a URL names it.
"""

from __future__ import annotations

from ..errors import StoreError
from .base import Store

__all__ = ["Store", "open_store"]


def open_store(url: str, readonly: bool = False) -> Store:
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(url, readonly=readonly)
    if url.startswith("sqlite://"):
        from .sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://"), readonly=readonly)
    raise StoreError(f"unknown store URL {_shown(url)!r}: use sqlite:///PATH or postgresql://...")


def _shown(url: str) -> str:
    """A URL fit for an error message: no password."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        who, host = rest.split("@", 1)
        return f"{scheme}://{who.split(':', 1)[0]}:***@{host}" if ":" in who else url
    return url
