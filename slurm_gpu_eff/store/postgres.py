"""The PostgreSQL store: one database that the deliverers of hundreds of nodes write at once.

Same tables, keys and rules as the SQLite engine (base.py). A write is one statement that
decides who wins inside the database: `insert ... on conflict do update ... where <the
new one wins>`. The conflicting row is locked by that statement, so two deliveries of one
node summary (a late live copy and the final one) are ordered by PostgreSQL itself, and
deliveries of different summaries never wait for each other.

Migrations are SQL, named as the SQLite engine's are, recorded in gpueff_migrations, and
applied by one opener at a time (a transaction-scoped advisory lock; DDL in PostgreSQL is
transactional, so a migration is all or nothing).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from ..errors import SpoolError, StoreError, StoreRejected
from ..model import NodeSummary
from .base import (
    MIGRATION_SET,
    NODE_KEY,
    SCHEMA,
    USAGE_COLUMNS,
    USAGE_DAY_COLUMNS_M005,
    USAGE_DAY_COLUMNS_M006,
    USAGE_KEY,
    USAGE_MADE_COLUMNS,
    USAGE_NODE_KEY,
    Store,
    gpu_rows,
    node_row,
    run_of,
    shown_url,
)

CONNECT_TIMEOUT_S = 10
# A statement waits this long for a lock or runs this long at most: a deliverer gives up
# (its summaries wait in the spool) rather than hang on a database in trouble.
STATEMENT_TIMEOUT_MS = 30_000
# pg_advisory_xact_lock key for migrations: any constant; this one spells "gpueff".
MIGRATION_LOCK = 0x677075656666

_PG_TYPES = {str: "text", int: "bigint", float: "double precision"}


def _create(table: str, columns: dict[str, type], key: tuple[str, ...], ints: str = "bigint") -> str:
    """`ints`: the rollup's counts are `integer`, whose sum PostgreSQL keeps a bigint (a
    bigint's sum is a numeric: slower, and a Decimal in Python)."""
    types = {**_PG_TYPES, int: ints}
    listed = ", ".join(f'"{name}" {types[kind]}' for name, kind in columns.items())
    keyed = f", primary key ({', '.join(key)})" if key else ""
    return f"create table {table} ({listed}{keyed})"


MIGRATIONS: list[tuple[str, list[str]]] = [
    ("m001_summaries", [
        """create table node_summaries (
            cluster text, job_id text, node text, status text, reason text, "user" text,
            account text, partition text, gpu_count integer, sampled_from double precision,
            sampled_until double precision, ended_at double precision, body text,
            primary key (cluster, job_id, node))""",
        """create table gpus (
            cluster text, job_id text, node text, minor integer, uuid text, name text,
            "user" text, account text, partition text, status text,
            util_mean double precision, mem_used_max_bytes double precision,
            mem_total_bytes bigint, power_mean_w double precision, energy_j double precision,
            samples bigint, sampled_s double precision, sampled_until double precision,
            primary key (cluster, job_id, node, minor))""",
        "create index gpus_sampled_until on gpus (sampled_until)",
        'create index gpus_user_sampled_until on gpus ("user", sampled_until)',
    ]),
    # Two MIG slices of one GPU share its minor: keyed by the GPU instance too (-1: whole GPU).
    ("m002_mig_slices_apart", [
        "alter table gpus add column mig_gi_id integer not null default -1",
        "alter table gpus drop constraint gpus_pkey",
        "alter table gpus add primary key (cluster, job_id, node, minor, mig_gi_id)",
    ]),
    # A requeued job keeps its id, and Slurm may give an id out again: keyed by the run.
    ("m003_runs_apart", [
        "alter table node_summaries add column run bigint not null default 0",
        "alter table node_summaries drop constraint node_summaries_pkey",
        "alter table node_summaries add primary key (cluster, job_id, node, run)",
        "alter table gpus add column run bigint not null default 0",
        "alter table gpus drop constraint gpus_pkey",
        "alter table gpus add primary key (cluster, job_id, node, run, minor, mig_gi_id)",
    ]),
    # Usage reports: each GPU job run from Slurm's accounting with its figures (base.py).
    ("m004_usage", [
        _create("usage", USAGE_COLUMNS, USAGE_KEY),
        _create("usage_nodes", {**USAGE_COLUMNS, "node": str}, USAGE_NODE_KEY),
        "create index usage_end_at on usage (end_at)",
        "create index usage_nodes_end_at on usage_nodes (end_at)",
        """create table usage_syncs (cluster text, since double precision,
            until double precision, at double precision, jobs bigint)""",
    ]),
    # The daily rollup of the usage tables (base.py), filled by put_usage.
    ("m005_usage_days", [
        _create("usage_days", USAGE_DAY_COLUMNS_M005, (), "integer"),
        "create index usage_days_d0 on usage_days (d0)",
        _create("usage_days_made", USAGE_MADE_COLUMNS, ("d0",)),
        "create table usage_bounds (name text primary key, value double precision)",
    ]),
    # The rollup counts issue 23's rules too; days made before hold 0 there (as sqlite_schema).
    ("m006_usage_days_hints", [f'alter table usage_days add column "{column}" integer not null default 0'
                               for column in USAGE_DAY_COLUMNS_M006]),
]

