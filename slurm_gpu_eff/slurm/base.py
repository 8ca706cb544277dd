"""The questions the package asks Slurm, which each backend answers the same way."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from ..errors import SlurmError
from .records import Comment, RunningJob, SlurmJob

CANCEL_RECHECK_S = 2.0


class Slurm:
    """Slurm, as one backend reaches it. `why`: why this backend was chosen (doctor says it,
    the idle watch logs it once)."""

    name = ""

    def __init__(self, comment_field: str = "AdminComment", why: str = "") -> None:
        self.field = comment_field  # where the site keeps our figures' line ([slurm] comment_field)
        self.why = why

    # -- the accounting (slurmdbd) -----------------------------------------------------------

    def jobs(self, job_id: str) -> list[SlurmJob]:
        """One job, or every task of an array / component of a heterogeneous job the id
        names as a whole; JobNotFound, or NotPermitted under PrivateData=jobs."""
        raise NotImplementedError

    def period_jobs(self, since: float, until: float, user: str | None = None) -> list[SlurmJob]:
        """Every run (allocations; each run of a requeued job) pending or running between
        since and until (epoch seconds), of every user the caller may see or of `user`."""
        raise NotImplementedError

    def comment(self, job_id: str, owner: bool = False) -> Comment:
        """The job's comment field (ours) as the database holds it, with its AllocTRES and the
        id to write it with; `owner`: its user and account too."""
        raise NotImplementedError

    def set_comment(self, job_id: str, cluster: str, text: str, running: bool = False) -> str:
        """Write our comment field; returns where ("slurmctld" or "slurmdbd")."""
        raise NotImplementedError

    # -- the controller (slurmctld) ------------------------------------------------------------

    def running_job(self, job_id: str) -> RunningJob | None:
        """The job whose own id is `job_id` while slurmctld holds it; None once it is gone."""
        raise NotImplementedError

    def cluster(self) -> str:
        """slurmctld's own ClusterName."""
        raise NotImplementedError

    def private_jobs(self) -> bool:
        """Whether Slurm hides other users' jobs from this caller (PrivateData=jobs)."""
        raise NotImplementedError

    def node_shares(self, nodes: list[str]) -> dict[str, dict[str, int]]:
        """Each node's share as Slurm's config has it: node -> {"cpus", "mem_mb", "gpus"}.
        Never raises: what Slurm does not say is left out (the hints then say nothing of
        the node's share, rather than assume one)."""
        raise NotImplementedError

    def scancel(self, job_id: str) -> None:
        raise NotImplementedError

    def cancel(self, job_id: str, cluster: str, reason: str,
               sleep: Callable[[float], None] = time.sleep) -> None:
        """Cancel the job with `reason` in our comment field, which sacct shows (root or
        SlurmUser only). Written into the database, as a site's own text before our
        figures' line: the mirror keeps it there, and slurmctld, holding no copy, carries
        none over it at the job's end (mirror.py). Looked at again after the cancel: a live
        mirror that read the old text just before would have written it back."""
        from ..mirror import with_note

        def note() -> None:
            current, _, task, *_ = self.comment(job_id)
            if reason.lower() not in current.lower():
                self.set_comment(task, cluster, with_note(current, reason), running=True)

        note()
        self.scancel(job_id)
        sleep(CANCEL_RECHECK_S)
        with contextlib.suppress(SlurmError):  # cancelled: the note is the lesser thing
            note()
