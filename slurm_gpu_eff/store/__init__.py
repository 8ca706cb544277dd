"""Where node summaries go: the store engines, and delivery from the node spool.

`open_store(url)` picks the engine from the URL: `sqlite:///PATH` (the embedded default,
sqlite.py) or `postgresql://...` (postgres.py, for many nodes writing at once). Both keep
the same schema and the same rules (see base.py); an engine's module and its driver are
imported only when a URL names it.
"""

from __future__ import annotations

from ..errors import StoreError
from .base import Store, shown_url

__all__ = ["Store", "open_store", "prepare"]


def prepare(url: str) -> None:
    """The engine a URL names, loaded ahead: `gpueff JOBID` does it while sacct answers,
    for a job whose figures the store holds (SQLite only: psycopg's import costs more
    than its reports would save)."""
    if url.startswith("sqlite://"):
        from . import sqlite  # noqa: F401


def open_store(url: str, readonly: bool = False, admin_group: str = "") -> Store:
    """The store a URL names; a SQLite file a writer opens is made root's and admin_group's
    alone (a PostgreSQL server keeps its own rules: its roles)."""
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(url, readonly=readonly)
    if url.startswith("sqlite://"):
        from .sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://"), readonly=readonly, admin_group=admin_group)
    raise StoreError(f"unknown store URL {shown_url(url)!r}: use sqlite:///PATH or postgresql://...")

