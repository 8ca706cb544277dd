"""Where a running job's figures go while it runs, besides the checkpoint: a live copy to
the store (LiveDelivery posts it to the outbox and starts one detached deliverer at a
time) and the Prometheus textfile export (node/export.py). Apart from the sampler's loop,
which calls them: each deals with one way out, and fails without stopping the sampling.
Standard library only: the sampler runs it."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Protocol

from ..config import Config
from ..errors import GpuEffError
from ..model import NodeSummary
from . import export
from .gpustats import GpuStats
from .jobenv import JobContext
from .log import HookLog
from .spool import Spool


class Exporting(Protocol):
    """What export_live reads of the Sampler (node/sampler.py): a structural type, since
    the sampler imports this module and not the other way round."""

    config: Config
    job: JobContext
    gpus: list[GpuStats]
    export_failed: bool


class LiveFigures:
    """One GPU as node/export.py writes it for Prometheus."""

    def __init__(self, stats: GpuStats, job: JobContext) -> None:
        self.stats, self.job = stats, job

    def live(self) -> dict[str, float | None]:
        s = self.stats
        util, sm = s.last("util"), s.last("sm_active")
        idle = s.idle_now()
        return {
            "gpueff_gpu_utilization_ratio": None if util is None else util / 100,
            "gpueff_gpu_sm_active_ratio": None if sm is None else sm / 100,
            "gpueff_gpu_memory_used_bytes": s.last("mem_used_bytes"),
            "gpueff_gpu_power_watts": s.last("power_w"),
            "gpueff_gpu_energy_joules": s.energy()[0],
            "gpueff_gpu_idle_seconds": 0.0 if idle is None else idle[1],
        }

    def labels(self) -> dict[str, str]:
        gpu = self.stats.gpu
        return {"job_id": self.job.job_id, "user": self.job.user, "account": self.job.account,
                "node": self.job.node, "minor": str(gpu.minor), "uuid": gpu.uuid or ""}


def export_live(sampler: Exporting, log: HookLog) -> None:
    if not sampler.config.export_dir:
        return
    try:
        export.write(sampler.config.export_dir, sampler.job.job_id,
                     [LiveFigures(s, sampler.job) for s in sampler.gpus if s.lost_at is None],
                     sampler.config.export_labels)
    except OSError as exc:
        if not sampler.export_failed:  # said once, not every second
            log.write(f"Prometheus export to {sampler.config.export_dir} failed: {exc}")
        sampler.export_failed = True


def unexport(config: Config, job_id: str) -> None:
    if config.export_dir:
        with contextlib.suppress(OSError):
            export.remove(config.export_dir, job_id)


class LiveDelivery:
    """Posts a running job's figures to the outbox and starts a delivery, one at a time."""

    def __init__(self, config: Config, spool: Spool, log: HookLog) -> None:
        self.config = config
        self.spool = spool
        self.log = log
        self.child: subprocess.Popen[bytes] | None = None

    def post(self, summary: NodeSummary) -> bool:
        """True once the copy is in the spool with a delivery started."""
        if self.child is not None and self.child.poll() is None:
            return False  # the last delivery is still going; the next one takes this job too
        try:
            self.spool.post(summary)
            self.child = spawn_delivery(self.config, self.spool.root)
        except (GpuEffError, OSError) as exc:
            self.log.write(f"live delivery skipped: {exc}")
            return False
        return True

    def reap(self) -> None:
        if self.child is not None:
            try:
                self.child.wait(timeout=self.config.stop_wait_s)
            except subprocess.TimeoutExpired:
                pass


def spawn_delivery(config: Config, spool_root: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [config.python, "-I", "-m", "slurm_gpu_eff.store.deliver", spool_root, "--once"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

