"""stats.Stat: streaming time-weighted statistics (the sampler's accumulator)."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_gpu_eff.node.stats import Stat


def test_mean_is_weighted_by_the_time_each_reading_stands_for() -> None:
    stat = Stat()
    stat.add(10.0, 0.0)  # the first reading stands for no time
    stat.add(20.0, 1.0)
    stat.add(50.0, 3.0)
    # (20*1 + 50*3) / (1 + 3); the unweighted mean would be 26.67
    assert stat.mean == pytest.approx(42.5, abs=1e-12)
    assert (stat.min, stat.max, stat.last) == (10.0, 50.0, 50.0)
    assert (stat.samples, stat.seconds) == (3, 4.0)


def test_a_late_reading_counts_for_its_longer_interval() -> None:
    stat = Stat()
    for value, seconds in [(0.0, 0.0), (100.0, 1.0), (100.0, 1.0), (0.0, 8.0)]:
        stat.add(value, seconds)
    assert stat.mean == pytest.approx(20.0, abs=1e-12)  # 200 / 10


def test_none_is_not_measured_not_zero() -> None:
    stat = Stat()
    stat.add(80.0, 0.0)
    stat.add(80.0, 2.0)
    stat.add(None, 5.0)  # a failed reading: neither a zero nor time
    stat.add(40.0, 2.0)
    assert stat.mean == pytest.approx(60.0, abs=1e-12)  # (160 + 80) / 4
    assert stat.min == 40.0
    assert stat.last == 40.0  # None does not become the last value
    assert (stat.samples, stat.seconds) == (3, 4.0)


def test_only_none_readings_leave_everything_unmeasured() -> None:
    stat = Stat()
    stat.add(None, 1.0)
    stat.add(None, 1.0)
    assert stat.to_dict() == {
        "mean": None, "min": None, "max": None, "last": None, "samples": 0, "seconds": 0.0,
    }


def test_a_single_zero_weight_reading_is_its_own_mean() -> None:
    stat = Stat()
    stat.add(37.0, 0.0)
    assert stat.mean == 37.0
    assert stat.to_dict() == {
        "mean": 37.0, "min": 37.0, "max": 37.0, "last": 37.0, "samples": 1, "seconds": 0.0,
    }


def test_zero_weight_first_reading_counts_for_min_max_but_not_the_mean() -> None:
    stat = Stat()
    stat.add(0.0, 0.0)
    stat.add(90.0, 0.5)
    assert stat.mean == 90.0
    assert (stat.min, stat.max) == (0.0, 90.0)


def test_zero_is_a_real_reading() -> None:
    stat = Stat()
    stat.add(0.0, 0.0)
    stat.add(0.0, 1.0)
    assert (stat.mean, stat.min, stat.max, stat.last, stat.samples) == (0.0, 0.0, 0.0, 0.0, 2)


def test_to_dict_rounds_seconds_to_milliseconds() -> None:
    stat = Stat()
    stat.add(1.0, 0.0)
    stat.add(3.0, 0.12345)
    stat.add(5.0, 0.2)
    data = stat.to_dict()
    assert data["seconds"] == 0.323
    assert data["mean"] == pytest.approx((3.0 * 0.12345 + 5.0 * 0.2) / 0.32345, abs=1e-12)
    assert (data["min"], data["max"], data["last"], data["samples"]) == (1.0, 5.0, 5.0, 3)


def test_memory_is_constant_whatever_the_number_of_readings() -> None:
    stat = Stat()
    for i in range(10_000):
        stat.add(float(i % 100), 1.0)
    assert not hasattr(stat, "__dict__")  # __slots__: no list of readings can hide here
    assert stat.samples == 10_000
    assert stat.mean == pytest.approx(49.5, abs=1e-9)
    assert (stat.min, stat.max, stat.last) == (0.0, 99.0, 99.0)


def test_a_gpus_accumulators_and_its_reader_have_fixed_fields() -> None:
    """GpuStats and Gpu keep their fields in slots (a poll reads them without a dict's
    lookups): nothing can be added to them on the way, so nothing can grow there."""
    from slurm_gpu_eff.node.gpu import Gpu
    from slurm_gpu_eff.node.sampler import GpuStats

    assert GpuStats.__dictoffset__ == 0 and Gpu.__dictoffset__ == 0  # no instance dict
    track = GpuStats(gpu=None)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        track.readings = []  # type: ignore[attr-defined]


def test_the_longest_idle_stretch_of_a_gpu() -> None:
    """Polls under 5% in a row make a stretch, a busy poll ends it, and so does an
    unmeasured one (no reading is no evidence of idleness: issue 20); the longest is kept
    with where it began."""
    from slurm_gpu_eff.node.sampler import GpuStats

    track = GpuStats(gpu=None)  # type: ignore[arg-type]
    utils = [90, 90, 1, 0, 2, 90, 0, 0, None, 0, 0, 4, 90]  # one poll a second from t=1
    for t, util in enumerate(utils, start=1):
        track._add_idle(float(t), 1.0, None if util is None else float(util))
    assert track.idle_longest == (2.0, 3.0)  # t=3..5; t=7..12 is two stretches, 2 s and 3 s


def test_gpm_means_count_for_the_time_they_cover_not_the_poll_they_came_with() -> None:
    """NVML's GPM wants its samples over 100 ms apart, so at a short interval a GPM mean
    comes every few polls and covers all of them; at a late poll it covers more. Its
    weight is that time: 80% over 1 s then 20% over 3 s is 35% (by poll, it was 50%)."""
    from slurm_gpu_eff.node.gpu import Reading
    from slurm_gpu_eff.node.sampler import GpuStats

    track = GpuStats(gpu=None)  # type: ignore[arg-type]

    def poll(at: float, gpm: dict[str, float] | None, covers: float) -> None:
        track.add(Reading(time=at, util=50.0, mem_util=None, mem_used_bytes=None, power_w=None,
                          energy_mj=None, gpm=gpm, gpm_s=covers), 0.05)

    poll(1.00, {"sm_active": 80.0}, 1.0)
    poll(1.05, {}, 0.0)  # too soon after the last GPM sample: none this poll
    poll(4.00, {"sm_active": 20.0}, 2.95)
    poll(4.05, {}, 0.0)
    sm = track.stats["sm_active"]
    assert sm.samples == 2 and sm.seconds == pytest.approx(3.95)
    assert sm.mean == pytest.approx((80 * 1.0 + 20 * 2.95) / 3.95)
    assert track.stats["util"].seconds == pytest.approx(0.2)  # the poll's own figures: by poll


def test_the_poll_the_jobs_processes_left_the_gpu_in_is_not_counted_idle() -> None:
    """A shared GPU's own share is the driver's last period, standing for the poll's
    interval. The job's processes exit, then the epilog's last poll finds none: when in
    that interval they stopped is unknown, so it is left out (it read as idle, and a 12 s
    job at 50% on a shared GPU read 45%). A poll later with the processes still gone is
    idle, and so is a poll where they are listed but not busy."""
    from slurm_gpu_eff.node.gpu import Reading
    from slurm_gpu_eff.node.sampler import GpuStats

    track = GpuStats(gpu=None, job_id="7")  # type: ignore[arg-type]
    track.jobs_of_pids.update({100: "7", 1: ""})  # 1: a process outside any job

    def poll(at: float, pids: list[int], own_sm: float | None) -> None:
        sm = None if own_sm is None else {pid: own_sm if pid == 100 else 30.0 for pid in pids}
        track.add(Reading(time=at, util=None, mem_util=None, mem_used_bytes=None, power_w=None,
                          energy_mj=None, pids=[(pid, 0) for pid in pids], process_sm=sm), 1.0)

    poll(1.0, [100, 1], None)  # sharing seen: per-process reads begin at the next poll
    poll(2.0, [100, 1], 50.0)
    poll(3.0, [100, 1], 50.0)
    poll(4.0, [1], 0.0)  # the job's process left during (3, 4]: left out
    own = track.stats["own_util"]
    assert (own.mean, own.seconds) == (50.0, 2.0)
    poll(5.0, [1], 0.0)  # still gone: the job had nothing on the GPU, idle
    poll(6.0, [100, 1], 0.0)  # back, listed but not busy: idle
    own = track.stats["own_util"]  # the polls since added (GpuStats.flush)
    assert (own.mean, own.seconds) == (pytest.approx(25.0), 4.0)


@pytest.mark.parametrize(("listed", "expected"), [
    ([[]], 0),
    ([[(200, 9)], [(200, 9), (201, 1)]], 0),  # another job's (the job before's, left behind)
    ([[(200, 9)], [(100, 5), (200, 9)], [(100, 5), (101, 5), (200, 9)]], 2),
    ([[(300, 0)]], 1),  # whose it is cannot be read (gone already): it may be ours
    ([[(1, 0), (200, 9)]], 1),  # outside any job: may serve ours (an MPS server)
])
def test_the_gpu_counts_as_opened_by_the_jobs_own_processes_only(
    monkeypatch: pytest.MonkeyPatch, listed: list[list[tuple[int, int]]], expected: int,
) -> None:
    """`processes_max` is what tells "was opened but stayed idle" from "was never opened":
    a process another job left on the GPU opens nothing of this job's; one whose job cannot
    be told (gone, or outside any job) may be serving it, and a report does not say "never"
    on doubt."""
    from slurm_gpu_eff.node import gpustats
    from slurm_gpu_eff.node.gpu import Reading
    from slurm_gpu_eff.node.sampler import GpuStats

    jobs = {100: "7", 101: "7", 200: "8", 201: "8", 1: ""}
    monkeypatch.setattr(gpustats, "job_of_pid", jobs.get)
    track = GpuStats(gpu=None, job_id="7")  # type: ignore[arg-type]
    twice = [pids for pids in listed for _ in range(2)]  # the second poll may skip the look
    for at, pids in enumerate(twice, start=1):
        track.add(Reading(time=float(at), util=0.0, mem_util=None, mem_used_bytes=None,
                          power_w=None, energy_mj=None, pids=list(pids), process_sm=None), 1.0)
    assert track.processes_max == expected


def test_a_poll_with_the_last_polls_processes_skips_the_sharing_look_to_the_same_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GpuStats looks at whose processes are on the GPU only when the list changed (or a
    poll brings per-process samples, or the GPU is shared): the same stream of polls gives
    the same figures as a look at every poll: another job's process that comes later, the
    job's own that leaves and comes back, a memory figure that moves, and the pid cache
    cleared (its jobs read again)."""
    from slurm_gpu_eff.node import gpustats
    from slurm_gpu_eff.node.gpu import Reading
    from slurm_gpu_eff.node.sampler import GpuStats

    jobs = {100: "7", 101: "7", 200: "8"}
    monkeypatch.setattr(gpustats, "job_of_pid", lambda pid: jobs.get(pid, ""))
    stream = ([[(100, 5)]] * 4 + [[(100, 6)]] * 3 + [[]] * 3 + [[(100, 6), (101, 1)]] * 4
              + [[(100, 6), (200, 9)]] * 3 + [[(200, 9)]] * 2 + [[(100, 6), (200, 9)]] * 3)

    looks = []
    full = GpuStats._add_sharing
    monkeypatch.setattr(GpuStats, "_add_sharing", lambda self, *args: (looks.append(1), full(self, *args))[1])

    def run(always: bool) -> tuple[Any, ...]:
        looks.clear()
        jobs[101] = "7"
        track = GpuStats(gpu=None, job_id="7")  # type: ignore[arg-type]
        for at, pids in enumerate(stream, start=1):
            if always:  # as before the shortcut: a look every poll
                track.settled_pids = None
            if at == 12:  # a long job's pid cache, full: cleared on the next new pid, and
                track.jobs_of_pids.update({-n: None for n in range(1001)})  # pid 101 is
                jobs[101] = "8"  # another job's now (reused): read again, it shares the GPU
                track.job_of(300)
            sm = {pid: 40.0 for pid, _ in pids} if track.shared_s else None  # as Gpu.read
            track.add(Reading(time=float(at), util=50.0, mem_util=None, mem_used_bytes=None,
                              power_w=None, energy_mj=None, pids=list(pids), process_sm=sm), 1.0)
        return ({k: s.to_dict() for k, s in track.stats.items()}, track.shared_s,
                sorted(track.shared_with), track.own_listed, track.processes_max, len(looks))

    *shortcut, shortcut_looks = run(always=False)
    *every, every_looks = run(always=True)
    assert shortcut == every
    assert every_looks == len(stream) and shortcut_looks < every_looks - 5
    assert shortcut[0]["own_util"]["samples"] > 0 and shortcut[0]["own_mem_used_bytes"]["samples"] > 0


