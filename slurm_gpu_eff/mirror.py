"""An optional copy of a job's GPU figures in Slurm's own accounting: the AdminComment.

For sites whose tools already read AdminComment (off by default: `[slurm] admin_comment`).
One line of `key=value` words, lowercase letters, digits and punctuation only, because
Slurm 22.05's sacctmgr lowercases what it stores; no user-chosen text (job names) at all:

    gpueff1 status=complete nodes=2 gpus=4 util=41.3 gpu_util=90.1,75.0,0.2,0.0 idle=2
            mem_peak=62.5 energy_kwh=1.234

util is the job's utilisation weighted by each GPU's sampled time; gpu_util each GPU's
(node order, then minor); idle the GPUs under IDLE_UTIL; mem_peak the highest peak memory
in % of its device; '-' where not measured. The store keeps the full figures.
"""

from __future__ import annotations

from .model import COMPLETE, IDLE_UTIL, MISSING, GpuSummary, NodeSummary

PREFIX = "gpueff1"


def admin_comment(summaries: list[NodeSummary]) -> str:
    """The line for one run of a job, from its node summaries."""
    gpus = [g for s in sorted(summaries, key=lambda s: s.node)
            for g in sorted(s.gpus, key=lambda g: (g.minor or 0, g.mig_gi_id or 0))]
    utils = [_own(g, "util", "own_util") for g in gpus]
    weights = [(u, g.sampled_s) for u, g in zip(utils, gpus, strict=True) if u is not None and g.sampled_s]
    seconds = sum(w for _, w in weights)
    peaks = [100 * m / g.memory_total_bytes for g in gpus
             if (m := _own(g, "mem_used_bytes", "own_mem_used_bytes", "max")) is not None
             and g.memory_total_bytes]
    energy = [g.energy_j for g in gpus if g.energy_j is not None]
    words = {
        "status": _status(summaries), "nodes": str(len(summaries)), "gpus": str(len(gpus)),
        "util": _num(sum(u * w for u, w in weights) / seconds if seconds else None),
        "gpu_util": ",".join(_num(u) for u in utils) or "-",
        "idle": str(sum(1 for u in utils if u is not None and u < IDLE_UTIL)),
        "mem_peak": _num(max(peaks) if peaks else None),
        "energy_kwh": _num(sum(energy) / 3.6e6 if energy else None, 3),
    }
    return " ".join([PREFIX, *(f"{k}={v}" for k, v in words.items())])


def parse_admin_comment(text: str) -> dict[str, str] | None:
    """The words of a line admin_comment wrote (as Slurm gives it back), or None when the
    AdminComment is something else."""
    words = text.strip().lower().split()
    if not words or words[0] != PREFIX:
        return None
    return dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _own(g: GpuSummary, metric: str, own: str, stat: str = "mean") -> float | None:
    """What the job is charged with: its own processes' share on a GPU shared with others,
    where NVML could attribute it (as the report does)."""
    mine = g.metric(own, stat)
    return mine if g.shared_s and mine is not None else g.metric(metric, stat)


def _status(summaries: list[NodeSummary]) -> str:
    statuses = {s.status for s in summaries}
    return COMPLETE if statuses == {COMPLETE} else MISSING if statuses == {MISSING} else "partial"


def _num(value: float | None, places: int = 1) -> str:
    return "-" if value is None else f"{value:.{places}f}"
