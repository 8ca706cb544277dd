"""What the kernels did: tensor cores left unused, memory-bound work."""

from __future__ import annotations

from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import NSYS, PER_GPU, Rule, elapsed_h, estimated, fitted, framework, hint, m, mean, pct, where


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


MIXED_PRECISION = {
    "pytorch": ("Use mixed precision: with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16): ... "
                "around the forward pass (and torch.backends.cuda.matmul.allow_tf32 = True)"),
    "tensorflow": "Use mixed precision: tf.keras.mixed_precision.set_global_policy(\"mixed_bfloat16\")",
    "jax": ("Compute in bfloat16 where the model allows (params and activations in jnp.bfloat16, or "
            "jax.default_matmul_precision(\"tensorfloat32\"))"),
}


def _tensor_cores_unused(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus
               if m(g, "fp32_active") > p["fp32_pct"] and m(g, "tensor_active") < p["tensor_pct"]]
    name = framework(report)
    # Only a deep-learning framework is told to change precision: a simulation code (MD, CFD,
    # Monte Carlo) computes in FP32 because its results need it. Plain CUDA is left alone.
    if not flagged or ("cuda" in (report.frameworks or []) and name is None):
        return []
    fp32, tensor, evidence = two_metrics(flagged, "fp32_active", "tensor_active")
    message = (f"Tensor cores unused: the FP32 pipes were busy {fp32:.1f}% of the time and the tensor "
               f"cores {tensor:.1f}%, so the job computes in full FP32 precision.")
    if name is None:
        fix = ("If this is deep learning, mixed precision (bf16 or TF32) would use the tensor cores; a "
               "scientific code may need FP32 for its accuracy: change precision only where the results "
               "stay valid")
        return [hint("tensor_cores_unused", "info", message, evidence, fix, None)]
    savings = estimated(sum(elapsed_h(report) * m(g, "fp32_active") / 100 * 0.5 for g in flagged),
                        "half the FP32-busy time (bf16 on tensor cores is often 2x faster): rough")
    return [hint("tensor_cores_unused", "warning", message, evidence, MIXED_PRECISION[name], savings)]


def _memory_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    # Warps stalled on memory count as SM-active, so memory-bound kernels show high SM
    # activity: judge by DRAM activity alone, and tell copies (SMs idle) from kernels.
    flagged = [g for g in report.gpus if m(g, "dram_active") >= p["dram_pct"]]
    if not flagged:
        return []
    dram, active, evidence = two_metrics(flagged, "dram_active", "sm_active")
    if active < p["sm_pct"]:
        evidence["kind"] = "copies"
        message = (f"Memory traffic with idle SMs: DRAM bandwidth was {dram:.1f}% busy while the SMs were "
                   f"active only {active:.1f}%, which looks like copies (memcpy, data movement) more than "
                   "computation.")
        fix = fitted(report, {
            "pytorch": ("Move data less: keep tensors on the GPU between steps, avoid copies and re-layouts "
                        "(.contiguous(), transposes) in the loop; " + NSYS),
        }, "Move data less: keep the data on the GPU between steps and avoid copies and re-layouts "
           "(transposes) in the loop; " + NSYS)
    else:
        evidence["kind"] = "kernels"
        message = (f"Memory-bound kernels: DRAM bandwidth was {dram:.1f}% busy (near its practical peak of "
                   f"about 80%) with the SMs {active:.1f}% active: the kernels wait on memory.")
        fix = ("Often the nature of the work; to raise arithmetic intensity, fuse element-wise operations "
               "and use larger tiles or batches; Nsight Compute's memory workload analysis ('ncu') shows "
               "which kernels")
        if framework(report) == "pytorch":
            fix += " (in PyTorch, torch.compile fuses element-wise operations)"
    return [hint("memory_bound", "info", message, evidence, fix, None)]


RULES: tuple[Rule, ...] = (
    Rule(
        "tensor_cores_unused", "Tensor cores unused",
        "FP32 pipes busy over 20% of the time with tensor cores under 1% (ours) means full-precision "
        "math that tensor cores do faster in bf16 or TF32. Only a known deep-learning framework "
        "(PyTorch, TensorFlow, JAX) gets its mixed-precision fix, with a rough estimate (half the "
        "FP32 time); an unknown code gets a neutral note, and plain CUDA (simulation codes, whose "
        "accuracy may need FP32) nothing.",
        {"fp32_pct": 20.0, "tensor_pct": 1.0}, ("fp32_active", "tensor_active"), _tensor_cores_unused,
        evidence=("fp32_active_mean_pct", "tensor_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "memory_bound", "Memory-bound kernels",
        "NVIDIA puts the practical peak of DRAM activity near 80% and counts memory-stalled warps as "
        "SM-active, so DRAM activity of 60% or more (ours: three quarters of that peak) is judged "
        "alone. SM activity under 50% beside it means copies rather than kernels. Most GPU jobs are "
        "memory-bound by nature (Perlmutter's telemetry), so this is information, without savings.",
        {"dram_pct": 60.0, "sm_pct": 50.0}, ("dram_active", "sm_active"), _memory_bound,
        evidence=("dram_active_mean_pct", "sm_active_mean_pct", "kind", *PER_GPU),
    ),
)
