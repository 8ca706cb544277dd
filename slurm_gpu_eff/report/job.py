"""A job's report: Slurm's accounting joined with the node summaries from the store.

Pure data in, data out; the CLI fetches, this module computes, the renderer formats.
"""

from __future__ import annotations

from ..errors import NoGpus, NoSummary
from ..hostlist import expand_hostlist
from ..model import COMPLETE, MISSING, PARTIAL, RUNNING, GpuSummary, NodeSummary
from ..slurm import SlurmJob
from .hints import HintSettings, evaluate, verdict
from .shapes import GpuLine, GroupReport, JobReport, clock


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
    binding = {s.node: s.binding for s in summaries if s.binding}
    for node, check in binding.items():
        if check.get("status") == "mismatch":
            notes.append(f"{node}: the GPUs measured may not be the job's own: "
                         + "; ".join(check.get("evidence", [])[:3]))
    until = max((s.sampled_until for s in summaries if s.sampled_until), default=None)
    report = JobReport(job, _status(job, summaries, missing_nodes), gpus, missing_nodes, notes, until,
                       binding=binding)
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
