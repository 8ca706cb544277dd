"""Streaming statistics in constant memory (standard library only: sampler hot path)."""

from __future__ import annotations

from typing import Any


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
        if value is None:  # not measured is not zero
            return
        self.samples += 1
        self.seconds += seconds
        self.weighted_sum += value * seconds
        self.last = value
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
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
