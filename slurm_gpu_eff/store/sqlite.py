"""The embedded store: node summaries in one SQLite file, through sqlite-utils.

The default engine, for a cluster whose deliverers reach one disk. The schema and the
rules are base.py's; migrations are sqlite-utils'.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlite_utils
from sqlite_utils import Migrations

from ..errors import SpoolError, StoreError, StoreRejected
from ..model import NodeSummary
from .base import NODE_KEY, Store, gpu_rows, newer, node_row, run_of

migrations = Migrations("slurm-gpu-eff")


@migrations()
def m001_summaries(db: sqlite_utils.Database) -> None:
    db["node_summaries"].create(  # type: ignore[union-attr]
        {
            "cluster": str, "job_id": str, "node": str, "status": str, "reason": str,
            "user": str, "account": str, "partition": str, "gpu_count": int,
            "sampled_from": float, "sampled_until": float, "ended_at": float, "body": str,
        },
        pk=("cluster", "job_id", "node"),
    )
    db["gpus"].create(  # type: ignore[union-attr]
        {
            "cluster": str, "job_id": str, "node": str, "minor": int, "uuid": str, "name": str,
            "user": str, "account": str, "partition": str, "status": str,
            "util_mean": float, "mem_used_max_bytes": float, "mem_total_bytes": int,
            "power_mean_w": float, "energy_j": float, "samples": int, "sampled_s": float,
            "sampled_until": float,
        },
        pk=("cluster", "job_id", "node", "minor"),
    )
    db["gpus"].create_index(["sampled_until"])  # type: ignore[union-attr]
    db["gpus"].create_index(["user", "sampled_until"])  # type: ignore[union-attr]


@migrations()
def m002_mig_slices_apart(db: sqlite_utils.Database) -> None:
    """Two MIG slices of one GPU share its minor: a GPU row is keyed by its GPU instance
    too (-1 for a whole GPU), or a job on two slices breaks the key at every delivery."""
    db["gpus"].add_column("mig_gi_id", int, not_null_default=-1)  # type: ignore[union-attr]
    db["gpus"].transform(pk=("cluster", "job_id", "node", "minor", "mig_gi_id"))  # type: ignore[union-attr]


@migrations()
def m003_runs_apart(db: sqlite_utils.Database) -> None:
    """A requeued job keeps its id, and Slurm may give an id out again: rows are keyed by
    the run too (when its prolog ran, whole seconds; 0 where it is not known)."""
    for table, pk in (("node_summaries", ("cluster", "job_id", "node", "run")),
                      ("gpus", ("cluster", "job_id", "node", "run", "minor", "mig_gi_id"))):
        db[table].add_column("run", int, not_null_default=0)  # type: ignore[union-attr]
        db[table].transform(pk=pk)  # type: ignore[union-attr]


class SqliteStore(Store):
    def __init__(self, path: str, readonly: bool = False) -> None:
        self.path, self.readonly, self.where = path, readonly, path
        try:
            if readonly:
                if not os.path.exists(path):
                    raise StoreError(f"no GPU data has been stored yet ({path} does not exist)")
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            else:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                conn = sqlite3.connect(path, timeout=30)
            self.db = sqlite_utils.Database(conn)
            self._check_not_newer()
            if not readonly and migrations.pending(self.db):
                # Hundreds of deliverers may open a new store at once: one migrates, the
                # others wait for it (two writers upgrading at once get SQLITE_BUSY at once,
                # whatever the timeout), then find nothing left to do.
                with self._writing():
                    migrations.apply(self.db)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc

    def _check_not_newer(self) -> None:
        """A store that a newer slurm-gpu-eff has migrated is never written by this one (nor
        read as if it knew its shape): a clear error, not silent damage."""
        known = {m.name for m in migrations._migrations}
        unknown = [m.name for m in migrations.applied(self.db) if m.name not in known]
        if unknown:
            raise StoreError(f"the store {self.path} was upgraded by a newer slurm-gpu-eff "
                             f"(schema {', '.join(unknown)}): upgrade this one to use it")

    def put(self, summary: NodeSummary) -> bool:
        if self.readonly:
            raise StoreError(f"cannot write to store {self.path}: it was opened read-only")
        key = (summary.cluster, summary.job_id, summary.node, run_of(summary))
        where = " and ".join(f"{column} = ?" for column in NODE_KEY)
        conn = self.db.conn
        try:
            with self._writing():
                return self._put(conn, summary, key, where)
        except (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError, TypeError,
                ValueError, OverflowError) as exc:
            # The store will never take this one: retrying it would hold up the others.
            raise StoreRejected(f"the store rejects {summary.job_id} on {summary.node}: {exc}") from exc
        except sqlite3.Error as exc:  # locked, disk full, I/O: the store may come back
            raise StoreError(f"cannot write to store {self.path}: {exc}") from exc

    def _put(self, conn: sqlite3.Connection, summary: NodeSummary, key: tuple[Any, ...],
             where: str) -> bool:
        # The read and the writes under one write lock: two deliveries racing (a live
        # snapshot and the epilog's final summary) cannot interleave.
        conn.execute("begin immediate")
        try:
            old = conn.execute(
                f"select status, sampled_until from node_summaries where {where}", key
            ).fetchone()
            if old is not None and not newer(summary, old[0], old[1]):
                conn.execute("rollback")
                return False
            _insert(conn, "node_summaries", [node_row(summary)], replace=True)
            conn.execute(f"delete from gpus where {where}", key)
            _insert(conn, "gpus", gpu_rows(summary))
            conn.execute("commit")
        except BaseException:
            if conn.in_transaction:
                conn.execute("rollback")
            raise
        return True

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Writers take turns in the kernel's queue for {path}.lock before SQLite's lock.

        SQLite's busy handler polls, sleeping up to 100 ms between tries, and a newcomer
        polling at 1 ms overtakes writers that wait: with 25 nodes delivering at once, one
        deliverer waited out its whole 30 s on a slow CI disk (2026-11-23). flock waiters
        are woken the moment the holder lets go. The file is 0600: no user can hold it."""
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _flock_within(fd, WRITE_WAIT_S):
                raise StoreError(f"the store {self.path} stayed busy for {WRITE_WAIT_S:g} s "
                                 "(other writers queued before this one)")
            yield
        finally:
            os.close(fd)  # lets go of the lock
    def node_summaries(self, job_id: str, cluster: str | None = None) -> list[NodeSummary]:
        where, args = "job_id = ?", [job_id]
        if cluster:
            where, args = where + " and cluster = ?", args + [cluster]
        try:
            rows = self.db["node_summaries"].rows_where(where, args, order_by="run, node")
            return [NodeSummary.from_dict(json.loads(r["body"])) for r in rows]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc
        except (ValueError, SpoolError) as exc:  # a row someone edited or truncated
            raise StoreError(f"store {self.path} holds a corrupt summary of job {job_id}: {exc}") from exc

    def close(self) -> None:
        self.db.conn.close()


