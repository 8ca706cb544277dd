"""The report's shapes: a job's GPU lines, the job report, an array's group, a hint.

Data and the figures derived from it only. `job` builds them, `hints` reads them,
`render` formats them: none of those three imports another for these shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..model import IDLE_UTIL, GpuSummary
from ..slurm.records import SlurmJob

# Every metric the sampler may measure; the report gives each a _mean and a _max,
# null when it was not measured (not supported here, or no GPM), never 0.
METRICS = (
    "util", "mem_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp16_active", "fp32_active", "fp64_active", "power_w", "temp_c", "sm_clock_mhz",
    "pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_mbps", "nvlink_tx_mbps",
)


ANOTHER_JOB = "another job"


def with_another_job(shared_with: list[str]) -> bool:
    return any(name.startswith("job ") for name in shared_with)


def shared_with_shown(shared_with: list[str]) -> list[str]:
    """Whom a GPU was shared with, as the job's owner may read it: another job is never
    named (its id, with sacct, gives its user and account, which PrivateData hides)."""
    return sorted({ANOTHER_JOB if name.startswith("job ") else name for name in shared_with})


@dataclass
class GpuLine:
    node: str
    minor: int | None
    uuid: str | None
    name: str | None
    status: str
    util_mean: float | None
    util_max: float | None
    mem_util_mean: float | None
    mem_used_max_bytes: float | None
    mem_total_bytes: int | None
    power_mean_w: float | None
    power_max_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    energy_source: str | None
    samples: int
    sampled_s: float
    errors: list[str]
    summary: GpuSummary | None = None

    @property
    def idle(self) -> bool:
        return self.util_mean is not None and self.util_mean < IDLE_UTIL

    def util_timeline(self) -> tuple[list[float | None], float]:
        """The timeline's utilisation per bucket (None where a bucket was not measured), and
        the buckets' width in seconds; ([], 0.0) where the summary has no timeline."""
        timeline = self.summary.timeline if self.summary is not None else None
        if not isinstance(timeline, dict) or "util" not in (timeline.get("fields") or []):
            return [], 0.0
        slot = timeline["fields"].index("util")
        points = [pt[slot] if isinstance(pt, list) and len(pt) > slot and isinstance(pt[slot], (int, float))
                  else None for pt in timeline.get("points") or []]
        return points, float(timeline.get("bucket_s") or 0.0)

    @property
    def never_used(self) -> bool:
        """No compute process of the job ever ran on it (another job's does not count; one
        whose job cannot be told does): known only where processes are readable."""
        return self.summary is not None and self.summary.processes_max == 0

    @property
    def hardware_faults(self) -> list[str]:
        """XID errors, uncorrected ECC errors, a lost GPU: the site's problem, not the user's."""
        g = self.summary
        if g is None:
            return []
        faults = [f"XID {e['xid']} at {clock(e['time'])}" for e in g.xid_events]
        if g.ecc_uncorrected:
            faults.append(f"{g.ecc_uncorrected} uncorrected ECC error(s)")
        if g.lost_at is not None:
            faults.append(f"GPU lost at {clock(g.lost_at)}")
        return faults

    @property
    def shared_fraction(self) -> float | None:
        g = self.summary
        if g is None or g.shared_s is None or not g.sampled_s:
            return None
        return min(1.0, g.shared_s / g.sampled_s)

    def metric(self, name: str, stat: str = "mean") -> float | None:
        return None if self.summary is None else self.summary.metric(name, stat)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "summary"}
        g = self.summary
        for name in METRICS:  # the line's own figures (util_mean: the job's share) come first
            out.setdefault(f"{name}_mean", self.metric(name))
            out.setdefault(f"{name}_max", self.metric(name, "max"))
        out["mem_used_mean_bytes"] = self.metric("mem_used_bytes")
        out["temp_max_c"] = self.metric("temp_c", "max")
        if g is None:
            return out
        hist = g.util_histogram_s
        total = sum(hist) if hist else 0.0
        out.update(
            util_source=g.util_source, gpm=g.gpm, mig_gi_id=g.mig_gi_id,
            idle_fraction=None if not total or g.idle_s is None else g.idle_s / total,
            util_histogram=[x / total for x in hist] if hist and total else None,
            throttle_fraction=None if not g.throttle_s or not g.throttle_observed_s else {
                reason: seconds / g.throttle_observed_s for reason, seconds in g.throttle_s.items()
            },
            xid_events=g.xid_events, ecc_uncorrected=g.ecc_uncorrected,
            processes_max=g.processes_max, never_used=self.never_used, lost_at=g.lost_at,
            shared_fraction=self.shared_fraction, shared_with=shared_with_shown(g.shared_with),
            # With another job on the GPU, the whole GPU's figures less this job's own are
            # that job's: not for this job's owner to read (PrivateData=jobs)
            util_whole_mean=None if with_another_job(g.shared_with) else g.metric("util"),
            mem_used_whole_max_bytes=(None if with_another_job(g.shared_with)
                                      else g.metric("mem_used_bytes", "max")),
            own_util_mean=self.metric("own_util"),
            own_mem_used_max_bytes=self.metric("own_mem_used_bytes", "max"),
            hardware_faults=self.hardware_faults, timeline=g.timeline,
            idle_longest_s=None if g.idle_longest is None else g.idle_longest.get("seconds"),
            idle_longest_from_s=None if g.idle_longest is None else g.idle_longest.get("from_s"),
        )
        return out


