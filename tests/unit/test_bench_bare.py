"""bench/bare.py, the baseline of the sampler's CPU (make bench, make gpu-check): poll for
poll, the same NVML calls as the sampler's own polls between summaries, over the stand-in."""

from __future__ import annotations

import collections
from typing import Any

import pynvml
import pytest

from bench.bare import BareGpu, Cadence
from slurm_gpu_eff.config import Config
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import Sampler

from .conftest import BOOT

# What a poll of one GPU calls, by name (the GPU samples and the memory ones apart)
POLL_CALLS = (
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
)


def counting(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    made: collections.Counter[str] = collections.Counter()
    for name in POLL_CALLS:
        real = getattr(pynvml, name)
        monkeypatch.setattr(pynvml, name,
                            lambda *a, _real=real, _name=name: made.update([_name]) or _real(*a))
    samples = pynvml.nvmlDeviceGetSamples

    def sampled(handle: Any, kind: int, since: int) -> Any:
        made.update([f"nvmlDeviceGetSamples({kind})"])
        return samples(handle, kind, since)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", sampled)
    return made


# Steps of the driver's clock between polls: slower than its 0.5 s period (new samples each
# poll), faster (polls that find none new), and a pause in its samples
STEPS = [1.0] * 12 + [0.125] * 20 + [1.0] * 8 + [0.25] * 10  # exact in binary: no GPM pair at 99.99 ms


def test_the_bare_poll_makes_the_sampler_s_calls_poll_for_poll(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 80, "mem_util": 40, "power_w": 300}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    mono = [500.0]
    paused = [False]
    real_samples = pynvml.nvmlDeviceGetSamples

    def driver(handle: Any, kind: int, since: int) -> Any:  # fills nothing while paused
        if paused[0] and kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return real_samples(handle, kind, since)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", driver)
    made = counting(monkeypatch)

    def run(poll: Any) -> list[dict[str, int]]:
        sim_node.now, mono[0] = BOOT + 1000.0, 500.0
        calls = []
        for i, step in enumerate(STEPS):
            sim_node.now += step
            mono[0] += step
            paused[0] = 32 <= i < 40
            made.clear()
            poll()
            calls.append(dict(made))
        return calls

    session = sim_node.session()
    session.steady = lambda: mono[0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0])
    sampler.gpus[0].shared_s = 0.0  # a GPU of the job's alone: no per-process samples
    sampled = run(lambda: sampler.sample_once(False))
    session.close()

    sim_node.now, mono[0] = BOOT + 1000.0, 500.0  # bound as the sampler was
    session = sim_node.session()
    (gpu,) = session.bind([0])
    cadence = Cadence(monotonic=lambda: mono[0])
    bare = BareGpu(pynvml, gpu.handle)
    made.clear()
    bared = run(lambda: bare.poll(*cadence.poll()))
    session.close()
    for i, (want, got) in enumerate(zip(sampled, bared, strict=True)):
        assert got == want, f"poll {i}"
    kinds = collections.Counter(name for poll in sampled for name in poll)
    assert kinds["nvmlDeviceGetUtilizationRates"] > 0 and kinds["nvmlDeviceGetSamples(2)"] < len(STEPS)
