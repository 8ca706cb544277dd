"""Workload profiles for simulated GPUs: what each of a job's GPUs does, phase by phase.

A profile is JSON: {"phases": [{"seconds": S, "gpus": {"*"|"0"|"1"...: {metric: value}}}]}.
A value is a number or a square wave {"low", "high", "period_s", "duty"}. Metrics a phase
does not name keep their idle value. An optional "framework" (one of FRAMEWORKS) makes the
workload process map libraries named as that framework's are, as a real job's would.
Averages over any window are computed exactly (not sampled), so tests can compare what the
sampler saw with the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import GpuEffError

# Names shared by profiles and reports.
METRICS = (
    "util", "mem_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp16_active", "fp32_active", "fp64_active", "mem_used_gib", "power_w", "temp_c",
    "sm_clock_mhz", "pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_mbps", "nvlink_tx_mbps",
    "shared_util",  # utilisation that another job's process adds on the same GPU (sharing)
)
# Events and states rather than levels: a phase sets them for its whole length.
THROTTLE_REASONS = ("power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")
EVENT_FIELDS = {
    "throttle": "list of clock-event reasons: " + ", ".join(THROTTLE_REASONS),
    "xid": "list of XID codes, raised as the phase starts",
    "processes": "number of compute processes on the GPU",
    "lost": "true: the GPU falls off the bus as the phase starts (NVML: GPU is lost)",
    "energy_reset": "true: the energy counter restarts from 0 as the phase starts",
    "nvml_error": "true: while the phase runs, every NVML query on the GPU (and its MIG "
                  "instances) but its identity fails with a passing error (NVML: Unknown Error)",
}
# What the workload process presents itself as (sim/workload.py maps the libraries).
FRAMEWORKS = ("pytorch", "tensorflow", "jax", "cuda", "none")
PERCENT_METRICS = {
    "util", "mem_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp16_active", "fp32_active", "fp64_active", "shared_util",
}


class ProfileError(GpuEffError):
    exit_code = 2


@dataclass(frozen=True)
class Signal:
    """A constant (period_s == 0) or a square wave, over time since its phase began."""

    low: float
    high: float = 0.0
    period_s: float = 0.0
    duty: float = 1.0

    def at(self, t: float) -> float:
        if self.period_s <= 0:
            return self.low
        return self.high if (t % self.period_s) < self.duty * self.period_s else self.low

    def integral(self, t0: float, t1: float) -> float:
        if self.period_s <= 0:
            return self.low * (t1 - t0)
        return self.low * (t1 - t0) + (self.high - self.low) * (self._high_time(t1) - self._high_time(t0))

    def _high_time(self, t: float) -> float:
        """Time spent high in [0, t]."""
        on = self.duty * self.period_s
        whole = math.floor(t / self.period_s)
        return whole * on + min(t - whole * self.period_s, on)


@dataclass(frozen=True)
class Phase:
    start_s: float
    seconds: float
    gpus: dict[str, dict[str, Signal]]
    events: dict[str, dict[str, Any]]

    def signal(self, position: int, metric: str) -> Signal | None:
        own = self.gpus.get(str(position), {})
        if metric in own:
            return own[metric]
        return self.gpus.get("*", {}).get(metric)

    def event(self, position: int, name: str) -> Any:
        own = self.events.get(str(position), {})
        if name in own:
            return own[name]
        return self.events.get("*", {}).get(name)


@dataclass(frozen=True)
class Profile:
    phases: tuple[Phase, ...]
    raw: dict[str, Any]
    framework: str = "none"  # what the workload process maps libraries as (FRAMEWORKS)

    @property
    def duration_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    def phase_at(self, t: float) -> Phase | None:
        for phase in self.phases:
            if phase.start_s <= t < phase.start_s + phase.seconds:
                return phase
        return None

    def event_at(self, position: int, name: str, t: float) -> Any:
        """The phase's setting of a state field (throttle, processes) at time t."""
        phase = self.phase_at(t)
        return None if phase is None else phase.event(position, name)

    def event_starts(self, position: int, name: str, t0: float, t1: float) -> list[tuple[float, Any]]:
        """(start, value) of each phase that sets `name` and begins in (t0, t1]."""
        return [
            (p.start_s, p.event(position, name)) for p in self.phases
            if t0 < p.start_s <= t1 and p.event(position, name)
        ]

    def value_at(self, position: int, metric: str, t: float, idle: float) -> float:
        """The metric's value t seconds after the profile started."""
        for phase in self.phases:
            if phase.start_s <= t < phase.start_s + phase.seconds:
                signal = phase.signal(position, metric)
                return idle if signal is None else signal.at(t - phase.start_s)
        return idle

    def integral(self, position: int, metric: str, t0: float, t1: float, idle: float) -> float:
        """Exact integral of the metric over [t0, t1] (seconds since the profile started)."""
        if t1 <= t0:
            return 0.0
        total = 0.0
        covered = 0.0
        for phase in self.phases:
            lo, hi = max(t0, phase.start_s), min(t1, phase.start_s + phase.seconds)
            if hi <= lo:
                continue
            covered += hi - lo
            signal = phase.signal(position, metric)
            if signal is None:
                total += idle * (hi - lo)
            else:
                total += signal.integral(lo - phase.start_s, hi - phase.start_s)
        return total + idle * ((t1 - t0) - covered)

    def resolve(self, position: int) -> list[dict[str, Any]]:
        """The phases as the job's GPU number `position` plays them, for the stand-in NVML
        library: its own levels ([low, high, period_s, duty]) and events, "*" applied."""
        phases = []
        for phase in self.phases:
            levels = {}
            for metric in METRICS:
                signal = phase.signal(position, metric)
                if signal is not None:
                    levels[metric] = [signal.low, signal.high, signal.period_s, signal.duty]
            events = {name: phase.event(position, name) for name in EVENT_FIELDS}
            phases.append({
                "start_s": phase.start_s, "seconds": phase.seconds, "levels": levels,
                **{name: value for name, value in events.items() if value is not None},
            })
        return phases

    def mean(self, position: int, metric: str, t0: float, t1: float, idle: float) -> float:
        if t1 <= t0:
            return self.value_at(position, metric, t0, idle)
        return self.integral(position, metric, t0, t1, idle) / (t1 - t0)


