"""A job's report from its id: Slurm's accounting (sacct, under Slurm's rules), its
figures (its AdminComment, else the store), built and judged. What `gpueff JOBID` prints
and what the job-end mail carries."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import NotPermitted
from ..slurm.base import Slurm
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
    if len(found) == 1:
        f = found[0]
        report = build_report(f.job, f.summaries, settings, f.unavailable)
        report.source, report.notes = f.source, f.notes + report.notes
        return report
    parts = [(f.job, f.summaries, f.unavailable) for f in found]
    return build_group(job_id, parts, settings)