WRITE_WAIT_S = 60.0  # a writer's longest wait in the queue; the holder's own wait on
# readers is SQLite's busy timeout (30 s), so a queue moves unless a reader holds the file


def _flock_within(fd: int, wait_s: float) -> bool:
    """flock(fd) exclusively, waiting up to wait_s in the kernel's queue (not polling).
    The blocking call waits in a thread on a duplicate of fd: when we give up first, the
    thread lets go as soon as it is granted (closing the last descriptor frees it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    waiter = os.dup(fd)
    granted = threading.Event()
    decided = threading.Lock()
    gave_up = False

    def wait() -> None:
        try:
            fcntl.flock(waiter, fcntl.LOCK_EX)
            with decided:
                if not gave_up:
                    granted.set()
        finally:
            os.close(waiter)  # fd keeps the lock when granted, or nothing holds it

    threading.Thread(target=wait, daemon=True, name="store-queue").start()
    granted.wait(wait_s)
    with decided:
        gave_up = not granted.is_set()
    return not gave_up


def _insert(conn: sqlite3.Connection, table: str, rows: list[dict[str, Any]], replace: bool = False) -> None:
    if not rows:
        return
    columns = list(rows[0])
    verb = "insert or replace" if replace else "insert"
    conn.executemany(
        f"{verb} into {table} ({', '.join(columns)}) values ({', '.join('?' * len(columns))})",
        [[row[c] for c in columns] for row in rows],
    )


