"""The SQLite store's schema: sqlite-utils migrations, in order. Imported by writers only,
so that `gpueff` reading the store never loads sqlite-utils; readers check the names
against base.SCHEMA."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils import Migrations

from .base import (
    MIGRATION_SET,
    USAGE_COLUMNS,
    USAGE_DAY_COLUMNS_M005,
    USAGE_DAY_COLUMNS_M006,
    USAGE_KEY,
    USAGE_MADE_COLUMNS,
    USAGE_NODE_KEY,
)

migrations = Migrations(MIGRATION_SET)


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


@migrations()
def m004_usage(db: sqlite_utils.Database) -> None:
    """Usage reports (issue 10): each GPU job run from Slurm's accounting with its figures,
    per job and per job and node; the report scans the period by end_at."""
    db["usage"].create(USAGE_COLUMNS, pk=USAGE_KEY)  # type: ignore[union-attr]
    db["usage_nodes"].create({**USAGE_COLUMNS, "node": str}, pk=USAGE_NODE_KEY)  # type: ignore[union-attr]
    for table in ("usage", "usage_nodes"):
        db[table].create_index(["end_at"])  # type: ignore[union-attr]
    db["usage_syncs"].create(  # type: ignore[union-attr]
        {"cluster": str, "since": float, "until": float, "at": float, "jobs": int},
    )


@migrations()
def m005_usage_days(db: sqlite_utils.Database) -> None:
    """The usage tables' daily rollup (base.py), filled by put_usage from here on; days
    it does not hold yet are read from `usage` itself (store/usage.py)."""
    db["usage_days"].create(USAGE_DAY_COLUMNS_M005)  # type: ignore[union-attr]
    db["usage_days"].create_index(["d0"])  # type: ignore[union-attr]
    db["usage_days_made"].create(USAGE_MADE_COLUMNS, pk="d0")  # type: ignore[union-attr]
    db["usage_bounds"].create({"name": str, "value": float}, pk="name")  # type: ignore[union-attr]


@migrations()
def m006_usage_days_hints(db: sqlite_utils.Database) -> None:
    """The rollup counts issue 23's rules too (base.HINT_BITS). Days made before hold 0
    there, as their runs' masks have none of these bits (a null would break the sums)."""
    for column in USAGE_DAY_COLUMNS_M006:
        db["usage_days"].add_column(column, int, not_null_default=0)  # type: ignore[union-attr]