@dataclass
class JobReport:
    job: SlurmJob
    status: str
    gpus: list[GpuLine]
    missing_nodes: list[str]
    notes: list[str] = field(default_factory=list)
    sampled_until: float | None = None
    hints: list[Hint] = field(default_factory=list)
    verdict: str = ""
    # node -> {"status", "evidence"}: whether the GPUs measured were the job's own
    binding: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""  # where the figures came from: "accounting" (AdminComment) or "store"
    # Frameworks seen in the job's GPU processes, over its nodes ("pytorch", "tensorflow",
    # "jax", "cuda" = CUDA alone); [] seen but none recognised; None not looked at.
    frameworks: list[str] | None = None
    # node -> {"cpus", "mem_mb", "gpus"}: the node's size from Slurm's config; {} unknown
    node_shares: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def binding_status(self) -> str:
        """The worst node's: mismatch, then unverified (or not checked), then verified."""
        found = {b.get("status") for b in self.binding.values()}
        if "mismatch" in found:
            return "mismatch"
        nodes = {g.node for g in self.gpus}
        if found == {"verified"} and nodes <= set(self.binding):
            return "verified"
        return "unverified"

    @property
    def gpu_hours_allocated(self) -> float:
        return self.job.gpus * self.job.elapsed_s / 3600.0

    @property
    def gpu_util_mean(self) -> float | None:
        values = [g.util_mean for g in self.gpus if g.util_mean is not None]
        return sum(values) / len(values) if values else None

    @property
    def gpu_hours_used(self) -> float | None:
        """Allocated GPU-hours weighted by each measured GPU's utilisation."""
        values = [g.util_mean for g in self.gpus if g.util_mean is not None]
        if not values:
            return None
        per_gpu_h = self.job.elapsed_s / 3600.0
        return sum(v / 100.0 * per_gpu_h for v in values)

    @property
    def coverage_pct(self) -> float | None:
        """Seconds sampled over seconds allocated, all GPUs together: a report built on a
        few samples says so (a GPU never sampled counts as nothing sampled)."""
        allocated = self.job.gpus * self.job.elapsed_s
        return None if allocated <= 0 else min(100.0, 100.0 * sum(g.sampled_s for g in self.gpus) / allocated)

    def gpu_coverage_pct(self, g: GpuLine) -> float | None:
        return None if self.job.elapsed_s <= 0 else min(100.0, 100.0 * g.sampled_s / self.job.elapsed_s)

    @property
    def energy_j(self) -> float | None:
        values = [g.energy_j for g in self.gpus if g.energy_j is not None]
        return sum(values) if values else None

    @property
    def idle_gpus(self) -> list[GpuLine]:
        return [g for g in self.gpus if g.idle]

    @property
    def longest_idle(self) -> dict[str, Any] | None:
        """The longest idle stretch of a GPU that did work (a minute or more), or None."""
        stretches = [(float(g.summary.idle_longest.get("seconds") or 0.0), g) for g in self.gpus
                     if not g.idle and g.summary is not None and g.summary.idle_longest]
        seconds, g = max(stretches, key=lambda s: s[0], default=(0.0, None))
        if g is None or seconds < 60 or g.summary is None or g.summary.idle_longest is None:
            return None
        return {"node": g.node, "minor": g.minor, "seconds": seconds,
                "from_s": float(g.summary.idle_longest.get("from_s") or 0.0)}

    def to_dict(self) -> dict[str, Any]:
        job = self.job
        return {
            "job_id": job.job_id, "job_name": job.name, "cluster": job.cluster,
            "user": job.user, "account": job.account, "partition": job.partition,
            "state": job.state, "exit_code": job.exit_code, "elapsed_s": job.elapsed_s,
            "timelimit_s": job.timelimit_s, "nodes": job.nnodes, "nodelist": job.nodelist,
            "cpus": job.ncpus, "cpu_efficiency": job.cpu_efficiency,
            "mem_efficiency": job.mem_efficiency, "mem_allocated_bytes": job.alloc_mem_bytes,
            "mem_used_max_bytes": job.max_rss_bytes, "gpus_allocated": job.gpus,
            "gpu_status": self.status, "gpu_hours_allocated": self.gpu_hours_allocated,
            "gpu_hours_used": self.gpu_hours_used, "gpu_util_mean": self.gpu_util_mean,
            "gpu_energy_j": self.energy_j, "idle_gpus": len(self.idle_gpus),
            "sampled_until": self.sampled_until, "missing_nodes": self.missing_nodes,
            "notes": self.notes, "verdict": self.verdict, "source": self.source,
            "binding": {"status": self.binding_status, "nodes": self.binding},
            "hints": [h.to_dict() for h in self.hints],
            "hardware_faults": [f"{g.node} GPU {g.minor}: {f}" for g in self.gpus
                                for f in g.hardware_faults],
            "coverage_pct": self.coverage_pct, "longest_idle": self.longest_idle,
            "gpus": [{**g.to_dict(), "coverage_pct": self.gpu_coverage_pct(g)} for g in self.gpus],
        }