# Which of two summaries of one (cluster, job, node, run) is kept: base.newer, in SQL.
# "old" is the stored row, "excluded" the one offered.
NEWER = """case when (old.status <> 'running') <> (excluded.status <> 'running')
               then excluded.status <> 'running'
               else coalesce(excluded.sampled_until, 0) >= coalesce(old.sampled_until, 0) end"""


class PostgresStore(Store):
    dialect = "postgresql"

    def __init__(self, url: str, readonly: bool = False) -> None:
        self.where, self.readonly = shown_url(url), readonly
        try:
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                        application_name="slurm-gpu-eff")
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach store {self.where}: {_first_line(exc)}") from exc
        try:
            self.conn.execute(f"set statement_timeout = {STATEMENT_TIMEOUT_MS}")
            self.conn.execute(f"set lock_timeout = {STATEMENT_TIMEOUT_MS}")
            self._local_time()
            applied = self._applied()
            self._check_not_newer(applied)
            if readonly:  # the server refuses any write on this session, whatever the role
                self.conn.execute("set default_transaction_read_only = on")
                # Reports' scans: compiling them costs more than it saves (0.3-0.4 s of 2.5 s
                # measured at a million runs, bench/run.py).
                self.conn.execute("set jit = off")
            elif len(applied) < len(MIGRATIONS):
                self._migrate()
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(f"cannot open store {self.where}: {_first_line(exc)}") from exc
        except StoreError:
            self.conn.close()
            raise

    def _local_time(self) -> None:
        """Days and weeks in reports are this host's, as SQLite's 'localtime' gives them."""
        zone = os.environ.get("TZ", "").lstrip(":")
        if not zone:
            path = os.path.realpath("/etc/localtime")
            zone = path.split("/zoneinfo/", 1)[1] if "/zoneinfo/" in path else ""
        if zone:
            try:
                with self.conn.transaction():
                    self.conn.execute("select set_config('TimeZone', %s, false)", (zone,))
            except psycopg.Error:
                pass  # a zone PostgreSQL does not know: the server's own

    def schema(self) -> list[str]:
        return self._applied()

    def _applied(self) -> list[str]:
        if self.conn.execute("select to_regclass('gpueff_migrations')").fetchone() == (None,):
            return []
        rows = self.conn.execute("select name from gpueff_migrations where migration_set = %s",
                                 (MIGRATION_SET,)).fetchall()
        return [name for (name,) in rows]

    def _check_not_newer(self, applied: list[str]) -> None:
        unknown = [name for name in applied if name not in SCHEMA]
        if unknown:
            raise StoreError(f"the store {self.where} was upgraded by a newer slurm-gpu-eff "
                             f"(schema {', '.join(sorted(unknown))}): upgrade this one to use it")

    def _migrate(self) -> None:
        """Apply what is pending, all in one transaction, one opener at a time: the others
        wait on the lock, then find nothing left to do."""
        with self.conn.transaction():
            self.conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            self.conn.execute("""create table if not exists gpueff_migrations (
                migration_set text, name text, applied_at timestamptz not null default now(),
                primary key (migration_set, name))""")
            applied = set(self._applied())
            for name, statements in MIGRATIONS:
                if name in applied:
                    continue
                for statement in statements:
                    self.conn.execute(statement)
                self.conn.execute("insert into gpueff_migrations (migration_set, name) values (%s, %s)",
                                  (MIGRATION_SET, name))

    def put(self, summary: NodeSummary) -> bool:
        if self.readonly:
            raise StoreError(f"cannot write to store {self.where}: it was opened read-only")
        try:
            with self.conn.transaction():
                if self.conn.execute(*_upsert(node_row(summary))).fetchone() is None:
                    return False  # the stored one is final or newer
                key = (summary.cluster, summary.job_id, summary.node, run_of(summary))
                self.conn.execute(
                    sql.SQL("delete from gpus where {}").format(_match(NODE_KEY)), key)
                rows = gpu_rows(summary)
                if rows:
                    with self.conn.cursor() as cursor:
                        cursor.executemany(_insert("gpus", list(rows[0])), [list(r.values()) for r in rows])
            return True
        except (psycopg.IntegrityError, psycopg.DataError, TypeError, ValueError, OverflowError) as exc:
            # The store will never take this one: retrying it would hold up the others.
            raise StoreRejected(f"the store rejects {summary.job_id} on {summary.node}: "
                                f"{_first_line(exc)}") from exc
        except psycopg.Error as exc:  # down, restarting, timed out: it may come back
            raise StoreError(f"cannot write to store {self.where}: {_first_line(exc)}") from exc

    def node_summaries(self, job_id: str, cluster: str | None = None) -> list[NodeSummary]:
        query = "select body from node_summaries where job_id = %s"
        args: list[Any] = [job_id]
        if cluster:
            query, args = query + " and cluster = %s", args + [cluster]
        try:
            rows = self.conn.execute(query + " order by run, node", args).fetchall()
        except psycopg.errors.UndefinedTable as exc:
            raise StoreError(f"no GPU data has been stored yet ({self.where} has no tables)") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot read store {self.where}: {_first_line(exc)}") from exc
        try:
            return [NodeSummary.from_json(body) for (body,) in rows]
        except SpoolError as exc:  # a row someone edited or truncated
            raise StoreError(f"store {self.where} holds a corrupt summary of job {job_id}: {exc}") from exc

    def read(self, text: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        from .usage import placeholders_for

        try:
            cursor = self.conn.execute(placeholders_for(self.dialect, text), args)
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, map(_plain, row), strict=True)) for row in cursor.fetchall()]
        except psycopg.errors.UndefinedTable as exc:
            raise StoreError(f"the store {self.where} has no usage tables yet: a writer's "
                             "`gpueff report` (root) makes them") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot read store {self.where}: {_first_line(exc)}") from exc

    def put_usage(self, job_rows: list[dict[str, Any]], node_rows: list[dict[str, Any]],
                  sync: dict[str, Any]) -> None:
        if self.readonly:
            raise StoreError(f"cannot write to store {self.where}: it was opened read-only")
        from .usage import longest_of, refresh_days, spans_before, spans_of, write_rows

        try:
            with self.conn.transaction(), self.conn.cursor() as cursor:
                run = _runner(cursor)
                before = spans_before(run, job_rows)
                for table, key, rows in write_rows(job_rows, node_rows):
                    if not rows:
                        continue
                    keys = {tuple(r[k] for k in key[:3]) for r in rows}
                    cursor.executemany(sql.SQL("delete from {} where {}").format(
                        sql.Identifier(table), _match(key[:3])), list(keys))
                    cursor.executemany(_insert(table, list(rows[0])), [list(r.values()) for r in rows])
                cursor.execute(_insert("usage_syncs", list(sync)), list(sync.values()))
                refresh_days(run, self.dialect, before + spans_of(job_rows), longest_of(job_rows))
        except psycopg.Error as exc:
            raise StoreError(f"cannot write to store {self.where}: {_first_line(exc)}") from exc

    def refresh_usage_days(self, since: float, until: float) -> int:
        if self.readonly:
            raise StoreError(f"cannot write to store {self.where}: it was opened read-only")
        from .usage import refresh_days

        try:
            with self.conn.transaction(), self.conn.cursor() as cursor:
                return refresh_days(_runner(cursor), self.dialect, [(since, until)])
        except psycopg.Error as exc:
            raise StoreError(f"cannot write to store {self.where}: {_first_line(exc)}") from exc

    def close(self) -> None:
        self.conn.close()


