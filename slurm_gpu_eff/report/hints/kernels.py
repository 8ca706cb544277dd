"""What the kernels did: tensor cores, memory-bound work."""

from __future__ import annotations

from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import PER_GPU, Rule, elapsed_h, hint, m, mean, pct, where


def _tensor_cores_unused(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus
               if m(g, "fp32_active") > p["fp32_pct"] and m(g, "tensor_active") < p["tensor_pct"]]
    if not flagged:
        return []
    fp32, tensor, evidence = two_metrics(flagged, "fp32_active", "tensor_active")
    savings = sum(elapsed_h(report) * (g.metric("fp32_active") or 0.0) / 100 * 0.5 for g in flagged)
    evidence["savings_note"] = (
        "rough estimate: half the FP32-busy time (bf16 on tensor cores is often 2x faster)")
    message = (f"Tensor cores unused: the FP32 pipes were busy {fp32:.1f}% of the time and the tensor "
               f"cores {tensor:.1f}%, so the job computes in full FP32 precision.")
    fix = ("Use mixed precision: with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16): ... "
           "around the forward pass (and torch.backends.cuda.matmul.allow_tf32 = True)")
    return [hint("tensor_cores_unused", "warning", message, evidence, fix, savings)]


def two_metrics(flagged: list[GpuLine], first: str, second: str) -> tuple[float, float, dict[str, Any]]:
    """The mean of two percent metrics over the flagged GPUs, with per-GPU figures as evidence."""
    a = mean(g.metric(first) or 0.0 for g in flagged)
    b = mean(g.metric(second) or 0.0 for g in flagged)
    evidence = {
        f"{first}_mean_pct": pct(a), f"{second}_mean_pct": pct(b), "gpus_concerned": len(flagged),
        "gpus": [where(g, **{f"{first}_mean_pct": pct(g.metric(first) or 0.0),
                              f"{second}_mean_pct": pct(g.metric(second) or 0.0)}) for g in flagged],
    }
    return a, b, evidence


def _memory_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus
               if m(g, "dram_active") >= p["dram_pct"] and m(g, "sm_active") < p["sm_pct"]]
    if not flagged:
        return []
    dram, sm, evidence = two_metrics(flagged, "dram_active", "sm_active")
    message = (f"Memory-bound: DRAM bandwidth was {dram:.1f}% busy while the SMs were active only "
               f"{sm:.1f}%, so the kernels wait on memory, not on compute.")
    fix = ("Raise arithmetic intensity: fuse element-wise ops (torch.compile), use larger batches or "
           "tiles, and keep tensors in bf16 to halve the memory traffic")
    return [hint("memory_bound", "info", message, evidence, fix, None)]


RULES: tuple[Rule, ...] = (
    Rule(
        "tensor_cores_unused", "Tensor cores unused",
        "A GPU whose FP32 pipes are busy over 20% of the time while its tensor cores stay under 1% "
        "computes in full precision what tensor cores do several times faster in bf16 or TF32. "
        "Every GPU with GPM has tensor cores. The savings figure is rough (half the FP32-busy time) "
        "and the evidence says so.",
        {"fp32_pct": 20.0, "tensor_pct": 1.0}, ("fp32_active", "tensor_active"), _tensor_cores_unused,
        evidence=("fp32_active_mean_pct", "tensor_active_mean_pct", "savings_note", *PER_GPU),
    ),
    Rule(
        "memory_bound", "Memory-bound kernels",
        "NVIDIA puts the practical peak of DRAM activity near 80%; at 70% or more with SM activity "
        "under 50% the kernels wait on memory. That is sometimes the nature of the work, so this is "
        "information, without a savings figure.",
        {"dram_pct": 70.0, "sm_pct": 50.0}, ("dram_active", "sm_active"), _memory_bound,
        evidence=("dram_active_mean_pct", "sm_active_mean_pct", *PER_GPU),
    ),
)
