"""A job's report from its id: Slurm's accounting (sacct, under Slurm's rules), its
figures (its AdminComment, else the store), built and judged. What `gpueff JOBID` prints
and what the job-end mail carries."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import NotPermitted
from ..hostlist import expand_hostlist
from ..slurm.base import Slurm
from ..slurm.records import SlurmJob
from ..store.base import Store
from .figures import from_store_alone, gather
from .hints import HintSettings
from .job import build_group, build_report
from .shapes import GroupReport, JobReport


def job_report(slurm: Slurm, job_id: str, read_store: Callable[[], Store],
               settings: HintSettings) -> JobReport | GroupReport:
    """One run's report, or an array's (or a requeued job's runs) as a group."""
    job_id = job_id.strip()
    try:
        found = gather(slurm.jobs(job_id), read_store)
    except NotPermitted:
        alone = from_store_alone(job_id, read_store)  # the admin group reads the store
        if alone is None:
            raise
        found = [alone]
    shares = slurm.node_shares(nodes_of([f.job for f in found]))
    if len(found) == 1:
        f = found[0]
        report = build_report(f.job, f.summaries, settings, f.unavailable, shares)
        report.source, report.notes = f.source, f.notes + report.notes
        return report
    parts = [(f.job, f.summaries, f.unavailable) for f in found]
    return build_group(job_id, parts, settings, shares)


def nodes_of(jobs: list[SlurmJob]) -> list[str]:
    """The nodes the jobs ran on, each once (sacct's NodeList, a hostlist)."""
    nodes: dict[str, None] = {}
    for job in jobs:
        listed = job.nodelist.strip()
        if listed and listed not in ("None assigned", "(null)"):
            nodes.update(dict.fromkeys(expand_hostlist(listed)))
    return list(nodes)