def _runner(cursor: psycopg.Cursor[Any]) -> Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]:
    """store/usage.py's statements (`:name` parameters) on this cursor."""
    from .usage import placeholders_for

    def run(text: str, args: dict[str, Any]) -> list[tuple[Any, ...]]:
        cursor.execute(placeholders_for("postgresql", text), args)
        return [tuple(map(_plain, row)) for row in cursor.fetchall()] if cursor.description else []
    return run


def _upsert(row: dict[str, Any]) -> tuple[sql.Composed, list[Any]]:
    columns = list(row)
    updates = sql.SQL(", ").join(
        sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c)) for c in columns if c not in NODE_KEY)
    statement = sql.SQL("{} on conflict ({}) do update set {} where {} returning 1").format(
        _insert("node_summaries as old", columns), sql.SQL(", ").join(map(sql.Identifier, NODE_KEY)),
        updates, sql.SQL(NEWER))
    return statement, list(row.values())


def _insert(table: str, columns: list[str]) -> sql.Composed:
    return sql.SQL("insert into {} ({}) values ({})").format(
        sql.SQL(table), sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)))


def _match(columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(" and ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns)


def _plain(value: Any) -> Any:
    """PostgreSQL sums integers as numeric (Decimal in Python): as SQLite gives them."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
