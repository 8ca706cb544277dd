"""GPU memory: far below its total (a smaller GPU or a MIG slice), or near it."""

from __future__ import annotations

import math

from ..shapes import GpuLine, Hint, JobReport
from .core import (
    GIB,
    PER_GPU,
    PREALLOCATING,
    Rule,
    by_utilisation_alone,
    cpus_per_gpu,
    fitted,
    gib,
    hint,
    mem_peak,
    pct,
    sm,
    where,
)


def _evidence(gpus: list[GpuLine]) -> tuple[float, float, dict]:
    peak = max(mem_peak(g) for g in gpus)
    total = max(g.mem_total_bytes or 0 for g in gpus)
    return peak, total, {
        "mem_peak_gib": gib(peak), "mem_total_gib": gib(total), "mem_peak_pct": pct(100 * peak / total),
        "gpus_concerned": len(gpus),
        "gpus": [where(g, mem_peak_gib=gib(mem_peak(g)), mem_total_gib=gib(g.mem_total_bytes or 0))
                 for g in gpus],
    }


def _small_job(g: GpuLine, report: JobReport, p: dict[str, float]) -> bool:
    """Princeton's MIG test: little memory, low use and few cores, all three."""
    use = sm(g) if sm(g) is not None else g.util_mean
    small = (g.mem_total_bytes is not None and mem_peak(g) < p["low_fraction"] * g.mem_total_bytes
             and mem_peak(g) <= p["mig_gib"] * GIB)
    return (small and use is not None and p["idle_pct"] <= use <= p["mig_util_pct"]
            and cpus_per_gpu(report) <= p["mig_cpus_per_gpu"])


def _gpu_memory(report: JobReport, p: dict[str, float]) -> list[Hint]:
    measured = [g for g in report.gpus if g.mem_used_max_bytes is not None and g.mem_total_bytes]
    high = [g for g in measured if mem_peak(g) >= p["high_fraction"] * (g.mem_total_bytes or 0)]
    low = [g for g in measured if g not in high and _small_job(g, report, p)]
    hints = []
    if high:
        peak, total, evidence = _evidence(high)
        figures = f"the peak was {peak / GIB:.1f} GiB of {total / GIB:.0f} GiB ({100 * peak / total:.0f}%)"
        preallocating = [f for f in report.frameworks or [] if f in PREALLOCATING]
        if preallocating:  # TensorFlow and JAX take the memory by design: not a risk in itself
            message = (f"GPU memory full, by design: {figures}; {preallocating[0]} takes most of the GPU's "
                       "memory up front, so this says nothing of what the job needs.")
            fix = fitted(report, {
                "tensorflow": ("To see what it needs: tf.config.experimental.set_memory_growth(gpu, True) "
                               "for each GPU, before the model is built"),
                "jax": "To see what it needs: XLA_PYTHON_CLIENT_PREALLOCATE=false in the job's environment",
            }, "To see what it needs, turn the framework's preallocation off")
            hints.append(hint("gpu_memory", "info", message, evidence, fix, None))
        else:
            message = (f"GPU memory nearly full: {figures}, a risk of running out of memory (unless the "
                       "program takes the memory up front by design).")
            fix = fitted(report, {
                "pytorch": ("Leave headroom: gradient checkpointing (torch.utils.checkpoint), a smaller "
                            "batch, or bf16 weights and activations"),
            }, "Leave headroom: a smaller batch or problem per GPU, or spread the work over more GPUs")
            hints.append(hint("gpu_memory", "warning", message, evidence, fix, None))
    if low:
        peak, total, evidence = _evidence(low)
        need = max(1, math.ceil(peak * 1.25 / GIB))
        evidence["mem_needed_gib"] = need
        message = (f"A small job for this GPU: the peak was {peak / GIB:.1f} GiB of {total / GIB:.0f} GiB "
                   f"({100 * peak / total:.0f}%), with low use and few cores." + by_utilisation_alone(low))
        fix = (f"Ask for a smaller GPU type or a MIG slice with at least {need} GiB where the site "
               "has one ('#SBATCH --gres=gpu:<type>:1')")
        hints.append(hint("gpu_memory", "info", message, evidence, fix, None))
    return hints


RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_memory", "GPU memory far below or near its total",
        "A MIG slice or smaller GPU is suggested only as Princeton's job_defense_shield does: the "
        "peak under a quarter of the GPU and at most 10 GiB, use (SM activity, else utilisation) "
        "at most 20% and at most 8 cores per GPU (ours, their cores test unverified); idle GPUs (under "
        "5%) are idle_gpus'. At 95% or more (ours) the next larger batch runs out of memory, except with "
        "TensorFlow or JAX, which preallocate by design: for them it is information only.",
        {"low_fraction": 0.25, "mig_gib": 10.0, "mig_util_pct": 20.0, "mig_cpus_per_gpu": 8.0,
         "idle_pct": 5.0, "high_fraction": 0.95},
        ("mem_used_bytes",), _gpu_memory,
        evidence=("mem_peak_gib", "mem_total_gib", "mem_peak_pct", "mem_needed_gib", *PER_GPU),
    ),
)
