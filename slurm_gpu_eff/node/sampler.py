"""The per-job sampler: polls the job's GPUs, keeps streaming statistics, checkpoints.

Started detached by the shell prolog (`python -m slurm_gpu_eff.node.sampler --prolog
JOBID`: it then does the prolog's work itself, begin()) or by the Python one (`... JOB_DIR`),
with the prolog's environment (SLURM_JOB_ID, SLURM_JOB_GPUS, SLURMD_NODENAME...), stopped by
the epilog with SIGTERM, on which it takes a last reading, writes its summary and
exits. Memory is constant whatever the job's length; a checkpoint reaches the spool at
least every `checkpoint_s`, and a live copy goes to the store every `live_s` so a
running job can be reported. Standard library and pynvml only: this is a hot path.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Config, find_command, load_config
from ..errors import GpuEffError, GpuLost
from ..model import COMPLETE, MISSING, PARTIAL, RUNNING, GpuSummary, NodeSummary
from . import export
from .binding import gpu_minors
from .gpu import ALL_GI, THROTTLE_REASONS, Gpu, GpuSession, Reading
from .jobenv import JobContext, job_cgroup_exists, job_of_pid, parse_job_gpus, same_job
from .log import HookLog
from .spool import SUMMARY, Spool, write_json
from .stats import Histogram, Stat, Timeline
from .verify import BindingCheck

THROTTLE_ANY = sum(THROTTLE_REASONS.values())

VERIFY_EVERY_S = 10.0  # wall seconds between looks at the node's other GPUs and the cgroup


class GpuStats:
    """Accumulators for one GPU: constant memory whatever the job's length."""

    def __init__(self, gpu: Gpu, job_id: str = "", sluid: str = "") -> None:
        self.gpu = gpu
        self.job_id = job_id
        self.sluid = sluid  # Slurm 26.05: job_of_pid() names the job's processes by it on v2
        self.stats: defaultdict[str, Stat] = defaultdict(Stat)  # made on first use, in C
        self.util_source: str | None = None
        self.histogram = Histogram()
        self.timeline = Timeline()
        # The longest stretch of polls under the idle line: a mean hides a job that worked
        # for an hour and then idled for ten minutes. Offsets from the window's start.
        self.first_at: float | None = None
        self.idle_from: float | None = None
        self.idle_until: float | None = None  # the open stretch's last idle poll
        self.idle_longest: tuple[float, float] | None = None  # (from, seconds)
        self.samples = 0
        self.seconds = 0.0
        # The counter at the last reading (at binding, the first): None without a counter
        self.energy_last_mj: int | None = None if gpu is None else gpu.energy_at_bind_mj
        self.energy_counter_j = 0.0
        self.energy_counted = False  # the counter's difference taken at least once
        self.power_energy_j = 0.0
        self.throttle_s = dict.fromkeys(THROTTLE_REASONS, 0.0)
        self.throttle_observed_s: float | None = None
        self.xid_events: list[dict[str, Any]] = []
        self.ecc_first: int | None = None
        self.ecc_last: int | None = None
        self.processes_max: int | None = None
        self.lost_at: float | None = None
        self.errors: list[str] = []
        self.shared_s: float | None = None  # time other jobs' processes were on this GPU
        self.shared_with: set[str] = set()
        self.own_listed = False  # the job's own processes were on the GPU at the last poll
        self.jobs_of_pids: dict[int, str | None] = {}

    def stat(self, name: str) -> Stat:
        return self.stats[name]

    def add(self, reading: Reading, seconds: float) -> None:
        # Once a GPU a poll: what it costs is the sampler's own overhead (make bench).
        self.samples += 1
        self.seconds += seconds
        util = self._series("util", reading.util_samples, reading.util, seconds, self.histogram)
        self._series("mem_util", reading.mem_util_samples, reading.mem_util, seconds, None)
        stats = self.stats
        gpm = reading.gpm
        if gpm:  # GPM's means cover the time since its last sample, not this poll's
            for name, figure in gpm.items():
                stats[name].add(figure, reading.gpm_s)
        mem, power = reading.mem_used_bytes, reading.power_w
        if mem is not None:
            stats["mem_used_bytes"].add(mem, seconds)
        if power is not None:
            stats["power_w"].add(power, seconds)
            self.power_energy_j += power * seconds
        if reading.temp_c is not None:
            stats["temp_c"].add(reading.temp_c, seconds)
        if reading.sm_clock_mhz is not None:
            stats["sm_clock_mhz"].add(reading.sm_clock_mhz, seconds)
        self._add_energy(reading.energy_mj)
        self._add_state(reading, seconds)
        self._add_sharing(reading, seconds)
        self.timeline.add(
            reading.time, seconds, util, gpm.get("sm_active") if gpm else None, power,
            None if mem is None else mem / 1024**3,
        )
        self._add_idle(reading.time, seconds, util)

    def _add_idle(self, at: float, seconds: float, util: float | None) -> None:
        if self.first_at is None:
            self.first_at = at - seconds
        if util is None:  # not measured this poll: the stretch neither grows nor ends
            return
        if util >= Histogram.IDLE_BELOW:
            self.idle_from = None
            return
        if self.idle_from is None:
            self.idle_from = at - seconds
        self.idle_until = at
        length = at - self.idle_from
        if self.idle_longest is None or length > self.idle_longest[1]:
            self.idle_longest = (self.idle_from - self.first_at, length)

    def idle_now(self) -> tuple[float, float] | None:
        """The stretch under the idle line the GPU is in now: (since, seconds), clock time."""
        if self.idle_from is None or self.idle_until is None or self.lost_at is not None:
            return None
        return self.idle_from, self.idle_until - self.idle_from

    def _series(
        self, name: str, samples: list[tuple[float, float]] | None, rate: float | None,
        seconds: float, histogram: Histogram | None,
    ) -> float | None:
        """Lossless driver samples where there are any, else the poll's rate; returns the
        poll's mean for the timeline."""
        if not samples:  # not supported, or no new window since the last poll
            if rate is None:
                return None
            if self.util_source is None and name == "util" and samples is None:
                self.util_source = "rates"
            self.stats[name].add(rate, seconds)
            if histogram is not None:
                histogram.add(rate, seconds)
            return rate
        if name == "util":
            self.util_source = "samples"
        stat = self.stat(name)
        for value, weight in samples:
            stat.add(value, weight)
            if histogram is not None:
                histogram.add(value, weight)
        total = sum(w for _, w in samples)
        return sum(v * w for v, w in samples) / total if total else samples[-1][0]

    def _add_energy(self, counter_mj: int | None) -> None:
        if counter_mj is None:
            return
        if self.energy_last_mj is not None:
            delta = counter_mj - self.energy_last_mj
            # A counter that went backwards was reset (driver reload): count from zero.
            self.energy_counter_j += (delta if delta >= 0 else counter_mj) / 1000.0
            self.energy_counted = True
        self.energy_last_mj = counter_mj

    def _add_state(self, reading: Reading, seconds: float) -> None:
        mask = reading.throttle_mask
        if mask is not None:
            self.throttle_observed_s = (self.throttle_observed_s or 0.0) + seconds
            if mask & THROTTLE_ANY:
                for reason, bit in THROTTLE_REASONS.items():
                    if mask & bit:
                        self.throttle_s[reason] += seconds
        ecc = reading.ecc_uncorrected
        if ecc is not None:
            if self.ecc_first is None:
                self.ecc_first = ecc
            self.ecc_last = ecc
        pids = reading.pids
        if pids is not None and (self.processes_max is None or len(pids) > self.processes_max):
            self.processes_max = len(pids)

    MAX_XIDS = 100  # an XID storm over a week must not grow the sampler's memory

    def add_xid(self, now: float, code: int) -> None:
        if len(self.xid_events) < self.MAX_XIDS:
            self.xid_events.append({"time": now, "xid": code})
        elif len(self.errors) < 20 and not any("XID events" in e for e in self.errors):
            self.errors.append(f"more than {self.MAX_XIDS} XID events: later ones not listed")

    def job_of(self, pid: int) -> str | None:
        try:
            return self.jobs_of_pids[pid]
        except KeyError:  # a pid not seen before: once, then from the cache every poll
            if len(self.jobs_of_pids) > 1000:  # bounded: pids come and go over a long job
                self.jobs_of_pids.clear()
            job = self.jobs_of_pids[pid] = job_of_pid(pid)
            return job

    @property
    def shared(self) -> bool:
        return bool(self.shared_s)

    def _add_sharing(self, reading: Reading, seconds: float) -> None:
        """Which jobs' processes are on the GPU: ours, another job's, or outside any job's
        (pids that cannot be traced count for neither)."""
        if reading.pids is None:
            return
        own_mem, others, listed = 0, None, False
        for pid, used in reading.pids:
            job = self.job_of(pid)
            if same_job(job, self.job_id, self.sluid):
                own_mem += used
                listed = True
            elif job is not None:
                others = others or set()
                others.add(f"job {job}" if job else "processes outside any job")
        if others:
            self.shared_s = (self.shared_s or 0.0) + seconds
            self.shared_with |= others
        elif self.shared_s is None:
            self.shared_s = 0.0
        if self.shared_s:
            self.stats["own_mem_used_bytes"].add(own_mem, seconds)
        # The driver gives each process's SM share of its last period only, and a poll lets
        # it stand for the time since the poll before. In the poll the job's processes left
        # the GPU in (at the latest the last: they exit, then the epilog stops us), when
        # they stopped is unknown: that stretch is left out, not counted as idle.
        left = self.own_listed and not listed
        self.own_listed = listed
        if reading.process_sm is not None and not left:
            own = sum(sm for pid, sm in reading.process_sm.items()
                      if same_job(self.job_of(pid), self.job_id, self.sluid))
            self.stats["own_util"].add(own, seconds)

    def energy(self) -> tuple[float | None, str | None]:
        if self.energy_counted:
            return self.energy_counter_j, "counter"
        if "power_w" in self.stats:
            return self.power_energy_j, "power"
        return None, None

    def last(self, name: str) -> float | None:
        stat = self.stats.get(name)
        return stat.last if stat is not None and stat.samples else None

    def summary(self, node: str) -> GpuSummary:
        energy_j, source = self.energy()
        gpu = self.gpu
        histogram = self.histogram
        measured = histogram.total_s > 0
        return GpuSummary(
            node=node, index=gpu.index, minor=gpu.minor, uuid=gpu.uuid, name=gpu.name,
            memory_total_bytes=gpu.memory_total_bytes, power_limit_w=gpu.power_limit_w,
            samples=self.samples, sampled_s=round(self.seconds, 3),
            metrics={k: s.to_dict() for k, s in self.stats.items() if s.samples},
            energy_j=energy_j, energy_source=source,
            errors=(gpu.errors + self.errors)[:20],
            util_source=self.util_source, gpm=gpu.gpm is not None,
            util_histogram_s=[round(x, 3) for x in histogram.seconds] if measured else None,
            idle_s=round(histogram.idle_s, 3) if measured else None,
            throttle_s=self.throttle_s if self.throttle_observed_s is not None else None,
            throttle_observed_s=self.throttle_observed_s,
            xid_events=self.xid_events,
            ecc_uncorrected=None if self.ecc_first is None else self.ecc_last - self.ecc_first,  # type: ignore[operator]
            processes_max=self.processes_max, mig_gi_id=gpu.gi_id, lost_at=self.lost_at,
            shared_s=None if self.shared_s is None else round(self.shared_s, 3),
            shared_with=sorted(self.shared_with)[:20],
            timeline=self.timeline.to_dict(),
            idle_longest=None if self.idle_longest is None else {
                "from_s": round(self.idle_longest[0], 3), "seconds": round(self.idle_longest[1], 3)},
            idle_now=_idle_now(self.idle_now()),
        )


