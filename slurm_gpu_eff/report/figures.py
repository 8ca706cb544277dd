"""Where a job's GPU figures come from: its AdminComment (through sacct, under Slurm's
rules: the users' path, mirror.py), else the store (admins only: a running job's live
copies, a job whose line was not written). Both give mirror.digest(): one report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import StoreError
from ..mirror import MirrorError, digest, figures, imitated, parse_admin_comment
from ..model import NodeSummary
from ..slurm.records import SlurmJob
from ..store.base import Store


@dataclass
class Figures:
    job: SlurmJob
    summaries: list[NodeSummary] = field(default_factory=list)
    source: str = ""  # "accounting" (the AdminComment) or "store"
    unavailable: str = ""  # why there are none, when there are none
    notes: list[str] = field(default_factory=list)  # for the report, first


def gather(jobs: list[SlurmJob], read_store: Callable[[], Store]) -> list[Figures]:
    """Each job's figures: from its AdminComment when the job has ended and the line holds
    them; from the store otherwise, or for a running job the store's fresher live copy,
    where the caller may read it (the store is opened once, only if needed)."""
    found = [_from_accounting(job) for job in jobs]
    # A running job, or one whose line is still a live copy (its final one not yet
    # written): the store may have fresher figures, for those who may read it.
    wanted = [f for f in found if f.source != "accounting" or f.job.running
              or any(not s.final for s in f.summaries)]
    if not wanted:
        return found
    try:
        with read_store() as store:
            for f in wanted:
                summaries = store.node_summaries(f.job.job_id_raw, f.job.cluster)
                if summaries or not (f.unavailable or f.summaries):
                    f.summaries, f.source, f.unavailable = digest(summaries), "store", ""
    except StoreError as exc:
        for f in wanted:
            if not f.summaries:
                f.unavailable = f.unavailable or _not_there(f.job, exc)
    return found


def _from_accounting(job: SlurmJob) -> Figures:
    if imitated(job.admin_comment):  # mirror.our_part: a copy of our form beside ours
        return Figures(job, unavailable=(
            f"job {job.job_id}'s comment in Slurm's accounting holds more than one line in "
            "gpueff's form (text copied there from elsewhere): none is trusted; an admin's "
            "gpueff reads its figures from the store"))
    try:
        summaries = figures(job.admin_comment)
    except MirrorError as exc:
        return Figures(job, unavailable=f"job {job.job_id}: {exc}")
    if summaries is not None:
        return Figures(job, summaries, "accounting")
    words = parse_admin_comment(job.admin_comment)
    if words is not None and summaries is None:
        return Figures(job, unavailable=(
            f"job {job.job_id}'s GPU figures ({words.get('gpus', '?')} GPUs) are more than "
            "Slurm's AdminComment holds: an admin's gpueff reads them from the store"))
    return Figures(job)


def _not_there(job: SlurmJob, exc: StoreError) -> str:
    if job.running:
        return (f"job {job.job_id} is running: its GPU figures reach Slurm's accounting a few "
                f"minutes into it ([slurm] live_mirror_s) and at its end (the store, for admins: {exc})")
    return (f"no GPU figures for job {job.job_id} in Slurm's accounting: its nodes have not "
            "delivered its summary yet (try again in a minute), or its sampler did not run; "
            f"the store, for admins: {exc}")


HIDDEN = ("Slurm's accounting does not show you this job (PrivateData=jobs): its GPU figures "
          "come from the store, which your group may read; CPU, memory and exit status are left out")


def from_store_alone(job_id: str, read_store: Callable[[], Store]) -> Figures | None:
    """For the admin group (who read the store) when Slurm hides the job from them: its
    latest run from the store, with what Slurm would have said left out. None when the
    store cannot be read by the caller or holds no such job."""
    if not job_id.isdigit():  # the store keys an array task by its raw id
        return None
    try:
        with read_store() as store:
            summaries = store.node_summaries(job_id)
    except StoreError:
        return None
    if not summaries:
        return None
    run = max(s.run_started_at or 0.0 for s in summaries)
    summaries = [s for s in summaries if (s.run_started_at or 0.0) == run]
    first = summaries[0]
    starts = [s.started_at for s in summaries if s.started_at]
    ends = [end for s in summaries if (end := s.ended_at or s.sampled_until)]
    running = any(not s.final for s in summaries)
    job = SlurmJob(
        job_id=job_id, job_id_raw=job_id, name="", cluster=first.cluster, user=first.user,
        account=first.account, partition=first.partition,
        state="RUNNING" if running else "ENDED", exit_code="-",
        elapsed_s=int(max(ends) - min(starts)) if starts and ends else 0, timelimit_s=None,
        start=_local(min(starts)) if starts else "Unknown", end="Unknown", ncpus=0,
        nnodes=len(summaries), nodelist=",".join(sorted(s.node for s in summaries)),
        total_cpu_s=0.0, alloc_mem_bytes=None, max_rss_bytes=None,
        gpus=sum(len(s.gpus) for s in summaries),
    )
    return Figures(job, digest(summaries), "store", notes=[HIDDEN])


def _local(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))
