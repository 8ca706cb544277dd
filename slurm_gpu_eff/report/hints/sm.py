"""SM activity, the main under-use signal where GPM measures it: busy GPUs doing little,
SMs mostly empty at middling utilisation, and the work unevenly spread over the GPUs.

NVML's utilisation counts the time "one or more kernels was executing": a tiny kernel on
one SM reads 100%. SM activity (DCGM's profiling metrics) is the share of time a warp sat
on each SM; under 0.5 is "likely ineffective" use. Their ratio tells idle time (SM activity
near utilisation: kernels fill the GPU when they run) from small kernels or spinning
waits (SM activity far below it)."""

from __future__ import annotations

from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import (
    GIB,
    NSYS,
    PER_GPU,
    Rule,
    by_utilisation_alone,
    elapsed_h,
    estimated,
    fitted,
    gib,
    hint,
    label,
    lost,
    mean,
    mem_peak,
    pct,
    sm,
    used,
    where,
)

SMALL_KERNELS = {
    "pytorch": ("Cut kernel-launch overhead: capture the step in CUDA graphs "
                "(torch.compile(model, mode=\"reduce-overhead\")), use larger batches, fuse small kernels "
                "(torch.compile), and avoid host syncs (.item(), .cpu()) in the loop"),
    "tensorflow": "Use larger batches, and compile the step with XLA (tf.function(jit_compile=True)) to fuse "
                  "small kernels",
    "jax": ("Use larger batches, and jax.jit the whole training step (not its pieces) so XLA fuses small "
            "kernels"),
}
SMALL_KERNELS_NEUTRAL = ("Give each kernel more work (larger batches or problem sizes per GPU, fused "
                         "kernels, CUDA graphs for many small launches); " + NSYS)


def _power_pct(g: GpuLine) -> float | None:
    if g.power_mean_w is None or not g.power_limit_w:
        return None
    return 100 * g.power_mean_w / g.power_limit_w


def _link_mibs(g: GpuLine) -> float:
    return max(g.metric("nvlink_rx_mbps") or 0.0, g.metric("nvlink_tx_mbps") or 0.0)


def _waits(report: JobReport, flagged: list[GpuLine], p: dict[str, float]) -> list[str]:
    """Signs that busy-but-empty GPUs wait on each other (NCCL spins at 100% utilisation
    while a slower rank catches up), told before any kernel fix is offered."""
    job = report.job
    if max(job.gpus, len(report.gpus)) < 2 and job.nnodes < 2:
        return []  # one GPU has no one to wait for
    signs = []
    traffic = mean(_link_mibs(g) for g in flagged)
    if traffic >= p["link_mibs"]:
        signs.append(f"NVLink traffic of {traffic:.0f} MiB/s")
    active = [s for s in (sm(g) for g in report.gpus if not lost(g)) if s is not None]
    if len(active) >= 2 and max(active) - min(active) >= p["spread_pct"]:
        signs.append(f"SM activity from {min(active):.0f}% to {max(active):.0f}% across the job's GPUs")
    if job.nnodes > 1:
        signs.append(f"ranks on {job.nnodes} nodes")
    return signs


def _falsely_busy(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus if not lost(g) and (g.util_mean or 0.0) >= p["busy_pct"]
               and (sm(g) or 0.0) < min(p["sm_pct"], p["ratio"] * (g.util_mean or 0.0))]
    if not flagged:
        return []
    util = mean(g.util_mean or 0.0 for g in flagged)
    active = mean(sm(g) or 0.0 for g in flagged)
    powers = [x for x in (_power_pct(g) for g in flagged) if x is not None]
    signs = _waits(report, flagged, p)
    evidence: dict[str, Any] = {
        "util_mean_pct": pct(util), "sm_active_mean_pct": pct(active),
        "cause": "waiting" if signs else "small_kernels", "gpus_concerned": len(flagged),
        "gpus": [where(g, util_mean_pct=pct(g.util_mean or 0.0), sm_active_mean_pct=pct(sm(g) or 0.0),
                       nvlink_mib_s=round(_link_mibs(g))) for g in flagged],
    }
    power = ""
    if powers:
        evidence["power_pct_of_limit"] = pct(mean(powers))
        power = f", power {mean(powers):.0f}% of the limit"
    head = "GPUs busy but doing little" if len(flagged) > 1 else "GPU busy but doing little"
    figures = f"utilisation {util:.1f}% but SM activity only {active:.1f}%{power}"
    if signs:
        message = (f"{head}: {figures}, with {' and '.join(signs)}: the GPUs likely wait on each other "
                   "(NCCL collectives keep a GPU at 100% utilisation while they wait for a slower rank).")
        fix = ("Find the slow rank before tuning kernels: compare the ranks' step times; look for work "
               "only one rank does (logging, evaluation, checkpoints on rank 0), uneven data shards, or a "
               "slow node or network (NCCL_DEBUG=INFO); " + NSYS)
        return [hint("falsely_busy", "warning", message, evidence, fix, None)]
    message = (f"{head}: {figures}: kernels ran most of the time but kept few SMs busy, so they are too "
               "small for this GPU or wait on their launches.")
    savings = estimated(sum(elapsed_h(report) * (1 - (sm(g) or 0.0) / (g.util_mean or 1.0)) for g in flagged),
                        "the kernel time with the SMs empty (1 - SM activity / utilisation): a bound")
    fix = fitted(report, SMALL_KERNELS, SMALL_KERNELS_NEUTRAL)
    return [hint("falsely_busy", "warning", message, evidence, fix, savings)]


