"""A job's report: Slurm's accounting joined with the node summaries from the store.

Pure data in, data out; the CLI fetches, this module computes, the renderer formats.
"""

from __future__ import annotations

from ..errors import NoGpus, NoSummary
from ..hostlist import expand_hostlist
from ..model import COMPLETE, MISSING, PARTIAL, RUNNING, GpuSummary, NodeSummary
from ..slurm.records import SlurmJob, local_epoch
from .hints import HintSettings, evaluate, verdict
from .shapes import GpuLine, GroupReport, JobReport, clock, shared_with_shown, with_another_job


def build_group(
    job_id: str, jobs: list[tuple[SlurmJob, list[NodeSummary], str]], settings: HintSettings | None = None,
    node_shares: dict[str, dict[str, int]] | None = None,
) -> GroupReport:
    """The parts of an array or heterogeneous job: (job, summaries, why none) each."""
    kind = "heterogeneous" if any("+" in job.job_id for job, _, _ in jobs) else "array"
    reports, unreported = [], []
    for job, summaries, unavailable in jobs:
        try:
            reports.append(build_report(job, summaries, settings, unavailable, node_shares))
        except (NoGpus, NoSummary) as exc:
            unreported.append((job.job_id, str(exc)))
    if not reports:
        raise NoSummary(f"no GPU figures for any of the {len(jobs)} parts of {kind} job {job_id}")
    return GroupReport(job_id, kind, reports, unreported)


RUN_SLACK_S = 5.0  # the nodes' clocks and the controller's may disagree by this much


def this_run(job: SlurmJob, summaries: list[NodeSummary]) -> tuple[list[NodeSummary], list[NodeSummary]]:
    """The summaries of the run that sacct reports, and those of earlier runs of the same job
    id (a requeue, or an id Slurm gave out again): this run's are from its nodes, and their
    prologs ran once it started (Start is when the allocation began, whole seconds)."""
    if job.state == "PENDING":  # requeued and waiting: every run there is was an earlier one
        return [], list(summaries)
    listed = job.nodelist.strip()
    nodes = {n.strip() for n in expand_hostlist(listed)} if listed not in ("", "None assigned") else None
    mine = [s for s in summaries if nodes is None or s.node in nodes]
    start = local_epoch(job.start)
    if start is None:  # a time sacct did not give: each node's latest run
        latest: dict[str, float] = {}
        for s in mine:
            latest[s.node] = max(latest.get(s.node, 0.0), s.run_started_at or 0.0)
        current = [s for s in mine if (s.run_started_at or 0.0) == latest[s.node]]
    else:
        current = [s for s in mine if not s.run_started_at or s.run_started_at >= start - RUN_SLACK_S]
    return current, [s for s in summaries if s not in current]




def _runs(summaries: list[NodeSummary]) -> str:
    runs = sorted({(s.run_started_at or 0.0, s.node) for s in summaries})
    shown = ", ".join(f"{node} from {clock(at)}" if at else f"{node} (a run before these were dated)"
                      for at, node in runs[:5])
    return shown + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")


def build_report(
    job: SlurmJob, summaries: list[NodeSummary], settings: HintSettings | None = None,
    unavailable: str = "", node_shares: dict[str, dict[str, int]] | None = None,
) -> JobReport:
    """Join accounting and summaries, then judge them (hints, verdict); raises NoGpus /
    NoSummary when there is nothing to show (`unavailable`: why, when the caller knows).
    `node_shares`: node -> {"cpus", "mem_mb", "gpus"} from Slurm's node config, if known."""
    summaries, earlier = this_run(job, summaries)
    if not summaries:
        if earlier:
            now = "is pending again" if job.state == "PENDING" else "has no GPU figures stored yet"
            raise NoSummary(f"this run of job {job.job_id} {now} (earlier runs: {_runs(earlier)})")
        if job.gpus == 0:
            raise NoGpus(f"job {job.job_id} has no GPUs: nothing to report here (seff covers CPU jobs)")
        if job.state == "PENDING":
            raise NoSummary(f"job {job.job_id} has not started yet")
        if unavailable:
            raise NoSummary(unavailable)
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
    if earlier:
        notes.append(f"earlier runs of job id {job.job_id} (requeued, or the id given out "
                     f"again) are not counted here: {_runs(earlier)}")
    if missing_nodes and not job.running:
        notes.append(f"no summary from node(s) {', '.join(missing_nodes)}: their figures are missing")
    for g in gpus:
        notes.extend(f"{g.node} GPU {g.minor}: {e}" for e in g.errors)
        if g.shared_fraction:
            notes.append(_shared_note(g))
    binding = {s.node: s.binding for s in summaries if s.binding}
    for node, check in binding.items():
        if check.get("status") == "mismatch":
            notes.append(f"{node}: the GPUs measured may not be the job's own: "
                         + "; ".join(check.get("evidence", [])[:3]))
        elif check.get("gpu_use") == "none":  # unverified, yet nothing of the job on any GPU
            notes.append(f"{node}: no process of the job ran on any GPU of the node while it was "
                         "sampled: its GPUs were not used, whichever they are")
    until = max((s.sampled_until for s in summaries if s.sampled_until), default=None)
    report = JobReport(job, _status(job, summaries, missing_nodes), gpus, missing_nodes, notes, until,
                       binding=binding, frameworks=_frameworks(summaries),
                       node_shares=dict(node_shares or {}))
    report.hints = evaluate(report, settings)
    report.verdict = verdict(report, report.hints)
    return report


def _frameworks(summaries: list[NodeSummary]) -> list[str] | None:
    """The frameworks seen on any node; None when no node looked (samplers before this)."""
    seen = [s.frameworks for s in summaries if s.frameworks is not None]
    return None if not seen else sorted({name for names in seen for name in names})


def _shared_note(g: GpuLine) -> str:
    """A shared GPU, told without naming the other job or giving away its figures."""
    others = g.summary.shared_with if g.summary else []
    own = g.metric("own_util")
    whole = "" if with_another_job(others) else f" (the whole GPU: {g.metric('util') or 0:.1f}%)"
    return (f"{g.node} GPU {g.minor} was shared with {', '.join(shared_with_shown(others)) or 'other work'} "
            f"{100 * (g.shared_fraction or 0.0):.0f}% of the time: "
            + ("its figures are the whole GPU's" if own is None else
               f"this job's own processes kept it {own:.1f}% busy{whole}; power and energy are the "
               "whole GPU's"))


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
