"""A job's report: Slurm's accounting joined with the node summaries from the store.

Pure data in, data out; the CLI fetches, this module computes, the renderer formats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .errors import NoGpus, NoSummary
from .hints import Hint, HintSettings, evaluate, verdict
from .model import COMPLETE, MISSING, PARTIAL, RUNNING, GpuSummary, NodeSummary
from .slurm import SlurmJob, expand_hostlist

IDLE_UTIL = 5.0  # percent: a GPU below this on average did no useful work
# Every metric the sampler may measure; the report gives each a _mean and a _max,
# null when it was not measured (not supported here, or no GPM), never 0.
METRICS = (
    "util", "mem_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp16_active", "fp32_active", "fp64_active", "power_w", "temp_c", "sm_clock_mhz",
    "pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_mbps", "nvlink_tx_mbps",
)


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

    @property
    def never_used(self) -> bool:
        """No compute process ever ran on it (known only where processes are readable)."""
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
            shared_fraction=self.shared_fraction, shared_with=g.shared_with,
            util_whole_mean=g.metric("util"),
            mem_used_whole_max_bytes=g.metric("mem_used_bytes", "max"),
            own_util_mean=self.metric("own_util"),
            own_mem_used_max_bytes=self.metric("own_mem_used_bytes", "max"),
            hardware_faults=self.hardware_faults, timeline=g.timeline,
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
    def energy_j(self) -> float | None:
        values = [g.energy_j for g in self.gpus if g.energy_j is not None]
        return sum(values) if values else None

    @property
    def idle_gpus(self) -> list[GpuLine]:
        return [g for g in self.gpus if g.idle]

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
            "notes": self.notes, "verdict": self.verdict,
            "hints": [h.to_dict() for h in self.hints],
            "hardware_faults": [f"{g.node} GPU {g.minor}: {f}" for g in self.gpus
                                for f in g.hardware_faults],
            "gpus": [g.to_dict() for g in self.gpus],
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


def build_group(
    job_id: str, jobs: list[tuple[SlurmJob, list[NodeSummary]]], settings: HintSettings | None = None,
) -> GroupReport:
    kind = "heterogeneous" if any("+" in job.job_id for job, _ in jobs) else "array"
    reports, unreported = [], []
    for job, summaries in jobs:
        try:
            reports.append(build_report(job, summaries, settings))
        except (NoGpus, NoSummary) as exc:
            unreported.append((job.job_id, str(exc)))
    if not reports:
        raise NoSummary(f"no GPU figures for any of the {len(jobs)} parts of {kind} job {job_id}")
    return GroupReport(job_id, kind, reports, unreported)


def build_report(
    job: SlurmJob, summaries: list[NodeSummary], settings: HintSettings | None = None,
) -> JobReport:
    """Join accounting and summaries, then judge them (hints, verdict); raises NoGpus /
    NoSummary when there is nothing to show."""
    if not summaries:
        if job.gpus == 0:
            raise NoGpus(f"job {job.job_id} has no GPUs: nothing to report here (seff covers CPU jobs)")
        if job.state == "PENDING":
            raise NoSummary(f"job {job.job_id} has not started yet")
        raise NoSummary(
            f"no GPU figures stored for job {job.job_id}: its sampler did not run, or its "
            "summary has not been delivered yet (see the gpueff log on its nodes)"
        )
    gpus = [_gpu_line(s, g) for s in summaries for g in s.gpus]
    seen = {s.node for s in summaries}
    expected = expand_hostlist(job.nodelist)
    missing_nodes = [n for n in expected if n not in seen]
    notes = []
    for s in summaries:
        if s.status in (PARTIAL, MISSING):
            notes.append(f"{s.node}: {s.status}: {s.reason}")
        elif s.status == RUNNING and not job.running:
            notes.append(f"{s.node}: the final summary has not been delivered yet; figures up "
                         f"to {clock(s.sampled_until)} from a live snapshot")
    if missing_nodes and not job.running:
        notes.append(f"no summary from node(s) {', '.join(missing_nodes)}: their figures are missing")
    for g in gpus:
        notes.extend(f"{g.node} GPU {g.minor}: {e}" for e in g.errors)
        if g.shared_fraction:
            own = g.metric("own_util")
            notes.append(
                f"{g.node} GPU {g.minor} was shared with "
                f"{', '.join(g.summary.shared_with if g.summary else []) or 'other work'} "
                f"{100 * g.shared_fraction:.0f}% of the time: "
                + ("its figures are the whole GPU's" if own is None else
                   f"this job's own processes kept it {own:.1f}% busy (the whole GPU: "
                   f"{g.metric('util') or 0:.1f}%); power and energy are the whole GPU's")
            )
    until = max((s.sampled_until for s in summaries if s.sampled_until), default=None)
    report = JobReport(job, _status(job, summaries, missing_nodes), gpus, missing_nodes, notes, until)
    report.hints = evaluate(report, settings)
    report.verdict = verdict(report, report.hints)
    return report


def _status(job: SlurmJob, summaries: list[NodeSummary], missing_nodes: list[str]) -> str:
    statuses = {s.status for s in summaries}
    if job.running:
        return RUNNING
    if statuses == {COMPLETE} and not missing_nodes:
        return COMPLETE
    if statuses == {MISSING}:
        return MISSING
    return PARTIAL


def _gpu_line(s: NodeSummary, g: GpuSummary) -> GpuLine:
    # On a GPU shared with other jobs, what the job is charged with (utilisation, memory)
    # is its own processes' share where NVML could attribute it; power cannot be split.
    shared = bool(g.shared_s)
    own_util, own_mem = g.metric("own_util"), g.metric("own_mem_used_bytes", "max")
    return GpuLine(
        node=g.node, minor=g.minor, uuid=g.uuid, name=g.name, status=s.status,
        util_mean=own_util if shared and own_util is not None else g.metric("util"),
        util_max=g.metric("util", "max"), mem_util_mean=g.metric("mem_util"),
        mem_used_max_bytes=own_mem if shared and own_mem is not None else g.metric("mem_used_bytes", "max"),
        mem_total_bytes=g.memory_total_bytes, power_mean_w=g.metric("power_w"),
        power_max_w=g.metric("power_w", "max"), power_limit_w=g.power_limit_w,
        energy_j=g.energy_j, energy_source=g.energy_source, samples=g.samples,
        sampled_s=g.sampled_s, errors=list(g.errors), summary=g,
    )


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
