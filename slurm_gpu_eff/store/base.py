"""What every store engine is: the interface, the rows, and the rule for which summary wins.

One row per (cluster, job, node, run) with the whole summary as JSON, and one row per GPU
(a MIG slice apart by its GPU instance) with the figures admin reports aggregate. Writes
are idempotent and ordered: a final summary is never replaced by a live snapshot that
arrives late, and an older snapshot never replaces a newer one, so deliveries may be
retried, duplicated or reordered without harm.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any

from ..model import GpuSummary, NodeSummary

# The schema's versions, oldest first: each engine has a migration of each name, and a
# store holding a name not here was migrated by a newer slurm-gpu-eff.
SCHEMA = ("m001_summaries", "m002_mig_slices_apart", "m003_runs_apart", "m004_usage", "m005_usage_days",
          "m006_usage_days_hints")
MIGRATION_SET = "slurm-gpu-eff"

NODE_KEY = ("cluster", "job_id", "node", "run")
GPU_KEY = (*NODE_KEY, "minor", "mig_gi_id")

# The usage tables (issue 10): one row per GPU job run from Slurm's accounting (`usage`)
# and one per job run and node (`usage_nodes`, for reports by node), each with the
# figures `gpueff JOBID` gives it, so that a usage report over a period is a grouped
# scan (store/usage.py; whole days come from the rollup below). Seconds, not hours: sums
# stay exact. Filled by the report's sync.
USAGE_KEY = ("cluster", "job_id", "start_at")
USAGE_COLUMNS: dict[str, type] = {
    "cluster": str, "job_id": str,
    "start_at": int,  # the allocation's start (epoch s): a requeued job's runs stay apart
    "end_at": float,  # start_at + elapsed (a running job: when it was last synced)
    "running": int, "user": str, "account": str, "partition": str, "state": str,
    "gpu_model": str, "gpus": int,  # allocated (on this node, in usage_nodes)
    # Where the figures stand: complete, partial (cut short, or a live copy), missing
    # (the node said why), none (no summary at all: the monitoring never saw it).
    "figures": str,
    "measured_gpus": int,  # GPUs with a utilisation figure
    "used_gpu_s": float,  # sum over measured GPUs of utilisation x elapsed, as gpueff JOBID
    "idle_gpus": int, "sm_gpus": int, "sm_used_gpu_s": float,  # GPM: SM activity x elapsed
    "mem_peak_pct": float,  # the highest GPU memory peak, in % of its device
    "energy_j": float, "sampled_gpu_s": float,
    **{f"util_h{i}": float for i in range(10)},  # GPU-seconds sampled in 0-10%, ..., 90-100%
    "hint_mask": int,  # warning and critical hints, one bit each (HINT_BITS)
    "main_hint": str, "main_severity": str, "main_message": str,
}
USAGE_NODE_KEY = (*USAGE_KEY, "node")
# A rule's bit in hint_mask: append only, never reorder (stored masks keep their meaning).
# Every rule has one (tests/unit/test_store_hints.py), info-only rules too, as before.
HINT_BITS = ("idle_gpus", "low_util", "falsely_busy", "tensor_cores_unused", "memory_bound",
             "gpu_memory", "pcie_bound", "nvlink_bound", "spread_nodes", "cpu_side", "time_limit",
             "short_job", "hardware", "idle_stretch",
             # issue 23's rules (m006 gives the rollup their columns)
             "too_early", "low_sm", "imbalance", "idle_mig", "idle_interactive", "main_loading",
             "node_share")
# The rules whose columns m005 made in the rollup: a migration makes a table as it was
# then, whatever the rules are now; each later migration adds its own.
HINTS_M005 = HINT_BITS[:14]

# The daily rollup (m005): per local day and (cluster, user, account, partition, GPU
# model), the sums a report adds up (store/usage.py SUMS: GPU-seconds clipped to the
# day; runs counted on the day they ended), and `mem`: the memory peaks (whole percents of
# the device, space-separated) of the runs that ended that day, for the medians.
# put_usage keeps it in step with `usage`, so a report over a month reads some 30 x 2,000
# rollup rows instead of every run (issue 10's bench).
USAGE_DAY_GROUP = ("cluster", "user", "account", "partition", "gpu_model")
USAGE_SUM_COLUMNS: dict[str, type] = {
    "jobs": int, "alloc_gpu_s": float, "measured_gpu_s": float, "used_gpu_s": float,
    "idle_gpu_s": float, "jobs_idle": int, "sm_gpu_s": float, "sm_used_gpu_s": float,
    "energy_j": float, "energy_gpu_s": float, "sampled_gpu_s": float, "complete_gpu_s": float,
    "partial_gpu_s": float, "missing_gpu_s": float,
    **{f"util_h{i}": float for i in range(10)},
    **{f"hint_{rule}": int for rule in HINT_BITS},
}
USAGE_DAY_COLUMNS: dict[str, type] = {
    "d0": float, "d1": float, "day": str, **{k: str for k in USAGE_DAY_GROUP}, **USAGE_SUM_COLUMNS,
    "mem": str}
# The days the rollup holds (even a day without runs), and the longest run stored: a run
# touching a window [a, b) ended before b + that, which bounds every scan by end_at.
USAGE_MADE_COLUMNS: dict[str, type] = {"d0": float, "d1": float, "day": str}
# The rollup as m005 made it, and the columns m006 adds to it.
USAGE_DAY_COLUMNS_M005 = {name: kind for name, kind in USAGE_DAY_COLUMNS.items()
                          if not name.startswith("hint_") or name[len("hint_"):] in HINTS_M005}
USAGE_DAY_COLUMNS_M006 = [f"hint_{rule}" for rule in HINT_BITS if rule not in HINTS_M005]


class Store(ABC):
    """An open store. Raises StoreError when it cannot be reached (the summary waits and
    is retried) and StoreRejected for a summary it will never take (set aside)."""

    where: str  # the file or the server, for messages (never a password)

    @abstractmethod
    def put(self, summary: NodeSummary) -> bool:
        """Store a node summary unless a final or newer one is there; True if stored."""

    @abstractmethod
    def node_summaries(self, job_id: str, cluster: str | None = None) -> list[NodeSummary]:
        """A job's node summaries, every run, by run then node."""

    dialect: str  # "sqlite" or "postgresql": how its SQL differs (store/usage.py)

    @abstractmethod
    def read(self, text: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows of a query written with `:name` parameters (store/usage.py)."""

    @abstractmethod
    def put_usage(self, job_rows: list[dict[str, Any]], node_rows: list[dict[str, Any]],
                  sync: dict[str, Any]) -> None:
        """Replace these runs' usage rows (per job, per node), make the daily rollup anew
        for the days they touch, and record the sync, at once."""

    @abstractmethod
    def refresh_usage_days(self, since: float, until: float) -> int:
        """Make the daily rollup anew for the local days from since's to until's (a bulk
        load, or days a store from before the rollup lacks); the number of days."""

    @abstractmethod
    def schema(self) -> list[str]:
        """The migrations applied to this store, in order (`gpueff doctor`)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def shown_url(url: str) -> str:
    """A store URL fit for messages and logs: no password, no query (it may name one)."""
    from urllib.parse import urlsplit

    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: show no more than the scheme
        return f"{url.split('://', 1)[0]}://..."
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def newer(new: NodeSummary, old_status: str, old_sampled_until: float | None) -> bool:
    """Does `new` replace what is stored? A final summary beats a live one, whatever the
    order they arrive in; between two of a kind, the later sampled wins (a tie rewrites
    the same figures: deliveries are idempotent)."""
    old_final = old_status != "running"
    if old_final != new.final:
        return new.final
    return (new.sampled_until or 0) >= (old_sampled_until or 0)


def run_of(s: NodeSummary) -> int:
    """The run a summary belongs to: when its prolog ran, in whole seconds (0: unknown)."""
    return int(s.run_started_at or 0)


def node_row(s: NodeSummary) -> dict[str, Any]:
    return {
        "cluster": s.cluster, "job_id": s.job_id, "node": s.node, "run": run_of(s), "status": s.status,
        "reason": s.reason, "user": s.user, "account": s.account, "partition": s.partition,
        "gpu_count": len(s.gpus), "sampled_from": s.sampled_from,
        "sampled_until": s.sampled_until, "ended_at": s.ended_at,
        "body": json.dumps(s.to_dict(), separators=(",", ":")),
    }


def gpu_rows(s: NodeSummary) -> list[dict[str, Any]]:
    return [_gpu_row(s, g) for g in s.gpus if g.minor is not None]


def _gpu_row(s: NodeSummary, g: GpuSummary) -> dict[str, Any]:
    return {
        "cluster": s.cluster, "job_id": s.job_id, "node": s.node, "run": run_of(s), "minor": g.minor,
        "uuid": g.uuid, "name": g.name, "user": s.user, "account": s.account,
        "partition": s.partition, "status": s.status, "util_mean": g.metric("util"),
        "mem_used_max_bytes": g.metric("mem_used_bytes", "max"),
        "mem_total_bytes": g.memory_total_bytes, "power_mean_w": g.metric("power_w"),
        "energy_j": g.energy_j, "samples": g.samples, "sampled_s": g.sampled_s,
        "sampled_until": s.sampled_until, "mig_gi_id": -1 if g.mig_gi_id is None else g.mig_gi_id,
    }
