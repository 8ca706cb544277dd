"""Per-GPU streaming statistics: GpuStats adds each poll's Reading to accumulators of
constant memory and, at the end, gives the GPU's GpuSummary. Apart from the sampler's
loop because it only keeps figures (no signals, spool or store; /proc only to tell whose
processes are on the GPU) and is tested on its own. Standard library and pynvml only, as
the sampler that runs it, once a GPU a poll."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..model import GpuSummary
from .gpu import THROTTLE_REASONS, Gpu, Reading
from .jobenv import job_of_pid, same_job
from .stats import Histogram, Stat, Timeline

THROTTLE_ANY = sum(THROTTLE_REASONS.values())
# Polls whose readings wait to be added together (GpuStats.add): the memory of a few polls
# a GPU; nothing sees the figures late, as anything that reads them adds them first.
FLUSH_POLLS = 16


class GpuStats:
    """Accumulators for one GPU: constant memory whatever the job's length."""

    # Slots: its ~30 fields read and written each poll straight from the object (a dict
    # this wide is not shared between instances in CPython 3.11: each poll's lookups would
    # go through its own), and no field can be added on the way.
    __slots__ = (
        "ecc_first", "ecc_last", "elapsed", "energy_counted", "energy_counter_j", "energy_last_mj",
        "errors", "first_at", "gpu", "histogram", "idle_from", "idle_from_s", "idle_longest",
        "idle_s", "job_id", "job_processes", "jobs_of_pids", "lost_at", "own_listed", "pending",
        "power_energy_j", "processes_max", "samples", "seconds", "settled_pids", "shared_s",
        "shared_with", "sluid", "_stats", "throttle_observed_s", "throttle_s", "timeline",
        "util_source", "xid_events",
    )

    def __init__(self, gpu: Gpu, job_id: str = "", sluid: str = "") -> None:
        self.gpu = gpu
        self.job_id = job_id
        self.sluid = sluid  # Slurm 26.05: job_of_pid() names the job's processes by it on v2
        self._stats: defaultdict[str, Stat] = defaultdict(Stat)  # made on first use, in C
        # (reading, seconds, the poll's util, its place in the window, own (memory, util)):
        # the polls not added to the figures yet
        self.pending: list[tuple[Reading, float, float | None, float, Any]] = []
        self.util_source: str | None = None
        self.histogram = Histogram()
        self.timeline = Timeline()
        # Where the window began (the driver's clock), and the time since on the monotonic
        # clock: where in the window a reading lies (timeline, longest stretch), whatever
        # the wall clock did meanwhile.
        self.first_at: float | None = None
        self.elapsed = 0.0
        # The longest stretch of polls under the idle line: a mean hides a job that worked
        # for an hour and then idled for ten minutes. Offsets from the window's start.
        self.idle_from: float | None = None  # where the open stretch began (the driver's clock)
        self.idle_from_s = 0.0  # the same, as an offset in the window
        self.idle_s = 0.0  # its measured length: what the idle policy cancels on
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
        self.processes_max: int | None = None  # the job's processes (job_processes), most at once
        self.job_processes = 0  # the job's processes on the GPU at the last poll that looked
        self.lost_at: float | None = None
        self.errors: list[str] = []
        self.shared_s: float | None = None  # time other jobs' processes were on this GPU
        self.shared_with: set[str] = set()
        self.own_listed = False  # the job's own processes were on the GPU at the last poll
        self.jobs_of_pids: dict[int, str | None] = {}
        # The processes (pid, memory) of the last poll, while a poll with the same ones can
        # change nothing of the sharing figures (_add_sharing says when): not looked at again
        self.settled_pids: list[tuple[int, int]] | None = None

    @property
    def stats(self) -> defaultdict[str, Stat]:
        """Each figure's accumulator, every poll's reading added."""
        if self.pending:
            self.flush()
        return self._stats

    def stat(self, name: str) -> Stat:
        return self.stats[name]

    def add(self, reading: Reading, seconds: float, gap: bool = False) -> None:
        """`seconds`: the time the reading stands for, measured on the monotonic clock (in
        the driver clock's seconds); `gap`: no reading covered that time (the sampler was
        stopped). A poll that read nothing (NVML failing) is no time sampled, and ends an
        idle stretch."""
        # Once a GPU a poll, after a wait that left the caches cold: only what the next
        # poll needs is done now (the idle stretch, whose processes share the GPU); the
        # figures' accumulators take the readings FLUSH_POLLS at a time, in one warm loop
        # (each reading in its order: the same figures), and before anything reads them.
        util = reading.util
        if util is None and reading.empty:  # util first: one test in the usual case
            self._add_idle(reading.time, seconds, None, gap)
            return
        self.samples += 1
        self.seconds += seconds
        samples = reading.util_samples
        if samples:  # the samples' mean stands for the poll (Reading.util_mean: as before)
            util = reading.util_mean
        pids, process_sm = reading.pids, reading.process_sm
        own = None  # the job's own (memory, SM share) on a shared GPU, for the figures
        if pids is not None:
            if pids != self.settled_pids or process_sm is not None:
                own = self._add_sharing(pids, process_sm, seconds)
            if self.processes_max is None or self.job_processes > self.processes_max:
                self.processes_max = self.job_processes
        place = self._add_idle(reading.time, seconds, util, gap)
        pending = self.pending
        pending.append((reading, seconds, util, place, own))
        if len(pending) >= FLUSH_POLLS:
            self.flush()

    def flush(self) -> None:
        """The pending polls' readings into the accumulators, oldest first."""
        pending = self.pending
        for reading, seconds, util, place, own in pending:
            self._accumulate(reading, seconds, util, place, own)
        pending.clear()

    def _accumulate(self, reading: Reading, seconds: float, util: float | None, place: float,
                    own: tuple[int | None, float | None] | None) -> None:
        """One poll's reading into the figures, as add() left it: `util` the poll's (the
        driver samples' mean, where there were any), `place` where in the window it lies,
        `own` the job's own memory and SM share on a shared GPU (None: no look this poll)."""
        stats = self._stats
        samples = reading.util_samples
        if samples:  # lossless driver samples where there are any, else the poll's rate
            self._series("util", samples, self.histogram)
        elif util is not None:
            if samples is None and self.util_source is None:  # not supported
                self.util_source = "rates"
            stats["util"].add(util, seconds)
            self.histogram.add(util, seconds)
        samples = reading.mem_util_samples
        if samples:
            self._series("mem_util", samples, None)
        elif reading.mem_util is not None:
            stats["mem_util"].add(reading.mem_util, seconds)
        gpm = reading.gpm
        if gpm:  # GPM's means cover the time since its last sample, not this poll's
            gpm_s = reading.gpm_s
            for name, figure in gpm.items():
                stats[name].add(figure, gpm_s)
        mem, power = reading.mem_used_bytes, reading.power_w
        if mem is not None:
            stats["mem_used_bytes"].add(mem, seconds)
        if power is not None:
            stats["power_w"].add(power, seconds)
            self.power_energy_j += power * seconds
        value = reading.temp_c
        if value is not None:
            stats["temp_c"].add(value, seconds)
        value = reading.sm_clock_mhz
        if value is not None:
            stats["sm_clock_mhz"].add(value, seconds)
        counter = reading.energy_mj
        if counter is not None:
            last = self.energy_last_mj
            if last is not None:
                delta = counter - last
                # A counter that went backwards was reset (driver reload): count from zero.
                self.energy_counter_j += (delta if delta >= 0 else counter) / 1000.0
                self.energy_counted = True
            self.energy_last_mj = counter
        mask = reading.throttle_mask
        if mask is not None:
            self.throttle_observed_s = (self.throttle_observed_s or 0.0) + seconds
            if mask & THROTTLE_ANY:
                self._add_throttle(mask, seconds)
        ecc = reading.ecc_uncorrected
        if ecc is not None:
            if self.ecc_first is None:
                self.ecc_first = ecc
            self.ecc_last = ecc
        if own is not None:
            own_mem, own_util = own
            if own_mem is not None:
                stats["own_mem_used_bytes"].add(own_mem, seconds)
            if own_util is not None:
                stats["own_util"].add(own_util, seconds)
        self.timeline.add(place, seconds, util, gpm.get("sm_active") if gpm else None, power,
                          None if mem is None else mem / 1024**3)

    def _add_idle(self, at: float, seconds: float, util: float | None, gap: bool = False) -> float:
        """The stretch is the sum of the idle polls' measured seconds, never the distance
        between two clock readings: a wall-clock step (NTP) lengthens nothing, and a poll
        whose utilisation could not be read ends the stretch (no reading is no evidence
        of idleness, and the idle policy cancels jobs on this figure). After a `gap` an
        idle poll begins a new stretch, the unread time not in it. Returns where in the
        window the reading lies: its start on the driver's clock, plus the measured time
        since (the wall clock's steps move no reading in the timeline)."""
        if self.first_at is None:
            self.first_at = at - seconds
        self.elapsed += seconds
        place = self.first_at + self.elapsed
        if gap:
            self.idle_from, self.idle_s, seconds = None, 0.0, 0.0
        if util is None or util >= Histogram.IDLE_BELOW:
            self.idle_from, self.idle_s = None, 0.0
            return place
        if self.idle_from is None:
            self.idle_from, self.idle_from_s, self.idle_s = at - seconds, self.elapsed - seconds, 0.0
        self.idle_s += seconds
        if self.idle_longest is None or self.idle_s > self.idle_longest[1]:
            self.idle_longest = (self.idle_from_s, self.idle_s)
        return place

    def idle_now(self) -> tuple[float, float] | None:
        """The stretch under the idle line the GPU is in now: (since: the driver's clock,
        measured seconds)."""
        if self.idle_from is None or self.lost_at is not None:
            return None
        return self.idle_from, self.idle_s

    def _series(
        self, name: str, samples: list[tuple[float, float]], histogram: Histogram | None,
    ) -> None:
        """Lossless driver samples (the poll's rate stands in where there are none: add())."""
        if name == "util":
            self.util_source = "samples"
        stat = self._stats[name]
        for value, weight in samples:
            stat.add(value, weight)
            if histogram is not None:
                histogram.add(value, weight)

    def _add_throttle(self, mask: int, seconds: float) -> None:
        for reason, bit in THROTTLE_REASONS.items():
            if mask & bit:
                self.throttle_s[reason] += seconds

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
                self.settled_pids = None  # their jobs are to be read again
            job = self.jobs_of_pids[pid] = job_of_pid(pid)
            return job

    @property
    def shared(self) -> bool:
        return bool(self.shared_s)

    def _add_sharing(
        self, pids: list[tuple[int, int]], process_sm: dict[int, float] | None, seconds: float,
    ) -> tuple[int | None, float | None]:
        """Which jobs' processes are on the GPU: ours, another job's, or outside any job's
        (pids that cannot be traced count for neither). Returns the job's own memory and
        SM share for the figures (None: not a figure this poll)."""
        own_mem, others, listed, mine = 0, None, False, 0
        jobs, job_id, sluid = self.jobs_of_pids, self.job_id, self.sluid
        for pid, used in pids:
            job = jobs[pid] if pid in jobs else self.job_of(pid)
            if job and (job == job_id or job == sluid):  # same_job(), written out: every poll
                own_mem += used
                listed = True
                mine += 1
            elif job is not None:
                others = others or set()
                others.add(f"job {job}" if job else "processes outside any job")
                if not job:
                    mine += 1  # no job's: may serve ours (an MPS server lists, its clients not)
            else:
                mine += 1  # whose it is cannot be read (gone already): it may be ours
        # For "did the job ever open this GPU": another job's process (one the job before
        # left behind, stuck in its cgroup as Slurm could not kill it) opened nothing of
        # this job's. Only then does a report say "never opened by the job".
        self.job_processes = mine
        if others:
            self.shared_s = (self.shared_s or 0.0) + seconds
            self.shared_with |= others
        elif self.shared_s is None:
            self.shared_s = 0.0
        own_mem_used = own_mem if self.shared_s else None
        # The driver gives each process's SM share of its last period only, and a poll lets
        # it stand for the time since the poll before. In the poll the job's processes left
        # the GPU in (at the latest the last: they exit, then the epilog stops us), when
        # they stopped is unknown: that stretch is left out, not counted as idle.
        left = self.own_listed and not listed
        self.own_listed = listed
        # The same processes next poll, without per-process samples, change nothing here:
        # each one's job is in the cache, no other job's (shared_s stays 0.0, no own
        # memory is counted), own_listed stays as it is.
        self.settled_pids = pids if (self.shared_s == 0.0 and process_sm is None
                                     and all(pid in jobs for pid, _ in pids)) else None
        if process_sm is None or left:
            return own_mem_used, None
        own = sum(sm for pid, sm in process_sm.items()
                  if same_job(self.job_of(pid), self.job_id, self.sluid))
        return own_mem_used, own

    def energy(self) -> tuple[float | None, str | None]:
        if self.pending:
            self.flush()
        if self.energy_counted:
            return self.energy_counter_j, "counter"
        if "power_w" in self.stats:
            return self.power_energy_j, "power"
        return None, None

    def last(self, name: str) -> float | None:
        stat = self.stats.get(name)
        return stat.last if stat is not None and stat.samples else None

    def summary(self, node: str) -> GpuSummary:
        self.flush()
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
            errors=(gpu.error_lines() + self.errors)[:20],
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
            pcie_link=gpu.pcie_link(), nvlink=gpu.nvlink,
        )


def _idle_now(stretch: tuple[float, float] | None) -> dict[str, float] | None:
    return None if stretch is None else {"since": round(stretch[0], 3), "seconds": round(stretch[1], 3)}
