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
    """As the report's table names it: a MIG slice by its GPU and GPU instance (0/3), or
    two slices of one GPU would read alike."""
    gi = g.summary.mig_gi_id if g.summary is not None else None
    return f"{g.node} GPU {'?' if g.minor is None else g.minor}{'' if gi is None else f'/{gi}'}"


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


@dataclass(frozen=True)
class Savings:
    """GPU-hours a fix would give back: "measured" (held idle, measured: "would have
    saved") or "estimated" (a bound or a guess: "up to"), and how it was worked out."""

    gpu_hours: float
    kind: str
    how: str


def measured(gpu_hours: float, how: str) -> Savings:
    return Savings(gpu_hours, "measured", how)


def estimated(gpu_hours: float, how: str) -> Savings:
    return Savings(gpu_hours, "estimated", how)


def hint(rule: str, severity: str, message: str, evidence: dict[str, Any], fix: str,
         savings: Savings | None, audience: str = "user") -> Hint:
    if savings is None:
        return Hint(rule, severity, audience, message, evidence, fix, None)
    return Hint(rule, severity, audience, message, evidence, fix, gpu_h(max(0.0, savings.gpu_hours)),
                savings_kind=savings.kind, savings_how=savings.how)


# --- what the job is: its framework, its nodes, its SM activity --------------------------------

FRAMEWORKS = ("pytorch", "tensorflow", "jax")
PREALLOCATING = ("tensorflow", "jax")  # they take (nearly) all GPU memory by design
NSYS = ("profile one run with Nsight Systems ('nsys profile -o profile --trace=cuda,nvtx,osrt "
        "<your command>') to see what the GPU waits on")


def framework(report: JobReport) -> str | None:
    """The job's one deep-learning framework, or None: unknown, plain CUDA, or several."""
    found = [name for name in report.frameworks or [] if name in FRAMEWORKS]
    return found[0] if len(found) == 1 else None


def fitted(report: JobReport, fixes: dict[str, str], neutral: str) -> str:
    """A framework's fix only for that framework; else the neutral one (a framework's fix
    sent to another code teaches users to ignore hints)."""
    name = framework(report)
    return fixes[name] if name is not None and name in fixes else neutral


def sm(g: GpuLine) -> float | None:
    """SM activity (GPM, percent); None where the GPU does not measure it."""
    return g.metric("sm_active")


def by_utilisation_alone(gpus: list[GpuLine]) -> str:
    """What a message adds when it rests on utilisation alone (no SM activity measured)."""
    if gpus and all(sm(g) is None for g in gpus):
        return (" This rests on utilisation alone: SM activity is not measured on "
                f"{'this GPU' if len(gpus) == 1 else 'these GPUs'}.")
    return ""


def node_share(report: JobReport) -> dict[str, float] | None:
    """Per GPU of the job's nodes, from Slurm's node config: cores and MiB of memory (the
    smallest over its nodes); None when Slurm's node sizes are not known."""
    shares = [s for s in (report.node_shares.get(n) for n in {g.node for g in report.gpus}
                          or report.node_shares) if s and s.get("gpus")]
    if not shares:
        return None
    return {"cpus": min(s.get("cpus", 0) / s["gpus"] for s in shares),
            "mem_mb": min(s.get("mem_mb", 0) / s["gpus"] for s in shares),
            "gpus": float(min(s["gpus"] for s in shares))}


def cores_cap(report: JobReport) -> int | None:
    """The most cores per GPU a hint may ask for: the node's share; None when unknown."""
    share = node_share(report)
    return int(share["cpus"]) if share else None


CAP_UNKNOWN = " (no more than the node's cores per GPU)"  # said where Slurm's node sizes are not known


def interactive(report: JobReport) -> bool:
    """An interactive session (no batch step), known as such; None (unknown) is not."""
    return report.job.interactive is True


def mem_peak(g: GpuLine) -> float:
    return g.mem_used_max_bytes or 0.0


def used(report: JobReport, p: dict[str, float]) -> list[GpuLine]:
    """The GPUs that did work: measured at or over idle_pct, and still on the bus."""
    return [g for g in report.gpus
            if g.util_mean is not None and g.util_mean >= p["idle_pct"] and not lost(g)]


USE_THE_GPU = {
    "pytorch": "check that torch.cuda.is_available() is True inside the job and that the model and "
               "tensors are moved to the GPU (.to(\"cuda\"))",
    "tensorflow": "check that tf.config.list_physical_devices(\"GPU\") lists the GPU inside the job",
    "jax": "check that jax.devices() lists the GPU inside the job (a CPU-only jaxlib falls back silently)",
}
USE_THE_GPU_NEUTRAL = ("check that the program was built with GPU support and told to use it (its GPU "
                       "option or input setting), and run nvidia-smi inside the job")


def gpu_use(gpus: list[GpuLine]) -> tuple[float, str] | None:
    """How much the GPUs were used: mean SM activity where every one measures it (the
    better signal), else mean utilisation; with which it was. None: neither measured."""
    gpus = [g for g in gpus if not lost(g)]
    if gpus and all(sm(g) is not None for g in gpus):
        return mean(sm(g) or 0.0 for g in gpus), "SM activity"
    utils = [g.util_mean for g in gpus if g.util_mean is not None]
    return (mean(utils), "utilisation") if utils else None
