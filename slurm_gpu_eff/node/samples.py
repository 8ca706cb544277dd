"""A driver's utilisation samples, as NVML's buffer gives them (nvmlDeviceGetSamples): which
are the job's, and how much time each stands for.

No NVML here: node/gpu.py asks the driver and hands each poll's samples over, sorted by the
driver's timestamps. What is decided here is arithmetic on those timestamps (docs/metrics.md,
"Polls faster than the driver's period"): a sample stands for the window since the one before
it, less any time the poll's rate stood in for already; a gap of two periods or more is a drop
or a pause, not stretched over.
"""

from __future__ import annotations

CLOCK_BACK_US = 1_000_000  # the clock this far before a driver's sample: it was stepped back
# Stretches the rate stood for (SampleSeries.covered): more than one only where the rate call
# fails between polls; past this many, the oldest go (counted twice then, never left out)
MAX_RATE_SPANS = 32
# A gap this short of two periods is two: the driver's stamps are whole microseconds (a
# 1/6 s period's gaps alternate 166666 and 166667), and one dropped sample is a drop
DROP_SLACK_US = 1000
BEFORE_BINDING_S = 86400  # the stretch before binding reaches a day back (not to boot-clock stamps)


class SampleSeries:
    """One kind of sample (GPU or memory utilisation) of one GPU, from binding on.

    `drops_against`: for the memory samples, read at the sampler's cadence, the GPU
    samples' series, read every poll: a gap in both is a pause of the driver, a gap in
    this one alone means its buffer dropped samples (`every_poll` turns on)."""

    # Slots: read each poll
    __slots__ = ("bound_at", "covered", "drops_against", "every_poll", "last_us", "mean", "period_s",
                 "resumed_us")

    def __init__(self, bound_at: float, newest_us: int | None,
                 drops_against: SampleSeries | None = None) -> None:
        self.bound_at = bound_at
        # The job's samples are the driver's after its newest at binding (`newest_us`), told
        # apart by the driver's own clock, whatever ours says (a boot-clock driver, a step
        # between). None where binding could not tell: the first samples decide (baseline).
        self.last_us = newest_us
        # Stretches of the driver's clock ([from, to], microseconds) that the samples read
        # next leave out of their windows: the time before binding (not the job's: a driver
        # that fills nothing while the GPU idles may keep a sample from long before, which a
        # lone first sample would cover back to), and each poll the rate stood in for since
        # the last samples (stood(): counted already). Placed by the sampler's clock; where
        # the samples show the driver's is another (boot time, an offset), none is used, as
        # before they were kept. (It ends a second before binding: a driver's clock a
        # little behind the sampler's would put the job's first window inside it.)
        before = [(bound_at - BEFORE_BINDING_S) * 1e6, bound_at * 1e6 - CLOCK_BACK_US]
        self.covered: list[list[float]] = [before]
        self.mean = 0.0  # the last samples taken: their mean, the poll's own figure
        self.period_s: float | None = None  # the driver's period, once two samples told it
        self.resumed_us = 0  # the first sample after the last pause (GPU samples; driver's clock)
        self.drops_against = drops_against
        # Read at every poll, not at the sampler's cadence: once a read found some dropped
        # (the buffer held less than the cadence's worth)
        self.every_poll = False

    def take(self, found: list[tuple[int, float]]) -> list[tuple[float, float]]:
        """The samples a read found, (timestamp in microseconds, value) sorted by timestamp:
        each of the job's new ones as (value, seconds it stands for)."""
        last = self.last_us
        if not last:  # binding could not tell (None), or the driver had none then (0)
            last = self.baseline(found[-1][0] if found else 0)
        found = [(stamp, value) for stamp, value in found if stamp > last]
        if not found:
            self.last_us = last
            return []
        period = _period([b - a for (a, _), (b, _) in zip(found, found[1:], strict=False)],
                         found[0][0] - last)
        if len(found) > 1:
            self.period_s = period / 1e6
        if self.drops_against is not None:
            self._dropped(found, last, period)
        spans = self.covered
        if spans and found[-1][0] < spans[-1][1] - CLOCK_BACK_US:
            # The newest sample, made since the last stretch's end, is stamped before it:
            # the driver's clock is behind the sampler's, and the stretches would fall on
            # other windows than they stood for (the one before binding, on the first).
            # Not used: counted twice, as before, rather than time left out.
            spans.clear()
        watch_pauses = self.drops_against is None
        out = []
        whole = weighted = 0.0  # for the poll's own figure: the mean as before the stretches
        for stamp, value in found:
            # A sample stands for the time since the one before: its window, give or take
            # the driver's jitter (under twice the period: at 1.5, windows jittered +-40%
            # lost 1% of the time). Twice or more (to a millisecond: stamps are whole
            # microseconds), the buffer dropped samples between two polls, or the driver
            # paused: that time is not stretched over.
            gap = stamp - last
            window: float = gap
            if gap > 2 * period - DROP_SLACK_US:
                window = period
                if watch_pauses and gap > 2.5 * period:
                    # the GPU samples paused till here (more than one window: one dropped
                    # is no pause, and must not hide the memory samples' drops, _dropped)
                    self.resumed_us = stamp
            # The poll's figure (the idle line the idle policy cancels on) weighs each
            # window exactly as before: a gap over 1.5 periods for one period
            seen = gap if gap <= 1.5 * period else period
            whole += seen
            weighted += value * seen
            if spans:  # less the time counted already (polls faster than the driver)
                window -= _overlap(spans, stamp - window, stamp)
            out.append((value, window / 1e6))
            last = stamp
        spans.clear()
        self.mean = weighted / whole if whole else out[-1][0]
        self.last_us = last
        return out

    def stood(self, now_us: float, since_us: float) -> None:
        """The poll's rate stood for its time, ending now: the samples that cover that time
        when they come leave it out. Measured on the monotonic clock and placed at the poll
        (a step of the wall clock moves no stretch's length)."""
        spans = self.covered
        start = now_us - max(since_us, 0.0)
        if spans and abs(spans[-1][1] - start) < 1000:  # straight after the last: one stretch
            spans[-1][1] = now_us
            return
        if len(spans) >= MAX_RATE_SPANS:
            del spans[0]  # that time may be counted twice, never left out
        spans.append([start, now_us])

    def baseline(self, newest_us: int) -> int:
        """Where the job's samples begin, from the driver's newest timestamp now. Its
        timestamps are epoch microseconds: keep what came after binding. Should a driver
        count from elsewhere, start from its newest sample rather than take history that
        is not the job's."""
        if abs(newest_us / 1e6 - self.bound_at) < 86400:
            return int(self.bound_at * 1e6)
        return newest_us

    def _dropped(self, found: list[tuple[int, float]], last: int, period: float) -> None:
        """Samples the driver dropped between two reads at the sampler's cadence (its buffer
        held less than that): from now on, read every poll. Judged on a batch of four or
        more, whose median gap is the driver's period, past the jitter of its windows (up
        to +-40%). No drop where the GPU samples, read every poll, paused over the same
        stretch: a driver that fills nothing while the GPU idles, a sampler that was
        stopped, or the first samples after binding on an empty buffer (last 0)."""
        first = found[0][0]
        if (len(found) >= 4 and last and first - last > 2 * period - DROP_SLACK_US
                and not last < self.drops_against.resumed_us <= first):  # type: ignore[union-attr]
            self.every_poll = True


def _overlap(spans: list[list[float]], start: float, end: float) -> float:
    """How much of [start, end] the spans cover (they do not overlap each other)."""
    covered = 0.0
    for low, high in spans:
        covered += max(0.0, min(end, high) - max(start, low))
    return min(covered, max(end - start, 0.0))


def _period(gaps: list[int], first_gap: int) -> float:
    """The driver's sample period: the median gap between its timestamps. Not the
    smallest: one short, jittered gap would cap every sample's weight. A lone sample's is
    its own gap (a driver may fill windows further apart while the GPU idles: a period
    learnt under load would cut them)."""
    if not gaps:
        return float(first_gap)
    gaps = sorted(gaps)
    return float(gaps[len(gaps) // 2])