def parse_profile(data: Any) -> Profile:
    """Validate a decoded profile; raises ProfileError naming the faulty field."""
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list) or not data["phases"]:
        raise ProfileError("profile: needs a non-empty list 'phases'")
    framework = data.get("framework", "none")
    if framework not in FRAMEWORKS:
        raise ProfileError(f"profile: 'framework' must be one of {', '.join(FRAMEWORKS)}")
    phases = []
    start = 0.0
    for number, item in enumerate(data["phases"], 1):
        where = f"profile phase {number}"
        if not isinstance(item, dict):
            raise ProfileError(f"{where}: not an object")
        seconds = item.get("seconds")
        if not isinstance(seconds, (int, float)) or not _is_number(seconds) or seconds <= 0:
            raise ProfileError(f"{where}: 'seconds' must be a number > 0")
        gpus = item.get("gpus", {})
        if not isinstance(gpus, dict):
            raise ProfileError(f"{where}: 'gpus' must be an object")
        parsed, events = {}, {}
        for key, metrics in gpus.items():
            if key != "*" and not (key.isascii() and key.isdigit() and str(int(key)) == key):
                raise ProfileError(f"{where}: GPU key {key!r} must be '*' or a job GPU number")
            if not isinstance(metrics, dict):
                raise ProfileError(f"{where}: GPU {key!r}: metrics must be an object")
            here = f"{where}: GPU {key!r}"
            parsed[key] = {
                m: _signal(f"{here}: {m}", m, v) for m, v in metrics.items() if m not in EVENT_FIELDS
            }
            events[key] = {
                m: _event(f"{here}: {m}", m, v) for m, v in metrics.items() if m in EVENT_FIELDS
            }
        phases.append(Phase(start, float(seconds), parsed, events))
        start += float(seconds)
    return Profile(tuple(phases), data, framework)


def _event(where: str, name: str, value: Any) -> Any:
    ok = {
        "throttle": isinstance(value, list) and all(v in THROTTLE_REASONS for v in value),
        "xid": isinstance(value, list) and all(isinstance(v, int) and v > 0 for v in value),
        "processes": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        "lost": isinstance(value, bool),
        "energy_reset": isinstance(value, bool),
        "nvml_error": isinstance(value, bool),
    }[name]
    if not ok:
        raise ProfileError(f"{where}: must be a {EVENT_FIELDS[name]}")
    return value


def _signal(where: str, metric: str, value: Any) -> Signal:
    if metric not in METRICS:
        known = ", ".join(METRICS + tuple(EVENT_FIELDS))
        raise ProfileError(f"{where}: unknown metric (known: {known})")
    if _is_number(value):
        signal = Signal(float(value))
    elif isinstance(value, dict) and set(value) <= {"low", "high", "period_s", "duty"}:
        try:
            signal = Signal(
                float(value.get("low", 0)), float(value["high"]),
                float(value["period_s"]), float(value.get("duty", 0.5)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: square wave needs numbers high and period_s") from exc
        if signal.period_s <= 0 or not 0 <= signal.duty <= 1:
            raise ProfileError(f"{where}: square wave needs period_s > 0 and 0 <= duty <= 1")
    else:
        raise ProfileError(f"{where}: must be a number or {{low, high, period_s, duty}}")
    for level in (signal.low, signal.high):
        if level < 0 or (metric in PERCENT_METRICS and level > 100):
            raise ProfileError(f"{where}: {level} is out of range")
    return signal


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
