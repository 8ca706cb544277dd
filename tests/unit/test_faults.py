"""Issue 20's soak faults, each through the real sampler (node/sampler.py, gpustats.py,
gpu.py) over the real pynvml and the stand-in libnvidia-ml.so.1 (the `sim_node` fixture:
its clock is the test's): NVML errors for minutes on a GPU (a profile's `nvml_error`
phase), a clock step seen by one sampler ([sim] clock_offset_file)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config, SteppedClock
from slurm_gpu_eff.node import gpustats
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import Sampler

from .conftest import BOOT

# Idle a minute, three minutes of NVML errors (the GPU idle underneath), then idle again.
FAILING = {"phases": [
    {"seconds": 60, "gpus": {"*": {"util": 0, "power_w": 100}}},
    {"seconds": 180, "gpus": {"*": {"util": 0, "power_w": 100, "nvml_error": True}}},
    {"seconds": 100_000, "gpus": {"*": {"util": 0, "power_w": 100}}},
]}


def test_nvml_errors_for_minutes_cost_readings_not_the_gpu_and_add_no_idle_time(sim_node: Any) -> None:
    """NVML failing for 3 minutes on a GPU idle all along (the profile's `nvml_error`
    phase): the polls read nothing and count as no time sampled; each kind of error is
    noted once, with how often it came; nothing is taken as unsupported or lost, and the
    figures come back with the GPU. The failed reads end the idle stretch and never
    lengthen it: by the wall the GPU looked idle for 5 minutes, measured it was 59 s and
    61 s, so a 2-minute alert line is never passed."""
    sim_node.write_state(0, FAILING, started_at=BOOT + 1000.0)
    session = sim_node.session()
    mono = [500.0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(idle_alert_min=2), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0])
    track = sampler.gpus[0]

    def poll(times: int) -> None:
        for _ in range(times):
            sim_node.now += 1.0
            mono[0] += 1.0
            sampler.sample_once()
            assert sampler.idle_level() == 0

    poll(59)  # BOOT + 1001 .. 1059
    assert track.idle_now() == (BOOT + 1000.0, 59.0)
    plan, unsupported = list(track.gpu.plan), set(track.gpu.unsupported)
    poll(1)  # the errors begin
    assert track.idle_now() is None  # no reading: no evidence of idleness
    poll(179)  # to BOOT + 1239
    assert track.idle_now() is None and (track.samples, track.seconds) == (59, 59.0)
    poll(61)  # BOOT + 1240 .. 1300: the GPU answers again
    assert track.idle_now() == (BOOT + 1239.0, 61.0)  # from the first poll after the errors
    assert (track.gpu.plan, track.gpu.unsupported, track.lost_at) == (plan, unsupported, None)
    summary = sampler.snapshot("running").gpus[0]
    assert (summary.samples, summary.sampled_s) == (120, 120.0)
    assert summary.idle_longest == {"from_s": 239.0, "seconds": 61.0}
    assert summary.idle_now == {"since": BOOT + 1239.0, "seconds": 61.0}
    power = summary.metrics["power_w"]
    assert (power["mean"], power["last"], power["seconds"]) == (100.0, 100.0, 120.0)
    assert summary.metrics["util"]["mean"] == 0.0
    assert 5 <= len(summary.errors) <= 12, summary.errors
    for line in summary.errors:  # one line a call, the count of polls it failed in
        assert re.fullmatch(r"(nvmlDevice\w+|GPM): Unknown Error \((180|360) times\)", line), line
    assert "nvmlDeviceGetPowerUsage: Unknown Error (180 times)" in summary.errors


def test_a_clock_step_seen_by_one_sampler_moves_its_dates_not_its_figures(
    sim_node: Any, tmp_path: Path,
) -> None:
    """[sim] clock_offset_file steps the sampler's wall clock an hour ahead, then two hours
    back, then to the truth, a minute apart; the driver (the stand-in's clock) and the
    monotonic clock go on. Every reading stands for its poll's measured second: 240 s
    sampled in 4 minutes, GPM, power and energy whole, the idle stretch 240 s (by the
    wall it looked over an hour: past a 5-minute alert line), the timeline 24 buckets.
    The window's end follows the wall clock forward and never goes back (it would end
    before it began). Before: the poll after the step stood for an hour (sampled_s 3720
    after it, power and GPM weighted by it), the window ended two hours before it began,
    GPM read nothing until the wall clock caught up, and the timeline grew an hour of
    empty buckets."""
    forever = 100_000
    sim_node.write_state(0, {"phases": [{"seconds": forever, "gpus": {"*": {"util": 0, "power_w": 100}}}]},
                         started_at=BOOT + 1000.0)
    busy = {"util": 80, "sm_active": 70, "power_w": 300}
    sim_node.write_state(2, {"phases": [{"seconds": forever, "gpus": {"*": busy}}]}, started_at=BOOT + 1000.0)
    offset = tmp_path / "offset"
    mono = [500.0]
    session = sim_node.session()  # its monotonic clock: the test's (sim_node.now), never stepped
    session.clock = SteppedClock(sim_node.clock, str(offset), lambda: mono[0])
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(idle_alert_min=5), session.bind([0, 2]),
                      clock=session.clock, monotonic=lambda: mono[0])
    untils = []
    for step in (None, "3600", "-3600", "0"):
        if step is not None:
            offset.write_text(step)
        for _ in range(60):
            sim_node.now += 1.0
            mono[0] += 1.0
            sampler.sample_once()
            assert sampler.idle_level() == 0
            untils.append(sampler.sampled_until)
    assert untils == sorted(untils) and untils[59] == BOOT + 1060.0 and untils[60] == BOOT + 4661.0
    summary = sampler.snapshot("running")
    assert (summary.sampled_from, summary.sampled_until) == (BOOT + 1000.0, BOOT + 4720.0)
    idle, busy_gpu = summary.gpus
    for gpu in (idle, busy_gpu):
        assert (gpu.samples, gpu.sampled_s) == (240, 240.0)
        assert gpu.metrics["power_w"]["seconds"] == 240.0
        assert len(gpu.timeline["points"]) == 24 and gpu.timeline["bucket_s"] == 10.0
        assert gpu.errors == []
    assert idle.idle_now == {"since": BOOT + 1000.0, "seconds": 240.0}
    assert idle.idle_longest == {"from_s": 0.0, "seconds": 240.0}
    sm = busy_gpu.metrics["sm_active"]
    assert (sm["mean"], sm["seconds"]) == (70.0, 240.0)
    util = busy_gpu.metrics["util"]
    assert (util["mean"], util["seconds"]) == (80.0, 240.0)  # the driver's samples: its own clock
    assert (busy_gpu.energy_j, busy_gpu.energy_source) == (300.0 * 240, "counter")


@pytest.mark.parametrize("offset", ["-3600", "3600"])
def test_a_sampler_whose_clock_is_not_the_driver_s_at_binding_takes_the_job_s_samples_only(
    sim_node: Any, tmp_path: Path, offset: str,
) -> None:
    """The offset file written before the job: the sampler binds an hour off the driver's
    clock. Its samples begin after the driver's newest at binding, by the driver's own
    timestamps. Before, an hour behind, the first poll took the driver's whole buffer of
    the time before the job (a GPU at 80% read 6% over 129 s); an hour ahead, it took no
    sample for that hour (the utilisation rate stood in)."""
    sim_node.write_state(2, {"phases": [{"seconds": 100_000, "gpus": {"*": {"util": 80}}}]},
                         started_at=sim_node.now)
    (tmp_path / "offset").write_text(offset)
    mono = [500.0]
    session = sim_node.session()
    session.clock = SteppedClock(sim_node.clock, str(tmp_path / "offset"), lambda: mono[0])
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([2]),
                      clock=session.clock, monotonic=lambda: mono[0])
    for _ in range(10):
        sim_node.now += 1.0
        mono[0] += 1.0
        sampler.sample_once()
    gpu = sampler.snapshot("running").gpus[0]
    util = gpu.metrics["util"]
    assert (gpu.util_source, util["mean"], util["seconds"], gpu.sampled_s) == ("samples", 80.0, 10.0, 10.0)


def test_a_machine_clock_stepped_back_costs_no_samples_and_no_share_of_a_shared_gpu(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NTP steps the machine's clock (the driver's timestamps with it) 10 minutes back on
    a GPU this job shares with another: the driver's new samples all read older than the
    last one seen. Its newest is taken as the new start: the next poll has samples again,
    and the job's own share stays its 60%. Before, nothing was newer for 10 minutes: the
    utilisation came from the rate, and the job's own share read 0 (30% over 2 minutes)."""
    monkeypatch.setattr(gpustats, "job_of_pid", lambda pid: "9" if pid == os.getpid() else "77")
    shared = {"util": 60, "shared_util": 20, "power_w": 300}  # 80% in all, 60% the job's
    sim_node.write_state(2, {"phases": [{"seconds": 100_000, "gpus": {"*": shared}}]},
                         started_at=BOOT - 10_000.0, pid=os.getpid())
    mono = [500.0]
    session = sim_node.session()
    session.steady = lambda: mono[0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([2]),
                      clock=session.clock, monotonic=lambda: mono[0])
    for step in (0.0, -600.0):
        sim_node.now += step
        for _ in range(60):
            sim_node.now += 1.0
            mono[0] += 1.0
            sampler.sample_once()
    gpu = sampler.snapshot("running").gpus[0]
    assert gpu.sampled_s == 120.0 and gpu.metrics["util"]["mean"] == 80.0
    assert gpu.metrics["util"]["seconds"] == 120.0  # 119 s of samples, and the poll's rate
    own = gpu.metrics["own_util"]
    assert (own["mean"], own["seconds"]) == (60.0, 119.0)  # the first poll: sharing seen
