"""GPU memory: far below or near its total."""

from __future__ import annotations

import math

from ..shapes import Hint, JobReport
from .core import GIB, PER_GPU, Rule, gib, hint, pct, where


def _gpu_memory(report: JobReport, p: dict[str, float]) -> list[Hint]:
    low, high = [], []
    for g in report.gpus:
        if g.mem_used_max_bytes is None or not g.mem_total_bytes:
            continue
        share = g.mem_used_max_bytes / g.mem_total_bytes
        if share >= p["high_fraction"]:
            high.append(g)
        elif share < p["low_fraction"] and not g.idle:  # an idle GPU is idle_gpus's finding
            low.append(g)
    hints = []
    for gpus, severity in ((high, "warning"), (low, "info")):
        if not gpus:
            continue
        peak = max(g.mem_used_max_bytes or 0.0 for g in gpus)
        total = max(g.mem_total_bytes or 0 for g in gpus)
        evidence = {
            "mem_peak_gib": gib(peak), "mem_total_gib": gib(total),
            "mem_peak_pct": pct(100 * peak / total), "gpus_concerned": len(gpus),
            "gpus": [where(g, mem_peak_gib=gib(g.mem_used_max_bytes or 0.0),
                            mem_total_gib=gib(g.mem_total_bytes or 0)) for g in gpus],
        }
        figures = f"the peak was {peak / GIB:.1f} GiB of {total / GIB:.0f} GiB ({100 * peak / total:.0f}%)"
        if severity == "warning":
            message = f"GPU memory nearly full: {figures}, a risk of running out of memory."
            fix = ("Leave headroom: gradient checkpointing (torch.utils.checkpoint), a smaller batch, "
                   "or bf16 weights and activations")
        else:
            need = max(1, math.ceil(peak * 1.25 / GIB))
            evidence["mem_needed_gib"] = need
            message = f"Little GPU memory used: {figures}."
            fix = (f"Ask for a smaller GPU type or a MIG slice with at least {need} GiB where the site "
                   "has one ('#SBATCH --gres=gpu:<type>:1')")
        hints.append(hint("gpu_memory", severity, message, evidence, fix, None))
    return hints


RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_memory", "GPU memory far below or near its total",
        "A job whose peak stays under a quarter of the GPU's memory would fit a smaller GPU or a MIG "
        "slice (asked for with 25% headroom over the peak); at 95% or more the next larger batch or "
        "sequence runs out of memory. Idle GPUs are left to idle_gpus.",
        {"low_fraction": 0.25, "high_fraction": 0.95}, ("mem_used_bytes",), _gpu_memory,
        evidence=("mem_peak_gib", "mem_total_gib", "mem_peak_pct", "mem_needed_gib", *PER_GPU),
    ),
)
