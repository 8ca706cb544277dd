"""Polls faster than the driver's sample period (node/samples.py, SampleSeries.covered): a
poll that finds no new sample lets the rate stand for its time, and the sample that comes
next covers only the rest of its window, so that each second is counted once. Before, the
sample covered its whole window again: utilisation seconds +50% at 0.5 s polls of a 1 s
driver."""

from __future__ import annotations

import random
from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.node.gpustats import GpuStats
from slurm_gpu_eff.node.samples import MAX_RATE_SPANS, SampleSeries, _overlap

from .conftest import BOOT, SIM_DEVICES
from .test_gpu import driver_fills_nothing

START = BOOT + 1000.0
# The first sample's window may reach this far before binding (the stretch before binding
# ends a second early: a driver's clock a little behind the sampler's loses no job time)
BEFORE = 1.0


def polled(sim_node: Any, minor: int, steps: list[float], mem_every: int | None = 1,
           ahead: float = 0.0) -> GpuStats:
    """GpuStats of `minor` after polls `steps` apart (the driver's and the monotonic
    clock's seconds alike), each reading standing for its step, as the sampler's; the
    memory samples read every `mem_every` polls from the first (None: left to the reads
    the GPU's own state calls for); the sampler's clock `ahead` of the driver's."""
    mono = [500.0]
    session = sim_node.session()
    session.steady = lambda: mono[0]
    if ahead:
        session.clock = lambda: sim_node.now + ahead
    (gpu,) = session.bind([minor])
    stats = GpuStats(gpu)
    for poll, step in enumerate(steps):
        sim_node.now += step
        mono[0] += step
        stats.add(gpu.read(mem_samples=mem_every is not None and poll % mem_every == 0), step)
    stats.flush()
    return stats


def devices(sim_node: Any, minor: int = 2, **spec: Any) -> None:
    """gpu1's devices, GPU `minor`'s changed by `spec`."""
    sim_node.write_devices({"gpu1": [{**s, **spec} if s["minor"] == minor else s for s in SIM_DEVICES]})


def wave(seconds: float = 700) -> dict[str, Any]:
    return {"phases": [{"seconds": seconds, "gpus": {"*": {
        "util": {"low": 0, "high": 100, "period_s": 20, "duty": 0.5}, "mem_util": 40}}}]}


@pytest.mark.parametrize(("minor", "step"), [
    (2, 0.5),  # 1 s windows, polled twice a window (before: +50%)
    (2, 0.25),
    (0, 0.1),  # 0.5 s windows (before: +80%)
    (2, 1.0),  # a 1 s driver at the default 1 s
])
def test_each_second_is_counted_once(sim_node: Any, minor: int, step: float) -> None:
    sim_node.write_state(minor, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, minor, [step] * round(600 / step))
    period = 1.0 if minor == 2 else 0.5
    # kept only till the kind's next samples: the polls since its last ones, no more
    gpu = stats.gpu
    kept = [high for spans in (gpu.gpu_samples.covered, gpu.mem_samples.covered) for _, high in spans]
    assert all(high / 1e6 > sim_node.now - 2 * period for high in kept)
    util = stats.stat("util")
    assert stats.seconds - period <= util.seconds <= stats.seconds + BEFORE
    assert stats.histogram.total_s == pytest.approx(util.seconds)
    assert stats.histogram.idle_s == pytest.approx(util.seconds / 2, abs=2 * period + 1)  # half idle
    assert util.mean == pytest.approx(50, abs=1)