@dataclass
class GroupReport:
    """An array job's tasks or a heterogeneous job's components, one line each, with totals."""

    job_id: str
    kind: str  # "array" or "heterogeneous"
    reports: list[JobReport]
    unreported: list[tuple[str, str]]  # (task, why no figures)

    def to_dict(self) -> dict[str, Any]:
        allocated = sum(r.gpu_hours_allocated for r in self.reports)
        used = [r.gpu_hours_used for r in self.reports if r.gpu_hours_used is not None]
        energy = [r.energy_j for r in self.reports if r.energy_j is not None]
        measured = sum(r.gpu_hours_allocated for r in self.reports if r.gpu_hours_used is not None)
        return {
            "job_id": self.job_id, "kind": self.kind,
            "tasks": [r.to_dict() for r in self.reports],
            "unreported": [{"job_id": j, "reason": why} for j, why in self.unreported],
            "totals": {
                "tasks": len(self.reports) + len(self.unreported),
                "gpu_hours_allocated": allocated,
                "gpu_hours_used": sum(used) if used else None,
                # GPU-hour weighted: a long task counts for more than a short one
                "gpu_util_mean": 100.0 * sum(used) / measured if used and measured else None,
                "gpu_energy_j": sum(energy) if energy else None,
            },
        }



@dataclass(frozen=True)
class Hint:
    id: str  # the rule's id
    severity: str  # "info" | "warning" | "critical"
    audience: str  # "user" | "admin" (hardware problems are the site's)
    message: str  # one sentence: "<headline>: <detail>."
    evidence: dict[str, Any]  # the measured figures behind it; key names carry units
    fix: str  # the #SBATCH line or code change to make
    savings_gpu_hours: float | None  # on this job; None when it cannot be said
    link: str | None = None  # the site's documentation, from the config
    # "measured": GPU-hours measured idle ("would have saved"); "estimated": a bound or a
    # guess ("up to"), with `savings_how` saying how it was worked out
    savings_kind: str | None = None
    savings_how: str | None = None

    @property
    def savings(self) -> dict[str, Any] | None:
        if self.savings_gpu_hours is None:
            return None
        return {"gpu_hours": self.savings_gpu_hours, "kind": self.savings_kind or "estimated",
                "how": self.savings_how or ""}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "severity": self.severity, "audience": self.audience,
            "message": self.message, "evidence": self.evidence, "fix": self.fix,
            "savings_gpu_hours": self.savings_gpu_hours, "savings": self.savings, "link": self.link,
        }


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
