"""The orphan watch: tells when the job has ended on this node though no epilog came to
stop the sampler (its cgroup gone, and Slurm's squeue agreeing). Apart from the sampler's
loop because it asks Slurm and the cgroup tree, not the GPUs; the loop asks it at each
checkpoint and then does the epilog's work itself (sampler.finish_orphan). Standard
library only: the sampler runs it."""

from __future__ import annotations

import os

from ..config import Config, find_command
from ..errors import SlurmError
from ..slurm.run import job_state
from .jobenv import JobContext, job_cgroup_exists
from .log import HookLog


class OrphanWatch:
    """Tells when the job has ended on this node but no epilog came to stop us (node
    trouble at job end): its cgroup, seen once, has been gone for a few checkpoints, and
    Slurm no longer lists it as running. (The cgroup alone is not enough: without
    PrologFlags=Contain an allocation between two steps has none.)"""

    CHECKS = 3

    def __init__(self, job: JobContext, squeue: str = "squeue", log: HookLog | None = None) -> None:
        self.job = job
        self.squeue = squeue
        self.log = log
        self.told = False  # squeue's failure is logged once, not at every checkpoint
        self.seen = False
        self.missing = 0

    def ended(self) -> bool:
        if any(job_cgroup_exists(name, self.job.node) for name in self.job.ids()):
            self.seen, self.missing = True, 0
        elif self.seen:
            self.missing += 1
        return self.missing >= self.CHECKS and not self._listed_as_running()

    def _listed_as_running(self) -> bool:
        """True unless squeue answers that the job is gone or finished; an unreachable
        controller is no proof of anything."""
        try:
            state = job_state(self.job.job_id, self.squeue)
        except SlurmError as exc:
            self._tell(f"cannot run {self.squeue} ([slurm] squeue): {exc}")
            return True
        return state in ("RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING")

    def _tell(self, what: str) -> None:
        if self.log is not None and not self.told:
            self.told = True
            self.log.write(f"{what}: the job's end cannot be confirmed, so I keep sampling")


def squeue_for(config: Config) -> str:
    """squeue as configured, else from where sacct is configured to be."""
    folder = os.path.dirname(config.sacct)
    if config.squeue == "squeue" and folder:
        return os.path.join(folder, "squeue")
    return find_command(config.squeue)

