"""The embedded store: node summaries in one SQLite file, through sqlite-utils.

The default engine, for a cluster whose deliverers reach one disk. The schema and the
rules are base.py's; migrations are sqlite-utils' (sqlite_schema.py), loaded by writers
only: a reader needs nothing beyond the standard library's sqlite3.
"""

from __future__ import annotations

import fcntl
import grp
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import SpoolError, StoreError, StoreRejected
from ..model import NodeSummary
from .base import MIGRATION_SET, NODE_KEY, SCHEMA, Store, gpu_rows, newer, node_row, run_of


class SqliteStore(Store):
    dialect = "sqlite"

    def __init__(self, path: str, readonly: bool = False, admin_group: str = "") -> None:
        self.path, self.readonly, self.where = path, readonly, path
        try:
            if readonly:
                if not os.path.exists(path):
                    raise StoreError(f"no GPU data has been stored yet ({path} does not exist)")
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            else:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                keep_private(path, admin_group)
                conn = sqlite3.connect(path, timeout=30)
            self.conn = conn
            self._check_not_newer()
            if not readonly:
                self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc

    def _migrate(self) -> None:
        import sqlite_utils

        from .sqlite_schema import migrations

        self.db = sqlite_utils.Database(self.conn)
        if migrations.pending(self.db):
            # Hundreds of deliverers may open a new store at once: one migrates, the
            # others wait for it (two writers upgrading at once get SQLITE_BUSY at once,
            # whatever the timeout), then find nothing left to do.
            with self._writing():
                migrations.apply(self.db)

    def schema(self) -> list[str]:
        if not self.conn.execute("select 1 from sqlite_master where name = '_sqlite_migrations'").fetchone():
            return []
        return [name for (name,) in self.conn.execute(
            "select name from _sqlite_migrations where migration_set = ? order by rowid", (MIGRATION_SET,))]

    def _check_not_newer(self) -> None:
        """A store that a newer slurm-gpu-eff has migrated is never written by this one (nor
        read as if it knew its shape): a clear error, not silent damage."""
        unknown = [name for name in self.schema() if name not in SCHEMA]
        if unknown:
            raise StoreError(f"the store {self.path} was upgraded by a newer slurm-gpu-eff "
                             f"(schema {', '.join(unknown)}): upgrade this one to use it")

    def put(self, summary: NodeSummary) -> bool:
        if self.readonly:
            raise StoreError(f"cannot write to store {self.path}: it was opened read-only")
        key = (summary.cluster, summary.job_id, summary.node, run_of(summary))
        where = " and ".join(f"{column} = ?" for column in NODE_KEY)
        conn = self.conn
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
        query, args = "select body from node_summaries where job_id = ?", [job_id]
        if cluster:
            query, args = query + " and cluster = ?", args + [cluster]
        try:
            rows = self.conn.execute(query + " order by run, node", args).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise StoreError(f"no GPU data has been stored yet ({self.path} has no tables)") from exc
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc
        try:
            return [NodeSummary.from_json(body) for (body,) in rows]
        except SpoolError as exc:  # a row someone edited or truncated
            raise StoreError(f"store {self.path} holds a corrupt summary of job {job_id}: {exc}") from exc

    def read(self, text: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            cursor = self.conn.execute(text, args)
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise StoreError(f"the store {self.path} has no usage tables yet: a writer's "
                                 "`gpueff report` (root) makes them") from exc
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def put_usage(self, job_rows: list[dict[str, Any]], node_rows: list[dict[str, Any]],
                  sync: dict[str, Any]) -> None:
        from .usage import longest_of, refresh_days, spans_before, spans_of, write_rows

        with self._usage_write() as conn:
            before = spans_before(self._run, job_rows)
            for table, key, rows in write_rows(job_rows, node_rows):
                where = " and ".join(f'"{k}" = ?' for k in key[:3])
                conn.executemany(f"delete from {table} where {where}",
                                 {tuple(r[k] for k in key[:3]) for r in rows})
                _insert(conn, table, rows)
            _insert(conn, "usage_syncs", [sync])
            refresh_days(self._run, self.dialect, before + spans_of(job_rows), longest_of(job_rows))

    def refresh_usage_days(self, since: float, until: float) -> int:
        from .usage import refresh_days

        with self._usage_write():
            return refresh_days(self._run, self.dialect, [(since, until)])

    @contextmanager
    def _usage_write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the usage tables, in the writers' queue; its failures
        the store's errors."""
        if self.readonly:
            raise StoreError(f"cannot write to store {self.path}: it was opened read-only")
        conn = self.conn
        try:
            with self._writing():
                conn.execute("begin immediate")
                try:
                    yield conn
                    conn.execute("commit")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("rollback")
                    raise
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to store {self.path}: {exc}") from exc

    def _run(self, text: str, args: dict[str, Any]) -> list[tuple[Any, ...]]:
        return self.conn.execute(text, args).fetchall()

    def close(self) -> None:
        self.conn.close()


def keep_private(path: str, admin_group: str = "") -> None:
    """The store file is root's and admin_group's alone (0640; 0600 without a group):
    users read their figures through Slurm (mirror.py), and a user who could open the file
    could hold a read lock that stalls every writer. Made so before SQLite first opens it
    (no moment with the umask's mode), and put right if an older version left it readable.
    SQLite gives its journal the file's mode and owner."""
    try:
        gid = grp.getgrnam(admin_group).gr_gid if admin_group else None
    except KeyError as exc:
        raise StoreError(f"[store] admin_group {admin_group!r} is not a group on this host") from exc
    mode = 0o640 if gid is not None else 0o600
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            st = os.fstat(fd)
            if gid is not None and st.st_gid != gid and os.geteuid() == 0:
                os.fchown(fd, -1, gid)
            if st.st_mode & 0o777 != mode:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(f"cannot open store {path}: {exc.strerror or exc}") from exc


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
    names = ", ".join(f'"{c}"' for c in columns)  # quoted: "user" is a column
    conn.executemany(
        f"{verb} into {table} ({names}) values ({', '.join('?' * len(columns))})",
        [[row[c] for c in columns] for row in rows],
    )