def test_jittered_windows_at_irregular_polls(sim_node: Any) -> None:
    """A driver whose windows jitter (+-40%), polled 0.25-3.3 s apart: the time counted stays
    within a window of the time polled (before: a cap at 1.5 periods took 0.9% from it,
    hidden by the double count)."""
    devices(sim_node, minor=1, quirks=["samples_jitter"])
    sim_node.write_state(1, wave(1000), started_at=START - 5.0)
    sim_node.now = START
    rng = random.Random(7)
    stats = polled(sim_node, 1, [rng.choice((0.25, 0.5, 1.0, 1.5, 2.0, 3.3)) for _ in range(400)])
    assert stats.seconds - 1.0 <= stats.stat("util").seconds <= stats.seconds + BEFORE
    assert stats.seconds - 1.0 <= stats.stat("mem_util").seconds <= stats.seconds + BEFORE


def test_the_memory_samples_left_for_later_count_once(sim_node: Any) -> None:
    """At a poll with no new GPU sample the memory samples are read and, none new, their
    rate stands in too; the memory samples read later (the sampler's 5 s cadence) cover
    only the rest."""
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [0.25] * 2400, mem_every=None)
    memory = stats.stat("mem_util")
    assert stats.seconds - 1.0 <= memory.seconds <= stats.seconds + BEFORE
    assert memory.mean == 40.0


def test_a_driver_that_stops_filling_while_idle_keeps_its_idle_time(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review's probe of an earlier fix: 1 s busy, then 1-5 s idle in which the driver
    fills nothing, at 1 s windows and 1 s polls. The rate stands for the idle polls (idle);
    the busy sample after the pause covers its own window only (that fix read 4 s idle of
    160; this code before, 159)."""
    phases, idle, at = [], [], START - 5.0
    for pause in [1, 2, 3, 4, 5] * 6:
        phases += [{"seconds": 1, "gpus": {"*": {"util": 90}}},
                   {"seconds": pause, "gpus": {"*": {"util": 0}}}]
        idle.append((at + 1, at + 1 + pause))
        at += 1 + pause
    sim_node.write_state(2, {"phases": phases}, started_at=START - 5.0)
    driver_fills_nothing(monkeypatch, lambda t: any(a < t <= b for a, b in idle))
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 85)
    truly_idle = sum(min(b, sim_node.now) - max(a, START) for a, b in idle if b > START and a < sim_node.now)
    util = stats.stat("util")
    assert stats.histogram.idle_s == pytest.approx(truly_idle, abs=3)
    assert stats.seconds - 1.0 <= util.seconds <= stats.seconds + BEFORE
    assert util.mean == pytest.approx(90 * (stats.seconds - truly_idle) / stats.seconds, abs=4)


@pytest.mark.parametrize("kept", [2000, 120])  # the sample from before the pause kept; none
def test_the_job_s_first_sample_covers_no_time_before_binding(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch, kept: int,
) -> None:
    """The driver filled nothing in the ten minutes before binding (an idle GPU, on a driver
    that stops filling then): the job's first sample, alone in its poll, covers the time
    since binding (and a second before), not back to the driver's newest sample (before: 602 s
    of utilisation at 90% for 2 s sampled), nor back to the epoch where the buffer had
    none left (before: 1.7e9 s)."""
    devices(sim_node, sample_buffer=kept)
    sim_node.write_state(2, {"phases": [{"seconds": 10_000, "gpus": {"*": {"util": 90}}}]},
                         started_at=START - 5000.0)
    driver_fills_nothing(monkeypatch, lambda t: START - 600 < t <= START)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0, 1.0])
    assert 2.0 <= stats.stat("util").seconds <= 2.0 + BEFORE
    assert stats.histogram.total_s == stats.stat("util").seconds


def test_idle_windows_further_apart_count_whole(sim_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that fills a window every 1/6 s under load but one a second while the GPU
    idles: each idle sample, alone in its poll, covers its whole second (a review's probe
    of a cap at the period learnt under load: 33 s idle of 200, mean 77% for 45%)."""
    period = 1 / 6
    devices(sim_node, sample_period_s=period)
    phases, idle, at = [], [], START - 5.0
    for _ in range(25):
        phases += [{"seconds": 10, "gpus": {"*": {"util": 90}}}, {"seconds": 10, "gpus": {"*": {"util": 0}}}]
        idle.append((at + 10, at + 20))
        at += 20
    sim_node.write_state(2, {"phases": phases}, started_at=START - 5.0)

    def unfilled(t: float) -> bool:  # idle, and not on a whole second
        return any(a + period - 1e-6 <= t <= b + 1e-6 for a, b in idle) and abs(t - round(t)) > 1e-4

    driver_fills_nothing(monkeypatch, unfilled)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 400)
    assert stats.seconds - 1.0 <= stats.stat("util").seconds <= stats.seconds + BEFORE
    assert stats.histogram.idle_s == pytest.approx(200, abs=2)
    assert stats.stat("util").mean == pytest.approx(45, abs=1)


