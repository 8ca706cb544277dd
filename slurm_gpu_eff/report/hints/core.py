"""The rules' common ground: the Rule shape, the hint constructor and the small helpers
every rule uses. Standard library only, with the report's shapes from `shapes`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..shapes import GpuLine, Hint, JobReport

SEVERITIES = ("critical", "warning", "info")  # most urgent first
AUDIENCES = ("user", "admin")
GIB = 1024**3
MIB = 1024**2
RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
GOOD_UTIL_PCT = 70.0  # the verdict says "Good" from here, "Fair" below (with no warning)
PER_GPU = ("gpus_concerned", "gpus")


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    why: str  # for docs/hints.md: why these thresholds
    params: dict[str, float]  # default thresholds, each site-tunable as <id>.<name>
    needs: tuple[str, ...]  # metrics every GPU shown to the check must have measured
    check: Callable[[JobReport, dict[str, float]], list[Hint]]
    audience: str = "user"
    evidence: tuple[str, ...] = ()  # top-level evidence keys (message placeholders)


# --- small helpers ---------------------------------------------------------------------------


def pct(value: float) -> float:
    return round(value, 1)


def gpu_h(value: float) -> float:
    return round(value, 3)


def gib(value: float) -> float:
    return round(value / GIB, 2)


def m(g: GpuLine, name: str) -> float:
    """A metric's mean, 0 when unmeasured: only for GPUs that `needs` vouched for."""
    return g.metric(name) or 0.0


def lost(g: GpuLine) -> bool:
    """Fell off the bus: its low figures are the hardware's doing, not the job's."""
    return g.summary is not None and g.summary.lost_at is not None


def mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)


def label(g: GpuLine) -> str:
    return f"{g.node} GPU {'?' if g.minor is None else g.minor}"


def labels(gpus: list[GpuLine]) -> str:
    names = [label(g) for g in gpus]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def where(g: GpuLine, **figures: Any) -> dict[str, Any]:
    return {"node": g.node, "minor": g.minor, **figures}


def gpus_word(n: int) -> str:
    return "GPU" if n == 1 else "GPUs"


def elapsed_h(report: JobReport) -> float:
    return report.job.elapsed_s / 3600.0


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def sbatch_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def cpus_per_gpu(report: JobReport) -> int:
    return max(1, report.job.ncpus // max(1, report.job.gpus))


def hint(rule: str, severity: str, message: str, evidence: dict[str, Any], fix: str,
          savings: float | None, audience: str = "user") -> Hint:
    return Hint(rule, severity, audience, message, evidence, fix,
                None if savings is None else gpu_h(max(0.0, savings)))
