"""Streaming statistics in constant memory (standard library only: sampler hot path)."""

from __future__ import annotations

import math
from typing import Any

_isfinite = math.isfinite  # a local name: no module lookup on the hot path
_BINS, _IDLE_BELOW = 10, 5.0  # the histogram's (module names: cheaper to read per poll)
_LAST = _BINS - 1


class Stat:
    """Time-weighted mean, min, max and last of a stream of readings.

    Each reading stands for the time since the one before it, so a sampler that
    is late once does not skew the mean. Memory is constant whatever the job's length.
    """

    __slots__ = ("samples", "seconds", "weighted_sum", "min", "max", "last")

    def __init__(self) -> None:
        self.samples = 0
        self.seconds = 0.0
        self.weighted_sum = 0.0
        self.min: float | None = None
        self.max: float | None = None
        self.last: float | None = None

    def add(self, value: float | None, seconds: float) -> None:
        # Runs several times a GPU a poll: each line here is paid ~100,000 times a job-hour.
        if value is None or not _isfinite(value):  # not measured is not zero; NaN is not a figure
            return
        samples = self.samples
        self.samples = samples + 1
        self.seconds += seconds
        self.weighted_sum += value * seconds
        self.last = value
        if not samples:
            self.min = self.max = value
        elif value < self.min:  # type: ignore[operator]
            self.min = value
        elif value > self.max:  # type: ignore[operator]
            self.max = value

    @property
    def mean(self) -> float | None:
        if self.seconds > 0:
            return self.weighted_sum / self.seconds
        return self.last

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "last": self.last,
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
        }


class Histogram:
    """Seconds spent in each tenth of a percent range (0-10%, ..., 90-100%), plus idle (< 5%)."""

    BINS = _BINS
    IDLE_BELOW = _IDLE_BELOW

    def __init__(self) -> None:
        self.seconds = [0.0] * self.BINS
        self.idle_s = 0.0

    def add(self, value: float, seconds: float) -> None:
        tenth = int(value // 10)  # 100% falls in the last bin, as do the drivers' odd >100
        self.seconds[_LAST if tenth > _LAST else 0 if tenth < 0 else tenth] += seconds
        if value < _IDLE_BELOW:
            self.idle_s += seconds

    @property
    def total_s(self) -> float:
        return sum(self.seconds)


class Timeline:
    """A per-GPU timeline in at most `max_points` buckets, whatever the job's length:
    when full, neighbouring buckets merge and the bucket doubles in width."""

    FIELDS = ("util", "sm_active", "power_w", "mem_used_gib")

    def __init__(self, max_points: int = 720, bucket_s: float = 10.0) -> None:
        self.max_points = max_points
        self.bucket_s = bucket_s
        self.start: float | None = None
        # per bucket: [weight, weighted sum] for each mean field, then the memory peak
        self.points: list[list[float]] = []

    def add(self, t: float, seconds: float, util: float | None, sm_active: float | None,
            power_w: float | None, mem_used_gib: float | None) -> None:
        if self.start is None:
            self.start = t
        t = max(t, self.start)  # a wall clock stepped back lands in the first bucket
        index = int((t - self.start) // self.bucket_s)
        while index >= self.max_points:
            self._halve()
            index = int((t - self.start) // self.bucket_s)
        while len(self.points) <= index:
            self.points.append([0.0] * 7)
        point = self.points[index]
        weight = seconds if seconds > 1e-6 else 1e-6
        if util is not None:
            point[0] += weight
            point[1] += util * weight
        if sm_active is not None:
            point[2] += weight
            point[3] += sm_active * weight
        if power_w is not None:
            point[4] += weight
            point[5] += power_w * weight
        if mem_used_gib is not None and mem_used_gib > point[6]:
            point[6] = mem_used_gib

    def _halve(self) -> None:
        merged = []
        for i in range(0, len(self.points), 2):
            pair = self.points[i:i + 2]
            merged.append([sum(p[k] for p in pair) for k in range(6)] + [max(p[6] for p in pair)])
        self.points = merged
        self.bucket_s *= 2

    def to_dict(self) -> dict[str, Any]:
        def mean(point: list[float], slot: int) -> float | None:
            weight = point[2 * slot]
            return round(point[2 * slot + 1] / weight, 1) if weight else None

        return {
            "start": self.start, "bucket_s": self.bucket_s, "fields": list(self.FIELDS),
            "points": [
                [mean(p, 0), mean(p, 1), mean(p, 2), round(p[6], 2) if any(p) else None]
                for p in self.points
            ],
        }