def test_a_dropped_sample_is_not_stretched_over(sim_node: Any) -> None:
    """A buffer of five samples read a second apart on a driver of six a second: the one
    dropped between two reads leaves a gap of two periods, which the next sample does not
    cover (its time is unmeasured, as for more dropped)."""
    devices(sim_node, sample_period_s=1 / 6, sample_buffer=5)
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 300)
    assert stats.stat("util").seconds == pytest.approx(250, abs=1)


@pytest.mark.parametrize("lag", [2.0, -2.0])
def test_a_driver_on_another_clock_loses_no_time(sim_node: Any, lag: float) -> None:
    """The sampler's clock seconds off the driver's (an NTP step one of them saw): the
    stretches would fall beside the windows they were counted for. Found by the samples'
    stamps (new, yet before the stretch's end) where the sampler is ahead; behind, they
    meet none: the double count stays either way, and no time is taken away."""
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [0.25] * 1200, ahead=lag)
    assert stats.stat("util").seconds >= stats.seconds - 1.0


def test_a_boot_clock_driver_loses_no_time(sim_node: Any) -> None:
    """Timestamps on another clock than the sampler's meet no stretch the rate stood for:
    the double count stays (as before this change), and no time is taken away."""
    devices(sim_node, quirks=["boot_clock"])
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    first = polled(sim_node, 2, [2.0])  # the stretch before binding is on the wall clock
    assert first.stat("util").seconds == pytest.approx(2.0, abs=1.0)
    stats = polled(sim_node, 2, [0.5] * 400)
    assert stats.stat("util").seconds >= stats.seconds - 1.0