def _idle_now(stretch: tuple[float, float] | None) -> dict[str, float] | None:
    return None if stretch is None else {"since": round(stretch[0], 3), "seconds": round(stretch[1], 3)}


class Sampler:
    """Polls the job's GPUs. Times come from `clock` (the driver's clock: wall time, or
    the simulation's, which may run faster); waits are in wall time, `time_scale` apart."""

    def __init__(
        self, job: JobContext, config: Config, gpus: list[Gpu],
        clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
        xid_events: Callable[[], list[tuple[str, int, int]]] = list, time_scale: float = 1.0,
        other_processes: Callable[[], list[tuple[int, list[int]]]] = list,
        cgroup_root: str = "/sys/fs/cgroup", run_started: float | None = None,
    ) -> None:
        self.job = job
        self.config = config
        self.gpus = [GpuStats(g, job.job_id, job.sluid) for g in gpus]
        self.clock = clock
        self.monotonic = monotonic
        self.xid_events = xid_events
        self.other_processes = other_processes  # the node's unbound GPUs: (minor, pids)
        self.binding = BindingCheck(job.job_id, job.node, [g.minor for g in gpus if not g.is_mig],
                                    cgroup_root, sluid=job.sluid)
        self._next_verify = 0.0  # monotonic time of the next look beyond the bound GPUs
        self.wait_s = config.interval_s / time_scale
        self.started_at = clock()
        self.run_started_at = run_started  # when this run's prolog ran: the run's identity
        # The binding is the first look: the driver's samples and GPM's first sample count
        # from it, so the window does too (the first poll may come a while later on a busy
        # node: Slurm's and the store's setup run between).
        self.sampled_from: float | None = min((g.bound_at for g in gpus), default=None)
        self.sampled_until: float | None = None
        self._last: float | None = self.sampled_from
        self.export_failed = False

    def sample_once(self) -> None:
        now = self.clock()
        # A reading stands for the time since the one before (NVML's figures look back),
        # the first for the time since binding: the mean covers [binding, last reading].
        seconds = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        # Every GPU read first, then every reading added: the GPUs are read at one instant,
        # and each half runs with its code still warm from the GPU before (less CPU a poll).
        readings = []
        for stats in self.gpus:
            if stats.lost_at is not None:
                continue
            try:
                readings.append((stats, stats.gpu.read(per_process=stats.shared)))
            except GpuLost as exc:
                stats.lost_at = now
                stats.errors.append(f"{exc}: a hardware fault, not the job's; figures up to then")
        for stats, reading in readings:
            stats.add(reading, seconds)
            if reading.pids and self.binding.wants(stats.gpu.minor, reading.pids):
                owners = {pid: stats.job_of(pid) for pid, _ in reading.pids}
                self.binding.processes(stats.gpu.minor, owners, bound=True)
        self._record_xids(now)
        self._verify()
        self.sampled_from = self.sampled_from or now
        self.sampled_until = now

    def _verify(self) -> None:
        """Now and then, the job's processes on the node's other GPUs, and its cgroup."""
        if self.monotonic() < self._next_verify:
            return
        self._next_verify = self.monotonic() + VERIFY_EVERY_S
        for minor, pids in self.other_processes():
            self.binding.processes(minor, {pid: job_of_pid(pid) for pid in pids}, bound=False)
        self.binding.cgroup()

    def _record_xids(self, now: float) -> None:
        for uuid, code, gi_id in self.xid_events():
            for stats in self.gpus:
                gpu = stats.gpu
                if uuid == gpu.uuid or (
                    uuid == gpu.parent_uuid and gi_id in (ALL_GI, gpu.gi_id)
                ):
                    stats.add_xid(now, code)

    def idle_level(self) -> int:
        """How far the longest open idle stretch has gone under the site's idle policy:
        0, 1 (past the alert minute) or 2 (past the cancel minute too)."""
        alert_s, cancel_s = self.config.idle_alert_min * 60, self.config.idle_cancel_min * 60
        if alert_s <= 0:
            return 0
        longest = max((s[1] for s in map(GpuStats.idle_now, self.gpus) if s is not None), default=0.0)
        if longest < alert_s:
            return 0
        return 2 if cancel_s > 0 and longest >= alert_s + cancel_s else 1

    def snapshot(self, status: str, reason: str = "") -> NodeSummary:
        return self.job.summary(
            status, reason, interval_s=self.config.interval_s, started_at=self.started_at,
            run_started_at=self.run_started_at,
            sampled_from=self.sampled_from, sampled_until=self.sampled_until,
            gpus=[s.summary(self.job.node) for s in self.gpus], binding=self.binding.result(),
        )


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


