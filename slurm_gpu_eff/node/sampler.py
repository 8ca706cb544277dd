"""The per-job sampler: polls the job's GPUs, keeps streaming statistics, checkpoints.

Started detached by the shell prolog (`python -m slurm_gpu_eff.node.sampler --prolog
JOBID`: it then does the prolog's work itself, begin()) or by the Python one (`... JOB_DIR`),
with the prolog's environment (SLURM_JOB_ID, SLURM_JOB_GPUS, SLURMD_NODENAME...), stopped by
the epilog with SIGTERM, on which it takes a last reading, writes its summary and
exits; or by the shell epilog with SIGUSR1, on which it also does the epilog's work:
posts the final summary to the outbox and starts a deliverer (finish()). Memory is
constant whatever the job's length; a checkpoint reaches the spool at least every
`checkpoint_s`, and a live copy goes to the store every `live_s` so a running job can
be reported. Standard library and pynvml only: this is a hot path.

Here: the Sampler, its loop, and the process (run, begin, main). Beside it: the per-GPU
statistics (gpustats.py), the orphan watch (orphan.py), and live delivery with the
Prometheus export (live.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping

from ..config import DEFAULT_PATH, Config, load_config
from ..errors import GpuEffError, GpuLost
from ..model import COMPLETE, MISSING, PARTIAL, RUNNING, NodeSummary
from .binding import gpu_minors
from .frameworks import FrameworkWatch
from .gpu import ALL_GI, Gpu, GpuSession
from .gpustats import GpuStats
from .jobenv import JobContext, job_of_pid, parse_job_gpus
from .live import LiveDelivery, export_live, unexport
from .log import HookLog
from .orphan import OrphanWatch, squeue_for
from .spool import SUMMARY, Spool, locator_path, remove_locator, write_json, write_locator
from .verify import BindingCheck

VERIFY_EVERY_S = 10.0  # wall seconds between looks at the node's other GPUs and the cgroup
# A poll this late (the sampler stopped, or starved on a loaded node) follows a gap no
# reading covered: it ends an idle stretch, never lengthens one (the idle policy cancels
# on it). Polls interval_s apart, in the driver clock's seconds.
GAP_POLLS, GAP_MIN_S = 5, 30.0
LINK_EVERY_POLLS = 10  # polls between looks at the GPUs' PCIe link speed (Gpu.read_pcie)
# Seconds (the driver's clock, as the memory samples' below) between reads of the energy
# counter. On a Hopper GPU the read costs 3-3.5 ms of CPU (a third of a poll's NVML calls;
# docs/metrics.md), and a counter loses nothing between reads: the job's energy is its
# difference. Read too at each poll before a checkpoint or a scheduled live copy, and at
# the final reading, so their energy ends with their window (a copy the idle policy's
# level sends at once may lag up to this).
ENERGY_EVERY_S = 10.0
# Seconds (the driver's clock) between reads of the memory-utilisation samples. The read
# costs 2.8 ms of CPU on a Hopper GPU whatever it returns, and the driver keeps every
# sample till it is read: 71 of each kind, 12-14 s of them on an H200 (docs/metrics.md).
# Unlike the GPU samples (the idle policy's figure every poll), nothing reads the memory
# figure between summaries, so it is read at this cadence and at the poll before each
# summary; a GPU whose driver dropped samples at this cadence is read every poll from then
# on (SampleSeries.every_poll).
MEM_SAMPLES_EVERY_S = 5.0


class Sampler:
    """Polls the job's GPUs. Times come from `clock` (the driver's clock: wall time, or
    the simulation's, which may run faster); the time between polls, which the readings
    stand for, from `monotonic` (in the driver clock's seconds: times `time_scale`), so
    that a step of the wall clock changes the dates only; waits are in wall time,
    `time_scale` apart."""

    def __init__(
        self, job: JobContext, config: Config, gpus: list[Gpu],
        clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
        xid_events: Callable[[], list[tuple[str, int, int]]] = list, time_scale: float = 1.0,
        other_processes: Callable[[], list[tuple[int, list[int]]]] = list,
        cgroup_root: str = "/sys/fs/cgroup", run_started: float | None = None,
        node_processes: Callable[[], list[tuple[int, list[int]]] | None] = lambda: None,
    ) -> None:
        self.job = job
        self.config = config
        self.gpus = [GpuStats(g, job.job_id, job.sluid) for g in gpus]
        self.clock = clock
        self.monotonic = monotonic
        self.xid_events = xid_events
        self.other_processes = other_processes  # the node's unbound GPUs: (minor, pids)
        self.node_processes = node_processes  # every GPU of the node, or None: a partial look
        self.binding = BindingCheck(job.job_id, job.node, [g.minor for g in gpus if not g.is_mig],
                                    cgroup_root, sluid=job.sluid)
        self._next_verify = 0.0  # monotonic time of the next look beyond the bound GPUs
        self.wait_s = config.interval_s / time_scale
        self.gap_s = max(GAP_POLLS * config.interval_s, GAP_MIN_S)  # a poll this late follows a gap
        self.time_scale = time_scale
        self.started_at = clock()
        self.run_started_at = run_started  # when this run's prolog ran: the run's identity
        # The binding is the first look: the driver's samples and GPM's first sample count
        # from it, so the window does too (the first poll may come a while later on a busy
        # node: Slurm's and the store's setup run between).
        self.sampled_from: float | None = min((g.bound_at for g in gpus), default=None)
        self.sampled_until: float | None = None
        self._last_mono = monotonic()  # at the last reading; first, here (just after binding)
        # The first poll stands for the time since binding: to here, then from here on.
        self._to_here = 0.0 if self.sampled_from is None else max(0.0, self.started_at - self.sampled_from)
        self.export_failed = False
        self.frameworks = FrameworkWatch()  # what the job's GPU processes run on
        self.polls = 0
        self._next_energy = 0.0  # monotonic time the energy counter is next read by cadence
        self._next_mem = 0.0  # ... and the memory-utilisation samples

    def sample_once(self, full: bool = True) -> None:
        """One poll of every GPU. `full` False (the loop's polls between summaries): the
        energy counter and the memory-utilisation samples are read only where their
        cadence has come round (ENERGY_EVERY_S, MEM_SAMPLES_EVERY_S since the last read)."""
        mono = self.monotonic()
        energy_counter = full or mono >= self._next_energy
        if energy_counter:
            self._next_energy = mono + ENERGY_EVERY_S / self.time_scale
        mem_samples = full or mono >= self._next_mem
        if mem_samples:  # in the driver's seconds, as its buffer holds them
            self._next_mem = mono + MEM_SAMPLES_EVERY_S / self.time_scale
        now = self.clock()
        # A reading stands for the time since the one before (NVML's figures look back),
        # the first for the time since binding: the mean covers [binding, last reading].
        seconds = self._since_last()
        gap = seconds > self.gap_s
        # Every GPU read first, then every reading added: the GPUs are read at one instant,
        # and each half runs with its code still warm from the GPU before (less CPU a poll).
        readings = []
        for stats in self.gpus:
            if stats.lost_at is not None:
                continue
            try:
                readings.append((stats, stats.gpu.read(bool(stats.shared_s), energy_counter, mem_samples)))
            except GpuLost as exc:
                stats.lost_at = now
                stats.errors.append(f"{exc}: a hardware fault, not the job's; figures up to then")
        seen = self.frameworks.seen
        for stats, reading in readings:
            stats.add(reading, seconds, gap)
            pids = reading.pids
            if pids and self.binding.wants(stats.gpu.minor, pids):
                owners = {pid: stats.job_of(pid) for pid, _ in pids}
                self.binding.processes(stats.gpu.minor, owners, bound=True)
            if pids:
                for pid, _ in pids:
                    if pid not in seen:  # a process new to the job's GPUs: once each
                        self._classify(stats, pid)
        self.polls += 1
        if self.polls % LINK_EVERY_POLLS == 0:  # a link idle at binding runs faster under load
            for stats, reading in readings:
                stats.gpu.read_pcie(reading.util)
        self._record_xids(now)
        # Did the job use any GPU at all? (verify.py) The node's GPUs are listed only while
        # a look can still tell: not once settled, nor after a partial look.
        if self.binding.scanning():
            self.binding.node_scan(self.node_processes(), job_of_pid)
        self._verify()
        self.sampled_from = self.sampled_from or now
        # Never back: a wall clock stepped back leaves the window where it was (it would
        # end before it began, and the store keeps the copy sampled latest) until it
        # catches up; stepped forward, the window's end moves with it.
        self.sampled_until = now if self.sampled_until is None else max(self.sampled_until, now)

    def _classify(self, stats: GpuStats, pid: int) -> None:
        """Which framework a new process on the job's GPUs runs on, if it is the job's
        (another job's, on a shared GPU, says nothing of this one)."""
        watch = self.frameworks
        if not watch.wants(pid):
            return
        if self.job.owns(stats.job_of(pid)):
            watch.look(pid)
        else:
            watch.skip(pid)

    def _since_last(self) -> float:
        """The poll's span on the monotonic clock, in the driver clock's seconds (the
        simulation's run `time_scale` faster): what the poll's readings and an idle
        stretch count, so that a step of the wall clock (NTP) neither stretches a reading
        over hours nor lengthens a stretch, nor makes a span negative."""
        mono = self.monotonic()
        span = max(0.0, mono - self._last_mono) * self.time_scale + self._to_here
        self._last_mono, self._to_here = mono, 0.0
        return span

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
            frameworks=self.frameworks.result(),
        )


class Stopper:
    """Turns SIGTERM/SIGINT into a flag and wakes any wait at once (no sleep to finish).
    SIGUSR1 is the shell epilog's stop (epilog/gpueff-epilog): do the epilog's work too
    (finish()); SIGTERM, Slurm's or the Python epilog's, leaves the final summary as the
    checkpoint for the epilog to post."""

    def __init__(self) -> None:
        self.requested = False
        self.epilog = False  # asked by the shell epilog to post the final summary itself
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        self._poll = select.poll()  # once a poll: cheaper than select(), which builds fd sets
        self._poll.register(self._read, select.POLLIN)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True
        if signum == signal.SIGUSR1:
            self.epilog = True

    def wait(self, seconds: float) -> None:
        if seconds > 0 and not self.requested and self._poll.poll(seconds * 1000):
            os.read(self._read, 512)


FIRST_LIVE_S = 10.0


def loop(sampler: Sampler, stopper: Stopper, job_dir: str, spool: Spool, log: HookLog) -> NodeSummary | None:
    """Sample until told to stop, checkpointing and posting live copies on the way. The
    final summary when it posted it for the shell epilog (finish()), else None."""
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
        # What falls due at this tick, decided before the poll so that the poll before a
        # checkpoint or a scheduled live copy is a full one, the energy counter and the
        # memory samples read too (between them, by their cadence). A deadline within half
        # an interval counts as now: set an interval's multiple after a poll's end, it
        # would otherwise fall due at this tick or the next as the polls' lengths jitter.
        soon = sampler.monotonic() + sampler.wait_s / 2
        checkpoint_due, live_due = soon >= next_checkpoint, soon >= next_live
        sampler.sample_once(checkpoint_due or live_due)
        export_live(sampler, log)
        now = sampler.monotonic()
        level = sampler.idle_level()
        # The alert (or cancel) minute passed, or a stretch past it ended (the GPU worked,
        # or a gap in the readings): the store hears at once, so that the idle watch never
        # cancels on a copy from before the GPU went back to work.
        if level != posted_level and live.post(sampler.snapshot(RUNNING)):
            posted_level, live_due = level, False
            next_live = now + config.live_s
        if checkpoint_due:
            if not os.path.isdir(job_dir):
                log.write("the job's spool directory is gone (its epilog ran): stopping")
                return None
            if orphan.ended():
                finish_orphan(sampler, summary_path, live, log)
                return None
            checkpoint(summary_path, sampler.snapshot(RUNNING), log)
            next_checkpoint = now + config.checkpoint_s
        if live_due:
            live.post(sampler.snapshot(RUNNING))
            next_live = now + config.live_s
        next_tick += sampler.wait_s
        if next_tick <= now:  # fell behind (suspended, overloaded): do not burst to catch up
            next_tick = now + sampler.wait_s
        stopper.wait(next_tick - sampler.monotonic())
    if stopper.epilog:
        return finish(sampler, job_dir, spool, log)
    sampler.sample_once()
    checkpoint(summary_path, sampler.snapshot(COMPLETE), log)
    live.reap()
    return None


def run_started_at(env: Mapping[str, str]) -> float | None:
    """When the prolog of this run ran, as it told us (GPUEFF_RUN_STARTED)."""
    try:
        return float(env["GPUEFF_RUN_STARTED"])
    except (KeyError, ValueError):
        return None


def finish(sampler: Sampler, job_dir: str, spool: Spool, log: HookLog) -> NodeSummary | None:
    """The epilog's work, done here when the shell epilog asks for it (SIGUSR1), so that
    the epilog starts no interpreter and reads no config: the last reading, and the node's
    final summary posted to the outbox, before the GPUs are let go (run() closes NVML
    after, then calls handed_over()). None when it could not be posted: it is left as the
    checkpoint in the job's directory, which the epilog's Python path posts as it always
    did (the shell hands over when this process ends without saying "posted")."""
    sampler.sample_once()
    summary = sampler.snapshot(COMPLETE)
    summary.ended_at = time.time()  # as the Python epilog dates it: wall time
    try:
        spool.post(summary)
    except GpuEffError as exc:
        log.write(f"cannot post the final summary, left for the epilog: {exc}")
        checkpoint(os.path.join(job_dir, SUMMARY), summary, log)
        return None
    return summary


POSTED = "gpueff-posted"  # this process's name (/proc/PID/comm) once it may go: see below


def handed_over(summary: NodeSummary, job_dir: str, config: Config, log: HookLog) -> None:
    """After finish() posted and NVML is shut down: says so to the shell epilog, which
    returns then (its wait ends on a name in /proc, which costs no disk write, not on
    what follows, which may wait on the file system's journal behind the post's fsync):
    then the job's spool directory goes (after the post: the Python epilog reads its
    absence as "posted"), the log line, a deliverer."""
    from .hooks import deliver

    try:
        with open("/proc/self/comm", "w", encoding="ascii") as handle:
            handle.write(POSTED)
    except OSError:
        pass  # the epilog then waits for this process to end, and sees the directory gone
    remove_job_dir(job_dir)
    log.write(f"posted {summary.status} summary ({len(summary.gpus)} GPUs)")
    # A live copy's delivery may still run (not waited for: it takes this one or leaves
    # it to the deliverer started here, which retries while the store is away).
    deliver(config, Spool(config.spool_for(summary.node)), os.environ, log)


def remove_job_dir(job_dir: str) -> None:
    """shutil.rmtree for the files the sampler and the prologs leave there (no
    subdirectories); shutil would import fnmatch and more on the epilog's time."""
    try:
        names = os.listdir(job_dir)
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(job_dir, name))
    with contextlib.suppress(OSError):
        os.rmdir(job_dir)


def job_locator(config: Config, job: JobContext) -> str | None:
    """Where the shell epilog looks for this job's sampler (spool.locator_path)."""
    return locator_path(config.path or DEFAULT_PATH, job.node, job.job_id)


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
    posted: NodeSummary | None = None  # for the shell epilog (finish)
    try:
        session = GpuSession(config, job.node)
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
                          run_started=started, node_processes=session.node_processes)
        if run_in_job:  # kept with the binding's evidence, which `gpueff --json` shows
            sampler.binding.note(run_in_job)
        posted = loop(sampler, stopper, job_dir, Spool(config.spool_for(job.node)), log)
        if posted is None:  # else handed_over() says how it ended
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
        if posted is not None:
            handed_over(posted, job_dir, config, log)
        remove_locator(job_locator(config, job))


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
    locator = job_locator(config, JobContext.from_env(env))
    if locator:
        try:  # the shell epilog's way to this process; without it, its slower Python path
            write_locator(locator, os.getpid(), started, job_dir)
        except OSError as exc:
            log.write(f"cannot write {locator} ({exc.strerror or exc}): this job's epilog "
                      "takes its slower path")
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
        # Gone at once: the epilog waits for this process to end, and the interpreter's
        # teardown would cost it ~10 ms. Nothing is left to flush: every file written is
        # closed, NVML is shut down, stdio is /dev/null.
        os._exit(0)
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
