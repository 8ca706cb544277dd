"""The per-job sampler: polls the job's GPUs, keeps streaming statistics, checkpoints.

Started detached by the prolog (`python -m slurm_gpu_eff.sampler JOB_DIR`), with the
prolog's environment (SLURM_JOB_ID, SLURM_JOB_GPUS, SLURMD_NODENAME...), stopped by
the epilog with SIGTERM, on which it takes a last reading, writes its summary and
exits. Memory is constant whatever the job's length; a checkpoint reaches the spool at
least every `checkpoint_s`, and a live copy goes to the store every `live_s` so a
running job can be reported. Standard library and pynvml only: this is a hot path.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from .config import Config, load_config
from .errors import GpuEffError, GpuLost
from .gpu import Gpu, GpuSession, Reading
from .jobenv import JobContext, parse_job_gpus
from .log import HookLog
from .model import COMPLETE, MISSING, RUNNING, GpuSummary, NodeSummary
from .spool import Spool, write_json
from .stats import Stat

SUMMARY = "summary.json"


class GpuStats:
    """Accumulators for one GPU."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.stats = {name: Stat() for name in ("util", "mem_util", "mem_used_bytes", "power_w")}
        self.samples = 0
        self.seconds = 0.0
        self.energy_first_mj: int | None = None
        self.energy_last_mj: int | None = None
        self.energy_counter_ok = True
        self.power_energy_j = 0.0
        self.lost = False
        self.errors: list[str] = []

    def add(self, reading: Reading, seconds: float) -> None:
        self.samples += 1
        self.seconds += seconds
        for name, stat in self.stats.items():
            stat.add(getattr(reading, name), seconds)
        if reading.power_w is not None:
            self.power_energy_j += reading.power_w * seconds
        self._add_energy(reading.energy_mj)

    def _add_energy(self, counter_mj: int | None) -> None:
        if counter_mj is None:
            self.energy_counter_ok = self.energy_counter_ok and self.energy_first_mj is None
            return
        if self.energy_first_mj is None:
            self.energy_first_mj = counter_mj
        elif self.energy_last_mj is not None and counter_mj < self.energy_last_mj:
            self.energy_counter_ok = False  # counter reset (driver reload): fall back to power
        self.energy_last_mj = counter_mj

    def energy(self) -> tuple[float | None, str | None]:
        if self.energy_counter_ok and self.energy_first_mj is not None and self.samples > 1:
            return (self.energy_last_mj - self.energy_first_mj) / 1000.0, "counter"  # type: ignore[operator]
        if self.stats["power_w"].samples:
            return self.power_energy_j, "power"
        return None, None

    def summary(self, node: str) -> GpuSummary:
        energy_j, source = self.energy()
        gpu = self.gpu
        return GpuSummary(
            node=node, index=gpu.index, minor=gpu.minor, uuid=gpu.uuid, name=gpu.name,
            memory_total_bytes=gpu.memory_total_bytes, power_limit_w=gpu.power_limit_w,
            samples=self.samples, sampled_s=round(self.seconds, 3),
            metrics={k: s.to_dict() for k, s in self.stats.items() if s.samples},
            energy_j=energy_j, energy_source=source,
            errors=(gpu.errors + self.errors)[:20],
        )