def _low_sm(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """SMs mostly empty on a GPU neither low_util nor falsely_busy judges."""
    def busy_but_empty(g: GpuLine, s: float) -> bool:
        return (g.util_mean or 0.0) >= p["busy_pct"] and s < p["ratio"] * (g.util_mean or 0.0)

    flagged = [g for g in report.gpus if not lost(g) and (g.util_mean or 0.0) >= p["util_low"]
               and (sm(g) or 0.0) < p["sm_pct"] and not busy_but_empty(g, sm(g) or 0.0)]
    if not flagged:
        return []
    util = mean(g.util_mean or 0.0 for g in flagged)
    active = mean(sm(g) or 0.0 for g in flagged)
    evidence = {"util_mean_pct": pct(util), "sm_active_mean_pct": pct(active), "gpus_concerned": len(flagged),
                "gpus": [where(g, util_mean_pct=pct(g.util_mean or 0.0), sm_active_mean_pct=pct(sm(g) or 0.0))
                         for g in flagged]}
    if active >= p["ratio"] * util:
        why = (f"when kernels ran they filled the GPU, but none ran {100 - util:.0f}% of the time: the GPU "
               "waits between its steps")
    else:
        why = (f"kernels ran {util:.0f}% of the time but kept few SMs busy, and none ran the rest: small "
               "kernels and waits together")
    message = (f"Low SM activity: {active:.1f}% at {util:.1f}% utilisation (NVIDIA reads under 50% as "
               f"likely ineffective use): {why}.")
    fix = fitted(report, {
        "pytorch": ("Larger batches; DataLoader(num_workers=..., pin_memory=True) if input is slow; CUDA "
                    "graphs or torch.compile for many small kernels; no host syncs (.item(), .cpu()) in the "
                    "loop; " + NSYS),
        "tensorflow": ("Larger batches; tf.data with num_parallel_calls and prefetch(tf.data.AUTOTUNE); XLA "
                       "(jit_compile=True) for many small kernels; " + NSYS),
        "jax": ("Larger batches; jax.jit the whole step; load and prefetch batches ahead of the step; "
                + NSYS),
    }, "Give each GPU more work per step (a larger batch or problem size) and find what it waits on: " + NSYS)
    savings = estimated(len(flagged) * elapsed_h(report) * max(0.0, 1 - active / p["sm_target_pct"]),
                        f"if the same work ran at {p['sm_target_pct']:g}% SM activity (NVIDIA's 'necessary' "
                        "level), treating SM activity as throughput: a rough estimate")
    return [hint("low_sm", "warning", message, evidence, fix, savings)]


def _activity(gpus: list[GpuLine]) -> tuple[str, dict[int, float]]:
    """Per GPU (by position), SM activity where every GPU measures it, else utilisation."""
    if all(sm(g) is not None for g in gpus):
        return "sm_active", {i: sm(g) or 0.0 for i, g in enumerate(gpus)}
    return "util", {i: g.util_mean or 0.0 for i, g in enumerate(gpus)}


def _imbalance(report: JobReport, p: dict[str, float]) -> list[Hint]:
    gpus = used(report, p)
    if len(gpus) < 2:
        return []
    basis, act = _activity(gpus)
    top = max(act, key=lambda i: act[i])
    busiest = act[top]
    low = [i for i in act if act[i] < p["low_fraction"] * busiest]
    if busiest < p["busy_pct"] or not low or busiest - mean(act[i] for i in low) < p["gap_pct"]:
        return []
    rest = mean(act[i] for i in low)
    what = "SM activity" if basis == "sm_active" else "utilisation"
    held = [gpus[i] for i in low if mem_peak(gpus[i]) >= p["held_gib"] * GIB]
    evidence = {"basis": basis, "busiest_pct": pct(busiest), "others_mean_pct": pct(rest),
                "gpus_concerned": len(low) + 1,
                "gpus": [where(g, **{f"{basis}_mean_pct": pct(act[i])}, mem_peak_gib=gib(mem_peak(g)))
                         for i, g in enumerate(gpus) if i == top or i in low]}
    others = f"{len(low)} other{'s' if len(low) > 1 else ''}"
    message = (f"Uneven work across the GPUs: {label(gpus[top])} at {busiest:.0f}% {what}, {others} at "
               f"{rest:.0f}% on average: one GPU does most of the work")
    if held:
        message += (f"; the others hold {mean(mem_peak(g) for g in held) / GIB:.0f} GiB each, so they hold "
                    "part of the work (parts of a split model, or replicas) but wait on the busy one")
    message += "." + (by_utilisation_alone(gpus) if basis == "util" else "")
    ddp = ("use DistributedDataParallel (one process per GPU, started by torchrun) rather than "
           "nn.DataParallel, give each rank an equal share of the data (DistributedSampler), and keep "
           "logging, evaluation and checkpoints on rank 0 from holding up the others")
    # Idle-but-full GPUs may hold the parts of a split model: DDP's whole replica per GPU
    # would not fit there, so it is offered only as one of the two cases.
    torch = ("If the model is split over the GPUs (device_map, pipeline stages), balance the parts' work; "
             f"if each GPU holds a replica, {ddp}") if held else ddp[0].upper() + ddp[1:]
    fix = fitted(report, {
        "pytorch": torch,
        "tensorflow": ("Check that the strategy spreads the work (tf.distribute.MirroredStrategy, the global "
                       "batch a multiple of the GPUs) and that no op is pinned to one GPU"),
        "jax": ("Check that the arrays are sharded over all devices (jax.sharding.NamedSharding over a Mesh "
                "of every GPU) rather than left on the first"),
    }, "Check that the work is divided evenly over the GPUs (each rank's share, where the model's parts "
       "are placed); " + NSYS)
    share = mean(act.values()) / busiest
    savings = estimated(len(gpus) * elapsed_h(report) * (1 - share),
                        f"if the work were spread evenly: the run would take the GPUs' mean {what} over the "
                        "busiest one's of its time, a bound")
    return [hint("imbalance", "warning", message, evidence, fix, savings)]


RULES: tuple[Rule, ...] = (
    Rule(
        "falsely_busy", "Busy but doing little",
        "NVML's utilisation counts the time any kernel ran, so a GPU at 60% or more whose SM activity "
        "is under 50% (DCGM: 'likely ineffective') and under 0.6 of its utilisation (ours) runs "
        "kernels that keep few SMs busy. NCCL ranks waiting for a late rank look the same (100% "
        "utilisation, low SM activity, low power), so NVLink traffic over 1024 MiB/s, SM activity "
        "20 points apart across the job's GPUs, or several nodes (ours) point to a wait, and the "
        "fix is to find the slow rank, not to tune kernels. Without GPM nothing is said: power "
        "alone cannot tell the two apart.",
        {"busy_pct": 60.0, "sm_pct": 50.0, "ratio": 0.6, "link_mibs": 1024.0, "spread_pct": 20.0},
        ("util", "sm_active"), _falsely_busy,
        evidence=("util_mean_pct", "sm_active_mean_pct", "power_pct_of_limit", "cause", *PER_GPU),
    ),
    Rule(
        "low_sm", "Low SM activity at middling utilisation",
        "SM activity under 50% is 'likely ineffective' use at any utilisation (DCGM), and memory-"
        "stalled warps count as active, so a low figure is no artefact. This rule takes the GPUs "
        "from 25% utilisation (low_util's line) that falsely_busy leaves (at 60% or more with SM "
        "activity under 0.6 of it), and tells idle time between kernels from small kernels by the "
        "ratio of SM activity to utilisation. Savings are "
        "a rough estimate: the work at 80% SM activity, DCGM's 'necessary' level.",
        {"sm_pct": 50.0, "util_low": 25.0, "busy_pct": 60.0, "ratio": 0.6, "sm_target_pct": 80.0},
        ("util", "sm_active"), _low_sm, evidence=("util_mean_pct", "sm_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "imbalance", "Uneven work across the job's GPUs",
        "Unbalanced multi-GPU jobs are common (Perlmutter's telemetry): rank 0 doing extra work, "
        "DataParallel instead of DDP, uneven shards or pipeline stages. With the busiest GPU at 50% "
        "or more, others under half of it and 30 points below (ours), the hint says so, by SM "
        "activity where every GPU measures it, else by utilisation. GPUs under 5% are idle_gpus'; "
        "others holding 2 GiB or more (ours, as idle_gpus) may hold a split model's parts, so a "
        "PyTorch job is told to balance those before it is told DDP, which needs a whole replica per GPU.",
        {"idle_pct": 5.0, "busy_pct": 50.0, "low_fraction": 0.5, "gap_pct": 30.0, "held_gib": 2.0},
        ("util",), _imbalance,
        evidence=("basis", "busiest_pct", "others_mean_pct", *PER_GPU),
    ),
)
