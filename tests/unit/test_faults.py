"""Issue 20's soak faults, each through the real sampler (node/sampler.py, gpustats.py,
gpu.py) over the real pynvml and the stand-in libnvidia-ml.so.1 (the `sim_node` fixture:
its clock is the test's)."""

from __future__ import annotations

import re
from typing import Any

from slurm_gpu_eff.config import Config
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