def export_live(sampler: Sampler, log: HookLog) -> None:
    if not sampler.config.export_dir:
        return
    try:
        export.write(sampler.config.export_dir, sampler.job.job_id,
                     [LiveFigures(s, sampler.job) for s in sampler.gpus if s.lost_at is None])
    except OSError as exc:
        if not sampler.export_failed:  # said once, not every second
            log.write(f"Prometheus export to {sampler.config.export_dir} failed: {exc}")
        sampler.export_failed = True


def unexport(config: Config, job_id: str) -> None:
    if config.export_dir:
        with contextlib.suppress(OSError):
            export.remove(config.export_dir, job_id)


class Stopper:
    """Turns SIGTERM/SIGINT into a flag and wakes any wait at once (no sleep to finish)."""

    def __init__(self) -> None:
        self.requested = False
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        self._poll = select.poll()  # once a poll: cheaper than select(), which builds fd sets
        self._poll.register(self._read, select.POLLIN)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True

    def wait(self, seconds: float) -> None:
        if seconds > 0 and not self.requested and self._poll.poll(seconds * 1000):
            os.read(self._read, 512)


FIRST_LIVE_S = 10.0


def loop(sampler: Sampler, stopper: Stopper, job_dir: str, spool: Spool, log: HookLog) -> None:
    """Sample until told to stop, checkpointing and posting live copies on the way."""
    config = sampler.config
    summary_path = os.path.join(job_dir, SUMMARY)
    now = sampler.monotonic()
    next_tick = now
    next_checkpoint = now  # checkpoint right after the first reading
    # The first live copy comes early: a running job has figures a few seconds in.
    next_live = now + min(config.live_s, config.checkpoint_s, FIRST_LIVE_S)
    live = LiveDelivery(config, spool, log)
    orphan = OrphanWatch(sampler.job, squeue_for(config), log)
    posted_level = 0  # the idle policy's level the store has heard of
    while not stopper.requested:
        sampler.sample_once()
        export_live(sampler, log)
        now = sampler.monotonic()
        level = sampler.idle_level()
        if level > posted_level:  # the alert (or cancel) minute passed: tell the store now
            if live.post(sampler.snapshot(RUNNING)):
                posted_level = level
                next_live = now + config.live_s
        else:
            posted_level = level  # the GPU worked again: the next stretch counts anew
        if now >= next_checkpoint:
            if not os.path.isdir(job_dir):
                log.write("the job's spool directory is gone (its epilog ran): stopping")
                return
            if orphan.ended():
                finish_orphan(sampler, summary_path, live, log)
                return
            checkpoint(summary_path, sampler.snapshot(RUNNING), log)
            next_checkpoint = now + config.checkpoint_s
        if now >= next_live:
            live.post(sampler.snapshot(RUNNING))
            next_live = now + config.live_s
        next_tick += sampler.wait_s
        if next_tick <= now:  # fell behind (suspended, overloaded): do not burst to catch up
            next_tick = now + sampler.wait_s
        stopper.wait(next_tick - sampler.monotonic())
    sampler.sample_once()
    checkpoint(summary_path, sampler.snapshot(COMPLETE), log)
    live.reap()


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
            done = subprocess.run(
                [self.squeue, "-h", "-j", self.job.job_id, "-o", "%T"],
                capture_output=True, text=True, timeout=30, check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._tell(f"cannot run {self.squeue} ([slurm] squeue): {exc}")
            return True
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            self._tell(f"{self.squeue} failed: {(done.stderr.strip().splitlines() or ['?'])[0]}")
            return True
        return done.stdout.strip() in ("RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING")

    def _tell(self, what: str) -> None:
        if self.log is not None and not self.told:
            self.told = True
            self.log.write(f"{what}: the job's end cannot be confirmed, so I keep sampling")


def run_started_at(env: Mapping[str, str]) -> float | None:
    """When the prolog of this run ran, as it told us (GPUEFF_RUN_STARTED)."""
    try:
        return float(env["GPUEFF_RUN_STARTED"])
    except (KeyError, ValueError):
        return None


def squeue_for(config: Config) -> str:
    """squeue as configured, else from where sacct is configured to be."""
    folder = os.path.dirname(config.sacct)
    if config.squeue == "squeue" and folder:
        return os.path.join(folder, "squeue")
    return find_command(config.squeue)


def finish_orphan(sampler: Sampler, summary_path: str, live: LiveDelivery, log: HookLog) -> None:
    """Do the epilog's work ourselves, so the figures are not lost with it."""
    until = time.strftime("%H:%M:%S", time.localtime(sampler.sampled_until or 0))
    summary = sampler.snapshot(
        PARTIAL, f"no epilog stopped the sampler; it stopped itself after the job ended ({until})"
    )
    summary.ended_at = sampler.clock()
    checkpoint(summary_path, summary, log)
    log.write("the job ended without an epilog here: posting the summary myself")
    live.reap()  # a live delivery still running would make post() skip this one
    live.post(summary)
    live.reap()


def checkpoint(path: str, summary: NodeSummary, log: HookLog) -> None:
    """A failed write (disk full) costs this checkpoint, not the sampling: the next may work."""
    try:
        write_json(path, summary.to_dict())
    except GpuEffError as exc:
        log.write(f"checkpoint failed, sampling goes on: {exc}")


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


def inside_job_cgroup(job: JobContext, proc: str = "/proc") -> bool:
    """Whether this process runs in the job's own cgroup: PrologFlags=RunInJob (Slurm
    24.05+) runs the prolog, and so what it starts, in the job's extern step. One read of
    our own /proc/PID/cgroup; never raises (it only decides what to tell)."""
    try:
        return job.owns(job_of_pid(os.getpid(), proc))
    except Exception:
        return False


def tell_run_in_job(job: JobContext, config: Config, log: HookLog, proc: str = "/proc") -> str:
    """Says in the hook log, once, what PrologFlags=RunInJob means for this job's figures;
    returns the note for the summary ("" outside the job's cgroup)."""
    if not inside_job_cgroup(job, proc):
        return ""
    # The epilog's SIGTERM (or Slurm's, at the job's end) gets a last reading and a
    # complete summary; a SIGKILL leaves the last checkpoint, which the epilog marks partial.
    log.write(f"this sampler runs inside job {job.job_id}'s cgroup (PrologFlags=RunInJob: Slurm "
              "runs the prolog in the job's extern step): it ends with the job, and its CPU time "
              "and memory count as the job's. Stopped with SIGTERM it still takes a last reading; "
              "killed outright (SIGKILL, the job's memory limit) before the epilog stops it, its "
              f"figures end at its last checkpoint, up to {config.checkpoint_s:g} s before the "
              "job's end, and the node's summary is marked partial")
    return ("the sampler ran inside the job's cgroup (PrologFlags=RunInJob) and ends with the "
            f"job: killed outright, its figures end at its last checkpoint ({config.checkpoint_s:g} s apart)")


def run(job_dir: str, config: Config, started: float | None = None, stopper: Stopper | None = None) -> None:
    """The sampler process: never lets an exception escape without leaving a summary."""
    job = JobContext.from_env(os.environ)  # the prolog's environment: Slurm's variables
    log = HookLog(config.log_for(job.node), job.job_id, "sampler")
    run_in_job = tell_run_in_job(job, config, log)
    summary_path = os.path.join(job_dir, SUMMARY)
    stopper = stopper or Stopper()
    if started is None:
        started = run_started_at(os.environ)  # the prolog says when this run began
    session = None
    sampler: Sampler | None = None
    try:
        session = GpuSession(config)
        # The node's GPU map, renewed here (as root) only when slurmd or its config changed:
        # slurmd -G per job would disturb every other job of the node (Slurm 24.11+). GPUs
        # slurmd lists without device files raise BindingError: "cannot sample", below.
        minors = gpu_minors(job.node, config, warn=log.write)
        if not minors:  # never silent: on a node whose gres order is not the minors', wrong GPUs
            log.write(f"'{config.slurmd} -G' gave no GPU list ([slurm] slurmd): Slurm's GPU "
                      "indexes are taken as device minors, right only where gres.conf lists "
                      "/dev/nvidia[0-N] in order")
        gpus = session.bind(parse_job_gpus(job.job_gpus), minors)
        log.write(f"sampling {len(gpus)} GPU(s): Slurm indexes {[g.index for g in gpus]} "
                  f"= minors {[g.minor for g in gpus]}")
        sampler = Sampler(job, config, gpus, clock=session.clock, xid_events=session.xid_events,
                          time_scale=session.time_scale, other_processes=session.other_processes,
                          run_started=started)
        if run_in_job:  # kept with the binding's evidence, which `gpueff --json` shows
            sampler.binding.note(run_in_job)
        loop(sampler, stopper, job_dir, Spool(config.spool_for(job.node)), log)
        log.write("stopped cleanly")
    except GpuEffError as exc:
        log.write(f"cannot sample: {exc}")
        # Keep what was measured: a failure mid-job must not overwrite it with nothing.
        summary = (job.summary(MISSING, str(exc), interval_s=config.interval_s,
                               run_started_at=started) if sampler is None
                   else sampler.snapshot(PARTIAL, f"sampling stopped: {exc}"))
        checkpoint(summary_path, summary, log)
    finally:
        unexport(config, job.job_id)  # however the sampler ends: no stale figures
        if session is not None:
            session.close()


def begin(env: Mapping[str, str]) -> None:
    """Started by the shell prolog (prolog/gpueff-prolog), which returned as soon as this
    process had its own session: the prolog's work is done here, off the job's start.
    setsid() again in case the shell had no setsid(1) to start it with."""
    from .hooks import prepare, write_pid

    with contextlib.suppress(OSError):
        os.setsid()
    job_id, node = env.get("SLURM_JOB_ID", "?"), env.get("SLURMD_NODENAME", "")
    try:
        config = load_config()
    except GpuEffError as exc:
        HookLog(Config().log_for(node), job_id, "prolog").write(str(exc))
        return
    log = HookLog(config.log_for(node), job_id, "prolog")
    try:
        prepared = prepare(env, config)
        if prepared is None:
            return
        job_dir, started = prepared
        stopper = Stopper()  # before the pid file: from then on the epilog may signal us
        write_pid(job_dir, os.getpid(), started)
    except (GpuEffError, OSError) as exc:
        log.write(str(exc))
        return
    log.write(f"sampler pid {os.getpid()} started for SLURM_JOB_GPUS={env.get('SLURM_JOB_GPUS', '')}")
    run(job_dir, config, started, stopper)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--prolog":
        try:
            begin(os.environ)
        except Exception as exc:  # last resort, as below
            with contextlib.suppress(Exception):
                HookLog(load_config().log_for(os.environ.get("SLURMD_NODENAME", "")), argv[1],
                        "sampler").write(f"crashed: {exc!r}")
        return 0
    if len(argv) != 1:
        print("usage: python -m slurm_gpu_eff.node.sampler JOB_DIR | --prolog JOB_ID", file=sys.stderr)
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