def test_a_failed_rate_is_no_stretch(sim_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the rate cannot be read, no figure stands for the poll: the sample that comes
    later covers its window whole."""
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START

    def refused(handle: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", refused)
    stats = polled(sim_node, 2, [0.5] * 400)
    assert stats.seconds - 1.0 <= stats.stat("util").seconds <= stats.seconds + BEFORE


def test_overlap_and_stretches() -> None:
    assert _overlap([[0, 10], [20, 30]], 5, 25) == 10
    assert _overlap([[0, 10]], 10, 20) == 0
    assert _overlap([[0, 100]], 40, 50) == 10  # never more than the window
    assert _overlap([], 0, 5) == 0
    assert MAX_RATE_SPANS >= 8


def test_a_series_alone_without_nvml() -> None:
    """SampleSeries is arithmetic on the driver's timestamps (microseconds): what the poll's
    rate stood for leaves each later window, the first sample after binding on an empty
    buffer counts from binding, and a gap of two periods (less the stamps' rounding) is one
    window, not stretched over."""
    bound = 1_000_000.0  # seconds
    s = bound * 1e6
    series = SampleSeries(bound, 0)
    assert series.take([(int(s - 5e6), 90.0), (int(s + 1e6), 40.0)]) == [(40.0, 1.0)]  # from binding
    series.stood(s + 1.5e6, 0.5e6)  # a poll half a window on: the rate stood for (1, 1.5]
    assert series.take([(int(s + 2e6), 60.0)]) == [(60.0, 0.5)]
    assert series.mean == 60.0  # the poll's own figure: the whole window, as before
    later = [(s + 3e6, 10.0), (s + 4e6, 15.0), (s + 6e6 - 500, 20.0), (s + 7e6 - 500, 30.0)]
    taken = series.take([(int(stamp), value) for stamp, value in later])
    assert taken == [(10.0, 1.0), (15.0, 1.0), (20.0, 1.0), (30.0, 1.0)]  # the 2 s gap: one window
    assert series.period_s == 1.0 and series.covered == []


@pytest.mark.parametrize("pattern", [(0.5, 1.5), (0.25, 1.75)])
def test_a_short_blip_still_ends_an_idle_stretch(sim_node: Any, pattern: tuple[float, float]) -> None:
    """20 s idle, a 1 s blip at 12%, 20 s idle, polled unevenly: the poll that reads the
    blip's sample judges it over its whole window, as before, so the blip still breaks the
    stretch the idle policy cancels on (a second review's probe: judged over what the rate
    had not covered, it read 4% and the stretch ran 40 s)."""
    phases = []
    for _ in range(15):
        phases += [{"seconds": 20, "gpus": {"*": {"util": 0}}}, {"seconds": 1, "gpus": {"*": {"util": 12}}}]
    sim_node.write_state(2, {"phases": phases}, started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, list(pattern) * 150)
    assert stats.idle_longest is not None and stats.idle_longest[1] <= 21.0


def test_a_sampler_clock_a_little_ahead_loses_no_job_time(sim_node: Any) -> None:
    """The sampler's clock half a second ahead of the driver's: the stretch before binding
    ends a second early, so the job's first window is not in it (a second review's probe:
    59.5 s of 60)."""
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 60, ahead=0.5)
    assert stats.stat("util").seconds >= stats.seconds


def test_one_memory_sample_dropped_a_read_turns_on_reads_every_poll(sim_node: Any) -> None:
    """A buffer of four samples of a 1 s driver, read every 5 s: one dropped each read, a
    gap of two periods exactly. That is a drop for the weights and for the switch alike:
    read every poll from then on, no time lost (a second review's probe: 477 s of 600)."""
    devices(sim_node, sample_buffer=4)
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 600, mem_every=5)
    assert stats.gpu.mem_samples.every_poll
    assert stats.stat("mem_util").seconds >= stats.seconds - 6.0


def test_one_gpu_sample_dropped_a_poll_is_no_pause(sim_node: Any) -> None:
    """A GPU sample buffer one short of a poll's worth (five of six a second): each poll's
    first sample comes two periods after the last. That is a drop, not a pause of the GPU
    samples, so it does not excuse the memory samples' drops: their reads turn to every
    poll (a third review's probe: 50 s of memory figure for 300 sampled, never switched)."""
    devices(sim_node, sample_period_s=1 / 6, sample_buffer=5)
    sim_node.write_state(2, wave(), started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [1.0] * 300, mem_every=5)
    assert stats.gpu.mem_samples.every_poll and stats.stat("mem_util").seconds >= 0.8 * stats.seconds


def test_the_idle_line_reads_each_poll_as_before(sim_node: Any) -> None:
    """Utilisation alternating 4% and 6% each second on a jittered 1 s driver, polled every
    2 s: the poll's own figure weighs a gap of 1.5 periods or more as one period, as before,
    so the stretch under the 5% line is the code before's 8 s (a third review's probe: with
    such gaps whole, 12 s)."""
    devices(sim_node, quirks=["samples_jitter"])
    phases = []
    for _ in range(400):
        phases += [{"seconds": 1, "gpus": {"*": {"util": 4}}}, {"seconds": 1, "gpus": {"*": {"util": 6}}}]
    sim_node.write_state(2, {"phases": phases}, started_at=START - 5.0)
    sim_node.now = START
    stats = polled(sim_node, 2, [2.0] * 300)
    assert stats.idle_longest is not None and stats.idle_longest[1] <= 8.0