def test_the_window_begins_at_binding_where_the_drivers_figures_begin(sim_node: Any) -> None:
    """The driver's samples and GPM's first sample count from the binding; on a busy node
    the first poll comes later. Before, the window began at the first poll while util and
    GPM covered the time since binding: a 12 s job's truth was off by that gap."""
    from slurm_gpu_eff.config import Config
    from slurm_gpu_eff.node.jobenv import JobContext
    from slurm_gpu_eff.node.sampler import Sampler

    from .conftest import BOOT

    sim_node.write_state(0, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80, "power_w": 400}}}]},
                         started_at=BOOT + 1000.5)
    session = sim_node.session()
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),  # BOOT + 1000
                      clock=session.clock, monotonic=sim_node.clock)
    for t in (1001.5, 1002.5, 1003.5):  # the first poll 1.5 s after binding
        sim_node.now = BOOT + t
        sampler.sample_once()
    assert (sampler.sampled_from, sampler.sampled_until) == (BOOT + 1000.0, BOOT + 1003.5)
    track = sampler.gpus[0]
    util, power = track.stats["util"], track.stats["power_w"]
    assert util.seconds == pytest.approx(3.5, abs=0.2)  # the driver's samples: from binding
    assert power.seconds == pytest.approx(3.5)  # the first poll's reading stands for 1.5 s
    assert util.mean == pytest.approx(80 * 3.0 / 3.5, abs=2.0)  # idle until BOOT + 1000.5
    # the energy counter from binding too: idle power, then 400 W from BOOT + 1000.5
    assert track.energy() == (pytest.approx(60 * 0.5 + 400 * 3.0, rel=0.02), "counter")  # idle 60 W


def test_a_gpus_readings_wait_a_few_polls_at_most_and_every_reader_sees_them_all() -> None:
    """GpuStats.add keeps the figures' part of a poll for later (FLUSH_POLLS at a time, in
    one warm loop): the polls held stay bounded, and the figures, the energy and the
    summary each take every poll added so far."""
    from slurm_gpu_eff.node.gpu import Reading
    from slurm_gpu_eff.node.gpustats import FLUSH_POLLS, GpuStats

    track = GpuStats(gpu=None)  # type: ignore[arg-type]
    for poll in range(1, 3 * FLUSH_POLLS + 4):
        track.add(Reading(time=float(poll), util=float(poll), mem_util=None, mem_used_bytes=None,
                          power_w=100.0, energy_mj=None), 1.0)
        assert len(track.pending) < FLUSH_POLLS
        if poll % 5 == 0:
            assert track.energy() == (100.0 * poll, "power")
            assert track.stats["util"].samples == poll and track.last("util") == float(poll)