class Sampler:
    def __init__(
        self, job: JobContext, config: Config, gpus: list[Gpu],
        clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.config = config
        self.gpus = [GpuStats(g) for g in gpus]
        self.clock = clock
        self.monotonic = monotonic
        self.started_at = clock()
        self.sampled_from: float | None = None
        self.sampled_until: float | None = None
        self._last_tick: float | None = None

    def sample_once(self) -> None:
        now = self.monotonic()
        # A reading stands for the time since the one before (NVML's figures look back),
        # so the first stands for nothing: the mean covers [first reading, last reading].
        seconds = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        for stats in self.gpus:
            if stats.lost:
                continue
            try:
                stats.add(stats.gpu.read(), seconds)
            except GpuLost as exc:
                stats.lost = True
                stats.errors.append(f"{exc} at {time.strftime('%H:%M:%S')}; sampling stopped")
        wall = self.clock()
        self.sampled_from = self.sampled_from or wall
        self.sampled_until = wall

    def snapshot(self, status: str, reason: str = "") -> NodeSummary:
        job = self.job
        return NodeSummary(
            cluster=job.cluster, job_id=job.job_id, node=job.node, status=status, reason=reason,
            user=job.user, account=job.account, partition=job.partition, job_gpus=job.job_gpus,
            interval_s=self.config.interval_s, started_at=self.started_at,
            sampled_from=self.sampled_from, sampled_until=self.sampled_until,
            gpus=[s.summary(job.node) for s in self.gpus],
        )


class Stopper:
    """Turns SIGTERM/SIGINT into a flag and wakes any wait at once (no sleep to finish)."""

    def __init__(self) -> None:
        self.requested = False
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True

    def wait(self, seconds: float) -> None:
        if seconds > 0 and not self.requested:
            ready, _, _ = select.select([self._read], [], [], seconds)
            if ready:
                os.read(self._read, 512)


def loop(sampler: Sampler, stopper: Stopper, job_dir: str, spool: Spool, log: HookLog) -> None:
    """Sample until told to stop, checkpointing and posting live copies on the way."""
    config = sampler.config
    summary_path = os.path.join(job_dir, SUMMARY)
    now = sampler.monotonic()
    next_tick = now
    next_checkpoint = now  # checkpoint right after the first reading
    next_live = now + min(config.live_s, config.checkpoint_s)
    live = LiveDelivery(config, spool, log)
    while not stopper.requested:
        sampler.sample_once()
        now = sampler.monotonic()
        if now >= next_checkpoint:
            write_json(summary_path, sampler.snapshot(RUNNING).to_dict())
            next_checkpoint = now + config.checkpoint_s
        if now >= next_live:
            live.post(sampler.snapshot(RUNNING))
            next_live = now + config.live_s
        next_tick += config.interval_s
        if next_tick <= now:  # fell behind (suspended, overloaded): do not burst to catch up
            next_tick = now + config.interval_s
        stopper.wait(next_tick - sampler.monotonic())
    sampler.sample_once()
    write_json(summary_path, sampler.snapshot(COMPLETE).to_dict())
    live.reap()


class LiveDelivery:
    """Posts a running job's figures to the outbox and starts a delivery, one at a time."""

    def __init__(self, config: Config, spool: Spool, log: HookLog) -> None:
        self.config = config
        self.spool = spool
        self.log = log
        self.child: subprocess.Popen[bytes] | None = None

    def post(self, summary: NodeSummary) -> None:
        if self.child is not None and self.child.poll() is None:
            return  # the last delivery is still going; the next one takes this job too
        try:
            self.spool.post(summary)
            self.child = spawn_delivery(self.config, self.spool.root)
        except (GpuEffError, OSError) as exc:
            self.log.write(f"live delivery skipped: {exc}")

    def reap(self) -> None:
        if self.child is not None:
            try:
                self.child.wait(timeout=self.config.stop_wait_s)
            except subprocess.TimeoutExpired:
                pass


def spawn_delivery(config: Config, spool_root: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [config.python, "-m", "slurm_gpu_eff.deliver", spool_root],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run(job_dir: str, config: Config) -> None:
    """The sampler process: never lets an exception escape without leaving a summary."""
    job = JobContext.from_env(os.environ)  # the prolog's environment: Slurm's variables
    log = HookLog(config.log_for(job.node), job.job_id, "sampler")
    summary_path = os.path.join(job_dir, SUMMARY)
    stopper = Stopper()
    session = None
    try:
        session = GpuSession(config, job.node)
        gpus = session.bind(parse_job_gpus(job.job_gpus))
        log.write(f"sampling {len(gpus)} GPU(s): minors {[g.minor for g in gpus]}")
        sampler = Sampler(job, config, gpus)
        loop(sampler, stopper, job_dir, Spool(config.spool_for(job.node)), log)
        log.write("stopped cleanly")
    except GpuEffError as exc:
        log.write(f"cannot sample: {exc}")
        write_json(summary_path, failed_summary(job, config, str(exc)).to_dict())
    finally:
        if session is not None:
            session.close()


def failed_summary(job: JobContext, config: Config, reason: str) -> NodeSummary:
    return NodeSummary(
        cluster=job.cluster, job_id=job.job_id, node=job.node, status=MISSING, reason=reason,
        user=job.user, account=job.account, partition=job.partition, job_gpus=job.job_gpus,
        interval_s=config.interval_s,
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m slurm_gpu_eff.sampler JOB_DIR", file=sys.stderr)
        return 2
    try:
        run(argv[0], load_config())
    except Exception as exc:  # last resort: a sampler error must never reach the job
        try:
            HookLog(load_config().log_for(os.environ.get("SLURMD_NODENAME", "")), "?", "sampler").write(
                f"crashed: {exc!r}"
            )
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
