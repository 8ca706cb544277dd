"""Polls faster than the driver's sample period (node/gpu.py, Reading.util_later): a poll
inside the driver's open window waits for the sample that covers it, and what happens
where no sample comes (a driver that stops filling its buffer while the GPU idles), where
the samples call fails, and to a lone sample after a pause. Found in review of the change
that brought the open window in: each test here failed on it."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.node.gpustats import GpuStats

from .conftest import BOOT, driver_fills_nothing


def cycles(n: int = 4) -> dict[str, Any]:
    """5 s at 80% then 10 s idle, n times: 20 s busy an minute."""
    phases = []
    for _ in range(n):
        phases += [{"seconds": 5, "gpus": {"*": {"util": 80, "mem_util": 40}}},
                   {"seconds": 10, "gpus": {"*": {"util": 0, "mem_util": 0}}}]
    return {"phases": phases}


def poll(sim_node: Any, gpu: Any, times: list[float]) -> GpuStats:
    """The sampler's polls between summaries at `times`, the last one final."""
    stats = GpuStats(gpu)
    last = sim_node.now
    for i, at in enumerate(times):
        sim_node.now = at
        stats.add(gpu.read(mem_samples=False, final=i == len(times) - 1), at - last)
        last = at
    stats.flush()
    return stats


@pytest.mark.parametrize(("minor", "step"), [(2, 1.0), (0, 0.1)])  # 1 s windows, 0.5 s windows
def test_a_driver_that_stops_filling_while_idle_keeps_its_idle_time(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch, minor: int, step: float,
) -> None:
    """The polls waiting in the window after the last busy sample get no sample: the rate
    that stands in once the window has closed stands for them too. Within a driver period
    a pause of the samples: the figures' time, the idle time, the mean (before the fix,
    at 1 s: 55 s of 59.5, 35 s idle, mean 29.1%)."""
    sim_node.write_state(minor, cycles(), started_at=BOOT + 1000.0)

    def idle(t: float) -> bool:
        into = round((t - BOOT - 1000.0) % 15, 6)
        return t > BOOT + 1000.0 and (into > 5 or into == 0)

    driver_fills_nothing(monkeypatch, idle)
    (gpu,) = sim_node.session().bind([minor])
    start = BOOT + 1000.0 + step / 2
    stats = poll(sim_node, gpu, [start + k * step for k in range(round(60 / step))])
    polled = stats.seconds
    histogram = stats.histogram
    period = 1.0 if minor == 2 else 0.5
    assert polled - period <= histogram.total_s <= polled + 4 * period  # a period a pause at most
    assert 40 - 2 * period <= histogram.idle_s <= 40 + 4 * period
    assert stats.stat("util").mean == pytest.approx(80 * 20 / 60, abs=1.5)


def test_a_samples_call_that_failed_is_no_wait_for_the_driver(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed samples call is no evidence that nothing is new: the rate stands in; and
    a poll where every call failed is no time sampled and ends the idle stretch, inside
    the window or not (before the fix it waited, and its time went into the stretch)."""
    sim_node.write_state(0, {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 0}}}]},
                         started_at=BOOT + 990.0)
    (gpu,) = sim_node.session().bind([0])  # 0.5 s windows
    stats = GpuStats(gpu)
    for _ in range(6):
        sim_node.now += 0.25
        stats.add(gpu.read(), 0.25)
    assert stats.idle_now() is not None
    sampled = stats.seconds

    def broken(*args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    sim_node.now += 0.1  # inside the window
    with monkeypatch.context() as patch:
        patch.setattr(pynvml, "nvmlDeviceGetSamples", broken)
        reading = gpu.read()
        assert (reading.util_later, reading.util_samples, reading.util) == (False, None, 0.0)
        for name in dir(pynvml):
            if name.startswith(("nvmlDevice", "nvmlGpm")):
                patch.setattr(pynvml, name, broken)
        sim_node.now += 0.1
        nothing = gpu.read()
    assert not nothing.util_later and nothing.empty
    stats.add(nothing, 0.1)
    assert stats.idle_now() is None and stats.seconds == sampled


def test_a_lone_sample_after_a_pause_counts_for_one_learnt_period(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Polled faster than its 0.5 s period, a driver's period shows in no batch: it is learnt
    from the samples read one at a time. A busy sample after a pause, whose time the rate
    stood for, counts for that period, not for the 1 s assumed before any is learnt."""
    profile = {"phases": [{"seconds": 3, "gpus": {"*": {"util": 80}}},
                          {"seconds": 4, "gpus": {"*": {"util": 0}}},
                          {"seconds": 0.5, "gpus": {"*": {"util": 80}}},
                          {"seconds": 100, "gpus": {"*": {"util": 0}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 1000.0)

    def paused(t: float) -> bool:
        return BOOT + 1003.0 < t <= BOOT + 1007.0 or t > BOOT + 1007.5

    driver_fills_nothing(monkeypatch, paused)
    (gpu,) = sim_node.session().bind([0])
    lone, learnt = [], []
    for k in range(1, 81):
        sim_node.now = BOOT + 1000.0 + k / 10
        reading = gpu.read(mem_samples=False)
        if k == 30:  # the busy samples read one at a time, no batch of any kind read yet
            learnt.append(gpu.driver_period_s)
        if sim_node.now > BOOT + 1007.0 and reading.util_samples:
            lone += reading.util_samples
    assert learnt == [pytest.approx(0.5)]
    assert lone == [(80.0, pytest.approx(0.5))]


def test_a_step_of_the_wall_clock_opens_or_closes_no_window(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window is judged on the monotonic clock: the wall clock stepped back 0.7 s
    (NTP) in the middle of polls faster than the driver neither makes the rate stand in
    (time counted twice) nor loses a poll's time (found in review: on the wall clock, 19.4 s
    of utilisation for 20 s polled)."""
    sim_node.write_state(0, {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 80}}}]},
                         started_at=BOOT + 990.0)
    steady = [500.0]
    step = [0.0]
    session = sim_node.session()
    session.steady = lambda: steady[0]
    session.clock = lambda: sim_node.now - step[0]
    (gpu,) = session.bind([0])  # 0.5 s windows
    rates: list[int] = []
    real = pynvml.nvmlDeviceGetUtilizationRates
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: rates.append(1) or real(h))
    stats = GpuStats(gpu)
    for k in range(1, 201):
        sim_node.now += 0.1
        steady[0] += 0.1
        if k == 100:
            step[0] = 0.7
        stats.add(gpu.read(mem_samples=False, final=k == 200), 0.1)
    stats.flush()
    assert rates in ([], [1])  # the final reading's, at most
    assert stats.stat("util").seconds == pytest.approx(20.0, abs=0.5)
