"""Tuning hints: what to change in a job, the figures that show it, the GPU-hours it would save.

A rule is plain data (id, thresholds, the metrics it needs, why) plus one check function
of ours. A site's `[hints]` config section can disable rules, change thresholds, replace
a rule's wording and add a link; nothing from it is ever evaluated as code (a message
template only names evidence figures, filled in by `render_message`). A rule never
speaks from a metric that was not measured: `evaluate` shows each rule only the GPUs on
which every metric it needs was measured, and no GPU at all means no hint.

Standard library only; the report's shapes come from `shapes`, so that `job` (which builds
a report and asks this module for its hints) and this module never import each other.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from .shapes import GpuLine, Hint, JobReport

SEVERITIES = ("critical", "warning", "info")  # most urgent first
AUDIENCES = ("user", "admin")
GIB = 1024**3
MIB = 1024**2
_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
GOOD_UTIL_PCT = 70.0  # the verdict says "Good" from here, "Fair" below (with no warning)


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


def _pct(value: float) -> float:
    return round(value, 1)


def _gpu_h(value: float) -> float:
    return round(value, 3)


def _gib(value: float) -> float:
    return round(value / GIB, 2)


def _m(g: GpuLine, name: str) -> float:
    """A metric's mean, 0 when unmeasured: only for GPUs that `needs` vouched for."""
    return g.metric(name) or 0.0


def _lost(g: GpuLine) -> bool:
    """Fell off the bus: its low figures are the hardware's doing, not the job's."""
    return g.summary is not None and g.summary.lost_at is not None


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)


def _label(g: GpuLine) -> str:
    return f"{g.node} GPU {'?' if g.minor is None else g.minor}"


def _labels(gpus: list[GpuLine]) -> str:
    names = [_label(g) for g in gpus]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _where(g: GpuLine, **figures: Any) -> dict[str, Any]:
    return {"node": g.node, "minor": g.minor, **figures}


def _gpus_word(n: int) -> str:
    return "GPU" if n == 1 else "GPUs"


def _elapsed_h(report: JobReport) -> float:
    return report.job.elapsed_s / 3600.0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _sbatch_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _cpus_per_gpu(report: JobReport) -> int:
    return max(1, report.job.ncpus // max(1, report.job.gpus))


def _hint(rule: str, severity: str, message: str, evidence: dict[str, Any], fix: str,
          savings: float | None, audience: str = "user") -> Hint:
    return Hint(rule, severity, audience, message, evidence, fix,
                None if savings is None else _gpu_h(max(0.0, savings)))


# --- the rules' checks -----------------------------------------------------------------------


def _idle_gpus(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    idle = [g for g in report.gpus
            if g.util_mean is not None and g.util_mean < p["idle_pct"] and not _lost(g)]
    n, k = max(job.gpus, len(report.gpus)), len(idle)
    if not idle or (n == 1 and k < n):
        return []
    per_gpu = []
    details = []
    for g in idle:
        opened = None if g.summary is None or g.summary.processes_max is None else not g.never_used
        state = {True: "was opened but stayed idle", False: "was never opened by any process",
                 None: "stayed idle"}[opened]
        details.append(f"{_label(g)} {state} ({g.util_mean:.1f}%)")
        per_gpu.append(_where(g, util_mean_pct=_pct(g.util_mean or 0.0), opened=opened))
    evidence = {
        "gpus_allocated": n, "gpus_idle": k,
        "gpus_never_opened": sum(1 for e in per_gpu if e["opened"] is False),
        "idle_pct": p["idle_pct"], "elapsed_s": job.elapsed_s, "gpus": per_gpu,
    }
    savings = k * _elapsed_h(report)
    if k == n:
        head = "The GPU sat idle" if n == 1 else f"All {n} GPUs sat idle"
        fix = ("Run it as a CPU job (drop the '#SBATCH --gres=gpu:...' line), or make the code use "
               "the GPU: check that torch.cuda.is_available() is True inside the job")
        return [_hint("idle_gpus", "critical", f"{head}: {'; '.join(details)}.", evidence, fix, savings)]
    fix = f"#SBATCH --gres=gpu:{n - k}"
    if job.nnodes > 1:
        per_node = Counter(g.node for g in idle)
        even = n % job.nnodes == 0 and len(per_node) == job.nnodes and len(set(per_node.values())) == 1
        if even:
            fix = (f"#SBATCH --gres=gpu:{n // job.nnodes - k // job.nnodes} "
                   f"(per node: --gres counts the GPUs on each of the {job.nnodes} nodes)")
        else:
            fix = (f"#SBATCH --gpus={n - k} (the job's GPUs over all its nodes) "
                   "instead of a per-node --gres=gpu:...")
    message = f"{k} of {n} GPUs sat idle: {'; '.join(details)}."
    return [_hint("idle_gpus", "warning", message, evidence, fix, savings)]


def _pattern(g: GpuLine, p: dict[str, float]) -> tuple[str, dict[str, float]]:
    """'idle_edges', 'periodic' or 'steady', with the figures that tell."""
    timeline, bucket_s = g.util_timeline()
    points = [u for u in timeline if u is not None]  # the measured buckets
    if len(points) >= 5:
        lead = next((i for i, u in enumerate(points) if u >= p["idle_pct"]), len(points))
        trail = next((i for i, u in enumerate(reversed(points)) if u >= p["idle_pct"]), len(points))
        share = (lead + trail) / len(points)
        if share > p["edge_fraction"]:
            return "idle_edges", {"idle_start_s": round(lead * bucket_s),
                                  "idle_end_s": round(trail * bucket_s), "idle_edges_pct": _pct(100 * share)}
    hist = g.summary.util_histogram_s if g.summary is not None else None
    total = sum(hist) if hist else 0.0
    if hist and total > 0:
        low, high = hist[0] / total, sum(hist[5:]) / total
        if low >= p["periodic_fraction"] and high >= p["periodic_fraction"]:
            return "periodic", {"low_time_pct": _pct(100 * low), "high_time_pct": _pct(100 * high)}
    states = [u < 10 for u in points if u < 10 or u > 50]
    switches = sum(1 for a, b in zip(states, states[1:], strict=False) if a != b)
    if switches >= p["switches"]:
        return "periodic", {"switches": switches}
    return "steady", {}


def _low_util(report: JobReport, p: dict[str, float]) -> list[Hint]:
    gpus = [g for g in report.gpus
            if g.util_mean is not None and g.util_mean >= p["idle_pct"] and not _lost(g)]
    if not gpus:
        return []
    util = _mean(g.util_mean or 0.0 for g in gpus)
    if util >= p["warn_pct"]:
        return []
    severity = "critical" if util < p["red_pct"] else "warning"
    patterns = [_pattern(g, p) for g in gpus]
    counts = Counter(name for name, _ in patterns)
    order = ("idle_edges", "periodic", "steady")
    pattern = max(order, key=lambda name: (counts[name], -order.index(name)))
    figures = [f for name, f in patterns if name == pattern]
    extra = {key: round(_mean(f[key] for f in figures), 1) for key in figures[0]}
    alloc_h = len(gpus) * _elapsed_h(report)
    evidence: dict[str, Any] = {
        "util_mean_pct": _pct(util), "gpus_concerned": len(gpus), "gpu_hours_allocated": _gpu_h(alloc_h),
        "pattern": pattern, **extra, "target_pct": p["target_pct"],
        "gpus": [_where(g, util_mean_pct=_pct(g.util_mean or 0.0), pattern=name)
                 for g, (name, _) in zip(gpus, patterns, strict=True)],
    }
    head = f"Low GPU utilisation ({util:.1f}%)"
    if pattern == "idle_edges":
        message = (f"{head}: the {_gpus_word(len(gpus))} sat idle for the first "
                   f"{_duration(extra['idle_start_s'])} and the last {_duration(extra['idle_end_s'])} "
                   f"({extra['idle_edges_pct']:.0f}% of the run), which looks like data staging.")
        fix = ("Stage the data before the GPU job: copy it to node-local disk in a CPU job and start "
               "this one after it with '#SBATCH --dependency=afterok:<CPU job id>'")
    elif pattern == "periodic":
        if "low_time_pct" in extra:
            shape = (f"{extra['low_time_pct']:.0f}% of the time under 10% and "
                     f"{extra['high_time_pct']:.0f}% over 50%")
        else:
            shape = f"{extra['switches']:.0f} switches between idle and busy"
        message = (f"{head}: busy and idle phases alternate ({shape}), which looks like an input "
                   "pipeline that cannot keep the GPU fed.")
        cpus = _cpus_per_gpu(report)
        wanted = max(cpus, int(p["min_cpus_per_gpu"]))
        fix = (f"DataLoader(..., num_workers={max(1, wanted - 1)}, pin_memory=True, prefetch_factor=4, "
               "persistent_workers=True), reading from node-local disk or a faster filesystem")
        if wanted > cpus:
            fix += f", with '#SBATCH --cpus-per-gpu={wanted}' for the workers"
    else:
        message = (f"{head}: steadily low, which suggests too small a batch or model for this GPU.")
        fix = (f"Raise the batch size (or the work per GPU) until utilisation passes {p['target_pct']:.0f}%, "
               "or ask for a smaller GPU type or a MIG slice where the site has one")
    savings = alloc_h * (1 - util / p["target_pct"]) if p["target_pct"] > 0 else None
    return [_hint("low_util", severity, message, evidence, fix, savings)]


def _falsely_busy(report: JobReport, p: dict[str, float]) -> list[Hint]:
    by_sm, by_power = [], []
    for g in report.gpus:
        util, sm = g.util_mean, g.metric("sm_active")
        if util is None or util < p["busy_pct"]:
            continue
        if sm is not None:
            if sm < p["sm_pct"]:
                by_sm.append(g)
        elif g.power_mean_w is not None and g.power_limit_w:
            if g.power_mean_w < p["power_fraction"] * g.power_limit_w:
                by_power.append(g)
    flagged = by_sm + by_power
    if not flagged:
        return []
    util = _mean(g.util_mean or 0.0 for g in flagged)
    evidence: dict[str, Any] = {"util_mean_pct": _pct(util), "gpus_concerned": len(flagged),
                                "proxy": "sm_active" if by_sm else "power"}
    gpus = [_where(g, util_mean_pct=_pct(g.util_mean or 0.0), sm_active_mean_pct=_pct(g.metric("sm_active")
                   or 0.0)) for g in by_sm]
    gpus += [_where(g, util_mean_pct=_pct(g.util_mean or 0.0),
                    power_pct_of_limit=_pct(100 * (g.power_mean_w or 0.0) / (g.power_limit_w or 1.0)))
             for g in by_power]
    head = "GPUs busy but doing little" if len(flagged) > 1 else "GPU busy but doing little"
    savings = None
    if by_sm:
        sm = _mean(g.metric("sm_active") or 0.0 for g in by_sm)
        evidence["sm_active_mean_pct"] = _pct(sm)
        message = (f"{head}: utilisation {util:.1f}% but SM activity only {sm:.1f}%, so its kernels are "
                   "too small to fill the GPU (launch overhead).")
        savings = sum(_elapsed_h(report) * (1 - (g.metric("sm_active") or 0.0) / (g.util_mean or 1.0))
                      for g in by_sm)
    if by_power:
        power = _mean(100 * (g.power_mean_w or 0.0) / (g.power_limit_w or 1.0) for g in by_power)
        evidence["power_pct_of_limit"] = _pct(power)
        if not by_sm:
            message = (f"{head}: utilisation {util:.1f}% but power draw only {power:.1f}% of the limit "
                       "(power is the proxy: these GPUs do not measure SM activity), so its kernels are "
                       "likely too small to fill the GPU.")
        else:
            message = message[:-1] + f" ({_labels(by_power)}: judged by power, {power:.1f}% of the limit)."
    evidence["gpus"] = gpus
    fix = ("Cut kernel-launch overhead: capture the step in CUDA graphs "
           "(torch.compile(model, mode=\"reduce-overhead\")), use larger batches, fuse small kernels "
           "(torch.compile)")
    return [_hint("falsely_busy", "warning", message, evidence, fix, savings)]


def _tensor_cores_unused(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus
               if _m(g, "fp32_active") > p["fp32_pct"] and _m(g, "tensor_active") < p["tensor_pct"]]
    if not flagged:
        return []
    fp32, tensor, evidence = _two_metrics(flagged, "fp32_active", "tensor_active")
    savings = sum(_elapsed_h(report) * (g.metric("fp32_active") or 0.0) / 100 * 0.5 for g in flagged)
    evidence["savings_note"] = (
        "rough estimate: half the FP32-busy time (bf16 on tensor cores is often 2x faster)")
    message = (f"Tensor cores unused: the FP32 pipes were busy {fp32:.1f}% of the time and the tensor "
               f"cores {tensor:.1f}%, so the job computes in full FP32 precision.")
    fix = ("Use mixed precision: with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16): ... "
           "around the forward pass (and torch.backends.cuda.matmul.allow_tf32 = True)")
    return [_hint("tensor_cores_unused", "warning", message, evidence, fix, savings)]


def _two_metrics(flagged: list[GpuLine], first: str, second: str) -> tuple[float, float, dict[str, Any]]:
    """The mean of two percent metrics over the flagged GPUs, with per-GPU figures as evidence."""
    a = _mean(g.metric(first) or 0.0 for g in flagged)
    b = _mean(g.metric(second) or 0.0 for g in flagged)
    evidence = {
        f"{first}_mean_pct": _pct(a), f"{second}_mean_pct": _pct(b), "gpus_concerned": len(flagged),
        "gpus": [_where(g, **{f"{first}_mean_pct": _pct(g.metric(first) or 0.0),
                              f"{second}_mean_pct": _pct(g.metric(second) or 0.0)}) for g in flagged],
    }
    return a, b, evidence


def _memory_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    flagged = [g for g in report.gpus
               if _m(g, "dram_active") >= p["dram_pct"] and _m(g, "sm_active") < p["sm_pct"]]
    if not flagged:
        return []
    dram, sm, evidence = _two_metrics(flagged, "dram_active", "sm_active")
    message = (f"Memory-bound: DRAM bandwidth was {dram:.1f}% busy while the SMs were active only "
               f"{sm:.1f}%, so the kernels wait on memory, not on compute.")
    fix = ("Raise arithmetic intensity: fuse element-wise ops (torch.compile), use larger batches or "
           "tiles, and keep tensors in bf16 to halve the memory traffic")
    return [_hint("memory_bound", "info", message, evidence, fix, None)]


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
            "mem_peak_gib": _gib(peak), "mem_total_gib": _gib(total),
            "mem_peak_pct": _pct(100 * peak / total), "gpus_concerned": len(gpus),
            "gpus": [_where(g, mem_peak_gib=_gib(g.mem_used_max_bytes or 0.0),
                            mem_total_gib=_gib(g.mem_total_bytes or 0)) for g in gpus],
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
        hints.append(_hint("gpu_memory", severity, message, evidence, fix, None))
    return hints


def _link_bound(rule: str, kind: str, p: dict[str, float], report: JobReport) -> list[Hint]:
    rx, tx = f"{kind}_rx_mbps", f"{kind}_tx_mbps"
    threshold = p[f"{kind}_mbps"]

    def traffic(g: GpuLine) -> float:
        return (g.metric(rx) or 0.0) + (g.metric(tx) or 0.0)

    flagged = [g for g in report.gpus if traffic(g) > threshold and _m(g, "sm_active") < p["sm_pct"]]
    if not flagged:
        return []
    mibs = _mean(traffic(g) for g in flagged)
    sm = _mean(g.metric("sm_active") or 0.0 for g in flagged)
    evidence = {
        f"{kind}_mean_mib_s": round(mibs), "sm_active_mean_pct": _pct(sm), "gpus_concerned": len(flagged),
        "gpus": [_where(g, **{f"{kind}_mean_mib_s": round(traffic(g))},
                        sm_active_mean_pct=_pct(g.metric("sm_active") or 0.0)) for g in flagged],
    }
    if kind == "pcie":
        message = (f"PCIe-bound: {mibs:.0f} MiB/s between host and GPU (received + sent) while the SMs were "
                   f"active only {sm:.1f}%, so the GPU waits on transfers.")
        fix = ("Keep data on the GPU between steps (no per-step .cpu() / .to(\"cuda\") round trips), use "
               "pinned memory (pin_memory=True, .to(device, non_blocking=True)) and fewer, larger transfers")
    else:
        message = (f"NVLink-bound: {mibs:.0f} MiB/s between GPUs (received + sent) while the SMs were "
                   f"active only {sm:.1f}%, so the GPUs wait on each other.")
        fix = ("Communicate less per step: a larger per-GPU batch or gradient accumulation (DDP no_sync()), "
               "overlap the all-reduce with the backward pass (DDP bucket_cap_mb), or fewer GPUs")
    return [_hint(rule, "warning", message, evidence, fix, None)]


def _pcie_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("pcie_bound", "pcie", p, report)


def _nvlink_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("nvlink_bound", "nvlink", p, report)


def _spread_nodes(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.nnodes <= 1 or job.gpus <= 0:
        return []
    per_node = job.gpus / job.nnodes
    if per_node >= p["gpus_per_node"] or job.gpus > p["gpus_per_node"]:
        return []
    evidence = {"nodes": job.nnodes, "gpus_allocated": job.gpus, "gpus_per_node_used": round(per_node, 1),
                "gpus_per_node": p["gpus_per_node"]}
    message = (f"GPUs spread over nodes: {job.gpus} GPUs on {job.nnodes} nodes would fit on one node of "
               f"{p['gpus_per_node']:.0f}, where they talk over NVLink instead of the network.")
    fix = f"#SBATCH --nodes=1 --gres=gpu:{job.gpus}"
    return [_hint("spread_nodes", "info", message, evidence, fix, None)]


def _cpu_side(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.running:
        return []
    hints = []
    gpus = max(1, job.gpus)
    cpus = _cpus_per_gpu(report)
    eff = job.cpu_efficiency
    utils = [g.util_mean for g in report.gpus if g.util_mean is not None]
    if eff is not None and utils and eff > p["cpu_high"] and _mean(utils) < p["gpu_util_low"]:
        util = _mean(utils)
        evidence: dict[str, Any] = {"cpu_efficiency_pct": _pct(eff), "util_mean_pct": _pct(util),
                                    "cpus": job.ncpus, "gpus_allocated": job.gpus}
        message = (f"CPU-bound: the CPUs were {eff:.1f}% busy while the GPUs averaged {util:.1f}%, so the "
                   "CPU side (data loading, preprocessing) cannot keep up.")
        fix = f"#SBATCH --cpus-per-gpu={2 * cpus}, with DataLoader(num_workers={2 * cpus - 1})"
        hints.append(_hint("cpu_side", "warning", message, evidence, fix, None))
    starving = bool(utils) and _mean(utils) < p["gpu_util_low"]  # then more workers need those CPUs
    if eff is not None and eff < p["cpu_low"] and job.ncpus > 2 * gpus and not starving:
        used = job.ncpus * eff / 100
        wanted = max(2, math.ceil(2 * used / gpus))
        if wanted * gpus < job.ncpus:
            evidence = {"cpu_efficiency_pct": _pct(eff), "cpus": job.ncpus, "cpu_cores_used": round(used, 1),
                        "gpus_allocated": job.gpus,
                        "cpu_core_hours_saved": round((job.ncpus - wanted * gpus) * _elapsed_h(report), 1)}
            message = (f"Most CPUs unused: {job.ncpus} CPUs allocated, {eff:.1f}% used "
                       f"(about {used:.1f} cores busy).")
            fix = f"#SBATCH --cpus-per-gpu={wanted}"
            hints.append(_hint("cpu_side", "info", message, evidence, fix, None))
    if job.mem_efficiency is not None and job.alloc_mem_bytes and job.max_rss_bytes is not None:
        per_node = job.alloc_mem_bytes / max(1, job.nnodes)  # --mem is per node
        mem_eff = 100 * job.max_rss_bytes / per_node
        # Never below a floor: Slurm samples RSS, so short peaks escape it, and a job
        # squeezed under its real peak dies; the floor is site-tunable.
        target = max(job.max_rss_bytes * 1.25, p["mem_floor_mib"] * MIB)
        text = f"{math.ceil(target / GIB)}G" if target >= GIB else f"{max(1, math.ceil(target / MIB))}M"
        if mem_eff < p["mem_low"] and target < per_node:
            evidence = {"mem_efficiency_pct": _pct(mem_eff), "mem_allocated_gib": _gib(per_node),
                        "mem_peak_gib": _gib(job.max_rss_bytes), "mem_suggested": text}
            message = (f"Memory over-requested: the peak was {job.max_rss_bytes / GIB:.2f} GiB of "
                       f"{per_node / GIB:.2f} GiB allocated per node ({mem_eff:.1f}%).")
            fix = f"#SBATCH --mem={text} (the peak plus 25%, at least {p['mem_floor_mib']:g} MiB)"
            hints.append(_hint("cpu_side", "info", message, evidence, fix, None))
    return hints


def _time_limit(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.state != "COMPLETED" or not job.timelimit_s or job.elapsed_s <= 0:
        return []
    if job.elapsed_s >= p["time_fraction"] * job.timelimit_s:
        return []
    step = 300
    suggested = max(step, math.ceil(job.elapsed_s * p["headroom"] / step) * step)
    if suggested >= job.timelimit_s:
        return []
    evidence = {"elapsed_s": job.elapsed_s, "timelimit_s": job.timelimit_s,
                "time_used_pct": _pct(100 * job.elapsed_s / job.timelimit_s), "suggested_time_s": suggested}
    message = (f"Time limit far above the run time: the job ran {_sbatch_time(job.elapsed_s)} of its "
               f"{_sbatch_time(job.timelimit_s)} limit ({100 * job.elapsed_s / job.timelimit_s:.0f}%); "
               "shorter limits start sooner through backfill.")
    fix = f"#SBATCH --time={_sbatch_time(suggested)}"
    return [_hint("time_limit", "info", message, evidence, fix, None)]


def _short_job(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.state != "COMPLETED" or job.gpus <= 0 or job.elapsed_s >= p["short_s"]:
        return []
    evidence = {"elapsed_s": job.elapsed_s, "short_s": p["short_s"], "gpus_allocated": job.gpus}
    message = (f"Very short GPU job: it ran {job.elapsed_s} s, so starting up and loading cost about as "
               "much as the work itself.")
    fix = (f"Bundle several such runs into one job (loop over the inputs in one script, or several srun "
           f"steps in one allocation) so that each GPU job runs {p['short_s'] / 60:.0f} min or more")
    return [_hint("short_job", "info", message, evidence, fix, None)]


# XIDs that the job's own code usually causes (NVIDIA's XID catalogue): an illegal memory
# access, an MMU fault, a stopped or cleaned-up channel.
APP_XIDS = frozenset({13, 31, 43, 45})
_SLOWDOWNS = {"hw_slowdown": "hardware slowdown", "sw_thermal": "software thermal slowdown",
              "hw_thermal": "hardware thermal slowdown", "power_brake": "power brake"}


def _hardware(report: JobReport, p: dict[str, float]) -> list[Hint]:
    hints = []
    for g in report.gpus:
        s = g.summary
        if s is None:
            continue
        problems, severity = [], "warning"
        throttle = {}
        if s.throttle_s and s.throttle_observed_s:
            for reason, name in _SLOWDOWNS.items():
                share = s.throttle_s.get(reason, 0.0) / s.throttle_observed_s
                if share > p["throttle_fraction"]:
                    throttle[reason] = _pct(100 * share)
                    problems.append(f"{name} {100 * share:.0f}% of the time")
        xids = [int(e["xid"]) for e in s.xid_events if isinstance(e.get("xid"), (int, float))]
        hardware_xids = [x for x in xids if x not in APP_XIDS]
        if xids:
            problems.append("XID " + ", ".join(str(x) for x in sorted(set(xids))))
        if s.ecc_uncorrected:
            problems.append(f"{s.ecc_uncorrected} uncorrected ECC error(s)")
        if s.lost_at is not None:
            problems.append("fell off the bus")
        if not problems:
            continue
        if hardware_xids or s.ecc_uncorrected or s.lost_at is not None:
            severity = "critical"
        evidence = {"node": g.node, "minor": g.minor, "uuid": g.uuid, "throttle_pct": throttle,
                    "xids": xids, "ecc_uncorrected": s.ecc_uncorrected or 0, "lost_at": s.lost_at,
                    "faults": g.hardware_faults}
        if throttle or hardware_xids or s.ecc_uncorrected or s.lost_at is not None:
            message = (f"Node problem for the admins, not your job's fault: {_label(g)} had "
                       f"{'; '.join(problems)}.")
        else:
            message = (f"{_label(g)} reported {problems[0]}: these XIDs usually come from the job's own code "
                       f"(an invalid memory access), and are a node problem only if other jobs on {g.node} "
                       "see them too.")
        fix = (f"Admins: check {_label(g)} (nvidia-smi -q -d PERFORMANCE,ECC,TEMPERATURE; "
               f"dmesg | grep -i xid) and drain {g.node} if it recurs. Users: resubmit; "
               f"'#SBATCH --exclude={g.node}' avoids the node meanwhile")
        hints.append(_hint("hardware", severity, message, evidence, fix, None, audience="admin"))
    return hints


def _idle_stretch(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """A GPU that did work, and also sat idle for one long stretch: its mean hides it."""
    elapsed = report.job.elapsed_s
    found = []
    for g in report.gpus:
        longest = g.summary.idle_longest if g.summary is not None else None
        if longest is None or g.util_mean is None or g.util_mean < p["idle_pct"] or _lost(g):
            continue
        seconds = float(longest.get("seconds") or 0.0)
        if seconds >= 60 * p["min_minutes"] and seconds >= p["min_fraction"] * elapsed:
            found.append((seconds, float(longest.get("from_s") or 0.0), g))
    if not found:
        return []
    found.sort(key=lambda f: -f[0])
    seconds, start, g = found[0]
    more = f" ({len(found) - 1} more GPU(s) likewise)" if len(found) > 1 else ""
    message = (f"{_label(g)} sat idle for {_duration(seconds)} in one stretch, from {_duration(start)} into "
               f"the job, though it averaged {g.util_mean:.0f}%{more}: the job held its GPUs while they "
               "waited.")
    evidence = {"idle_stretch_s": round(seconds), "idle_from_s": round(start), "elapsed_s": elapsed,
                "idle_stretch_pct": _pct(100.0 * seconds / elapsed) if elapsed else None,
                "gpus": [_where(x, idle_stretch_s=round(s), idle_from_s=round(f),
                                util_mean_pct=_pct(x.util_mean or 0)) for s, f, x in found]}
    fix = ("If the GPU work was over, end the job there (run what follows as a CPU job with "
           "'#SBATCH --dependency=afterok:<jobid>'); if it waited on input, a checkpoint or another job, "
           "that wait is the thing to fix")
    return [_hint("idle_stretch", "warning", message, evidence, fix, sum(s for s, _, _ in found) / 3600.0)]


# --- the rules as data ------------------------------------------------------------------------

_PER_GPU = ("gpus_concerned", "gpus")

RULES: tuple[Rule, ...] = (
    Rule(
        "idle_gpus", "Idle GPUs in the allocation",
        "A GPU whose mean utilisation stays under 5% did no useful work: at that level only a "
        "stray kernel ran now and then. Such a GPU is charged to the job and kept from others for "
        "the whole run, so the fix (ask for fewer GPUs) saves its GPU-hours in full. Whether a "
        "process ever opened it tells a script that never used it from code that waited on it. A "
        "job's only GPU is reported when it sat idle, as critical: the job needed no GPU at all.",
        {"idle_pct": 5.0}, ("util",), _idle_gpus,
        evidence=("gpus_allocated", "gpus_idle", "gpus_never_opened", "idle_pct", "elapsed_s", "gpus"),
    ),
    Rule(
        "low_util", "Low utilisation overall",
        "Under 25% mean utilisation (15% for critical) on the GPUs that did work, the job pays for "
        "a GPU it mostly leaves idle. The timeline and histogram tell why: idle stretches at the start "
        "and end covering over 20% of the run mean data staging; time both under 10% and over 50% "
        "(each at least 10% of the run), or repeated switches on the timeline, mean an input pipeline "
        "that starves the GPU; otherwise the work per step is too small. Savings assume the fix brings "
        "utilisation to the 80% target. GPUs under idle_pct are left to idle_gpus.",
        {"red_pct": 15.0, "warn_pct": 25.0, "idle_pct": 5.0, "edge_fraction": 0.2,
         "periodic_fraction": 0.1, "switches": 4.0, "target_pct": 80.0, "min_cpus_per_gpu": 4.0},
        ("util",), _low_util,
        evidence=("util_mean_pct", "gpu_hours_allocated", "pattern", "idle_start_s", "idle_end_s",
                  "idle_edges_pct", "low_time_pct", "high_time_pct", "switches", "target_pct", *_PER_GPU),
    ),
    Rule(
        "idle_stretch", "A long idle stretch in a busy job",
        "A mean hides a GPU that worked for an hour and then sat idle for ten minutes. Each GPU's "
        "longest stretch of polls under 5% utilisation is recorded; one of at least 10 minutes and "
        "10% of the run, on a GPU that did work, is reported with where in the job it was. Savings: "
        "the stretch's GPU-hours, which the job held without using.",
        {"idle_pct": 5.0, "min_minutes": 10.0, "min_fraction": 0.1}, ("util",), _idle_stretch,
        evidence=("idle_stretch_s", "idle_from_s", "elapsed_s", "idle_stretch_pct", "gpus"),
    ),
    Rule(
        "falsely_busy", "Busy but doing little",
        "Utilisation counts the time at least one kernel ran, however small: a GPU can read 100% "
        "with most of its SMs idle. NVIDIA reads SM activity under 50% as ineffective use, so a GPU "
        "at 60% utilisation or more with SM activity under 50% is held up by kernel launches. GPUs "
        "without GPM (before Hopper) measure no SM activity; there, power under 40% of the limit "
        "stands in for it and the message says so, with no savings figure.",
        {"busy_pct": 60.0, "sm_pct": 50.0, "power_fraction": 0.4}, ("util",), _falsely_busy,
        evidence=("util_mean_pct", "sm_active_mean_pct", "power_pct_of_limit", "proxy", *_PER_GPU),
    ),
    Rule(
        "tensor_cores_unused", "Tensor cores unused",
        "A GPU whose FP32 pipes are busy over 20% of the time while its tensor cores stay under 1% "
        "computes in full precision what tensor cores do several times faster in bf16 or TF32. "
        "Every GPU with GPM has tensor cores. The savings figure is rough (half the FP32-busy time) "
        "and the evidence says so.",
        {"fp32_pct": 20.0, "tensor_pct": 1.0}, ("fp32_active", "tensor_active"), _tensor_cores_unused,
        evidence=("fp32_active_mean_pct", "tensor_active_mean_pct", "savings_note", *_PER_GPU),
    ),
    Rule(
        "memory_bound", "Memory-bound kernels",
        "NVIDIA puts the practical peak of DRAM activity near 80%; at 70% or more with SM activity "
        "under 50% the kernels wait on memory. That is sometimes the nature of the work, so this is "
        "information, without a savings figure.",
        {"dram_pct": 70.0, "sm_pct": 50.0}, ("dram_active", "sm_active"), _memory_bound,
        evidence=("dram_active_mean_pct", "sm_active_mean_pct", *_PER_GPU),
    ),
    Rule(
        "gpu_memory", "GPU memory far below or near its total",
        "A job whose peak stays under a quarter of the GPU's memory would fit a smaller GPU or a MIG "
        "slice (asked for with 25% headroom over the peak); at 95% or more the next larger batch or "
        "sequence runs out of memory. Idle GPUs are left to idle_gpus.",
        {"low_fraction": 0.25, "high_fraction": 0.95}, ("mem_used_bytes",), _gpu_memory,
        evidence=("mem_peak_gib", "mem_total_gib", "mem_peak_pct", "mem_needed_gib", *_PER_GPU),
    ),
    Rule(
        "pcie_bound", "Host-device transfers (PCIe)",
        "12000 MiB/s received plus sent is a large share of what a PCIe Gen4 x16 link carries in "
        "practice. With SM activity under 50% at the same time, the GPU waits on copies to and from "
        "the host rather than computing.",
        {"pcie_mbps": 12000.0, "sm_pct": 50.0}, ("pcie_rx_mbps", "pcie_tx_mbps", "sm_active"), _pcie_bound,
        evidence=("pcie_mean_mib_s", "sm_active_mean_pct", *_PER_GPU),
    ),
    Rule(
        "nvlink_bound", "GPU-to-GPU communication (NVLink)",
        "100000 MiB/s of NVLink traffic received plus sent is a large share of a GPU's links. With SM "
        "activity under 50% at the same time, the GPUs spend their time exchanging data (gradients, "
        "activations) rather than computing.",
        {"nvlink_mbps": 100000.0, "sm_pct": 50.0}, ("nvlink_rx_mbps", "nvlink_tx_mbps", "sm_active"),
        _nvlink_bound, evidence=("nvlink_mean_mib_s", "sm_active_mean_pct", *_PER_GPU),
    ),
    Rule(
        "spread_nodes", "GPUs spread over more nodes than needed",
        "GPUs on one node talk over NVLink; across nodes, over the network, which is many times "
        "slower. A multi-node job with no more GPUs in all than one node holds (gpus_per_node, the "
        "site's node size) would run better packed, and leaves whole nodes free for others.",
        {"gpus_per_node": 4.0}, (), _spread_nodes,
        evidence=("nodes", "gpus_allocated", "gpus_per_node_used", "gpus_per_node"),
    ),
    Rule(
        "cpu_side", "The CPU side of a GPU job",
        "CPUs over 90% busy while the GPUs average under 50% mean the CPU work (loading, decoding, "
        "augmenting) is the bottleneck. CPUs under 10% busy on a job with more than two per GPU are "
        "held for nothing, unless the GPUs starve, when more DataLoader workers need them. Memory "
        "(Slurm's peak RSS) under 25% of the request is suggested as the peak plus 25%, and only "
        "finished jobs are judged (Slurm has no efficiency figures while a job runs).",
        {"cpu_high": 90.0, "gpu_util_low": 50.0, "cpu_low": 10.0, "mem_low": 25.0,
         "mem_floor_mib": 1024.0}, (), _cpu_side,
        evidence=("cpu_efficiency_pct", "util_mean_pct", "cpus", "gpus_allocated", "cpu_cores_used",
                  "cpu_core_hours_saved", "mem_efficiency_pct", "mem_allocated_gib", "mem_peak_gib",
                  "mem_suggested"),
    ),
    Rule(
        "time_limit", "Time limit far above the run time",
        "A job that used under a quarter of its time limit asked for far more than it needed; "
        "shorter limits let the scheduler backfill the job sooner. The suggestion is the run time "
        "times 1.5 (headroom), rounded up to 5 minutes. Completed jobs only: a failed run says "
        "nothing about how long the work takes.",
        {"time_fraction": 0.25, "headroom": 1.5}, (), _time_limit,
        evidence=("elapsed_s", "timelimit_s", "time_used_pct", "suggested_time_s"),
    ),
    Rule(
        "short_job", "Job too short to be worth a GPU",
        "Under 5 minutes, starting Python, loading libraries and data and warming the GPU up cost as "
        "much as the work itself, and the scheduler's overhead per job weighs more. Completed jobs "
        "only.",
        {"short_s": 300.0}, (), _short_job, evidence=("elapsed_s", "short_s", "gpus_allocated"),
    ),
    Rule(
        "hardware", "Hardware problems (for the admins)",
        "Clock slowdowns for hardware or thermal reasons or a power brake over 5% of the time, XID "
        "errors, uncorrected ECC errors and a GPU lost from the bus are the node's problem, not the "
        "user's: they go to the admins, are left out of the user's verdict, and a lost GPU is left "
        "out of the idle and utilisation rules. Power-cap slowdown is normal under load and is not "
        "flagged. XIDs 13, 31, 43 and 45 usually come from the job's own code, so they alone are a "
        "warning, not critical.",
        {"throttle_fraction": 0.05}, (), _hardware, audience="admin",
        evidence=("node", "minor", "uuid", "throttle_pct", "xids", "ecc_uncorrected", "lost_at", "faults"),
    ),
)
RULE_BY_ID = {rule.id: rule for rule in RULES}


# --- site settings ----------------------------------------------------------------------------

_FORMAT_SPEC = re.compile(r"[,_]?(\.\d{1,2})?[dfg%]?")


def render_message(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{name}` and `{name:.1f}` from `values`; anything else (unknown names, attribute
    or index access, conversions, nested or wide specs) stays as written. Never evaluates."""
    out = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        raw = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        plain = name.isidentifier() and name in values and not conversion
        if not plain or not _FORMAT_SPEC.fullmatch(spec or ""):
            out.append(raw)
            continue
        try:
            out.append(format(values[name], spec or ""))
        except (TypeError, ValueError):
            out.append(raw)
    return "".join(out)


@dataclass(frozen=True)
class HintSettings:
    """What a site's [hints] section changes; the defaults change nothing."""

    disabled: frozenset[str] = frozenset()
    params: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    messages: Mapping[str, str] = field(default_factory=dict)
    links: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, raw: Mapping[str, str]) -> HintSettings:
        """Parse Config.hints; raises ConfigError naming the key at fault."""
        disabled: set[str] = set()
        params: dict[str, dict[str, float]] = {}
        messages: dict[str, str] = {}
        links: dict[str, str] = {}
        known = ", ".join(RULE_BY_ID)
        for key, text in raw.items():
            key, text = key.strip().lower(), text.strip()
            where = f"[hints] {key}"
            if key == "disable":
                for name in filter(None, re.split(r"[\s,]+", text)):
                    if name not in RULE_BY_ID:
                        raise ConfigError(f"{where}: unknown rule {name!r} (rules: {known})")
                    disabled.add(name)
                continue
            rule_id, dot, attr = key.partition(".")
            if not dot:
                raise ConfigError(f"{where}: unknown setting (expected disable, <rule>.<threshold>, "
                                  "<rule>.message or <rule>.link)")
            rule = RULE_BY_ID.get(rule_id)
            if rule is None:
                raise ConfigError(f"{where}: unknown rule {rule_id!r} (rules: {known})")
            if attr == "message":
                try:
                    list(string.Formatter().parse(text))
                except ValueError as exc:
                    raise ConfigError(f"{where}: not a message template: {exc}") from exc
                if not text:
                    raise ConfigError(f"{where}: empty message")
                messages[rule_id] = text
            elif attr == "link":
                if not re.fullmatch(r"https?://[^\s<>\"']+", text):
                    raise ConfigError(f"{where} = {text!r}: expected an http:// or https:// address")
                links[rule_id] = text
            elif attr in rule.params:
                try:
                    value = float(text)
                except ValueError as exc:
                    raise ConfigError(f"{where} = {text!r} is not a number") from exc
                if not math.isfinite(value) or value < 0:
                    raise ConfigError(f"{where} = {text!r}: expected a finite number >= 0")
                params.setdefault(rule_id, {})[attr] = value
            else:
                raise ConfigError(f"{where}: rule {rule_id} has no setting {attr!r} (it has: "
                                  f"{', '.join([*rule.params, 'message', 'link'])})")
        return cls(frozenset(disabled), params, messages, links)

    def params_for(self, rule: Rule) -> dict[str, float]:
        return {**rule.params, **self.params.get(rule.id, {})}

    def apply(self, hint: Hint) -> Hint:
        """The site's wording and link for a hint of ours."""
        template = self.messages.get(hint.id)
        message = hint.message
        if template is not None:
            message = render_message(template, {**hint.evidence, "savings_gpu_hours": hint.savings_gpu_hours})
        return replace(hint, message=message, link=self.links.get(hint.id, hint.link))


def evaluate(report: JobReport, settings: HintSettings | None = None) -> list[Hint]:
    """Every enabled rule's hints for the job: critical first, then by GPU-hours saved."""
    settings = settings or HintSettings()
    found: list[tuple[int, Hint]] = []
    for order, rule in enumerate(RULES):
        if rule.id in settings.disabled:
            continue
        gpus = [g for g in report.gpus if all(g.metric(name) is not None for name in rule.needs)]
        if rule.needs and not gpus:
            continue
        view = report if len(gpus) == len(report.gpus) else replace(report, gpus=gpus)
        found.extend((order, settings.apply(h)) for h in rule.check(view, settings.params_for(rule)))
    found.sort(key=lambda item: (_RANK[item[1].severity], item[1].savings_gpu_hours is None,
                                 -(item[1].savings_gpu_hours or 0.0), item[0]))
    return [hint for _, hint in found]


def verdict(report: JobReport, hints: list[Hint]) -> str:
    """One line a new user understands, from the user's hints only (hardware is the site's)."""
    user = sorted((h for h in hints if h.audience == "user"), key=lambda h: _RANK[h.severity])
    admin = [h for h in hints if h.audience != "user"]
    so_far = " so far" if report.job.running else ""
    serious = [h for h in user if h.severity != "info"]
    if serious:
        label = "Poor" if serious[0].severity == "critical" else "Needs attention"
        head = serious[0].message.split(": ", 1)[0].rstrip(".")
        more = len(serious) - 1
        more_text = f" (and {more} more finding{'s' if more > 1 else ''})" if more else ""
        text = f"{label}{so_far}: {head}{more_text}; see the hints below."
    else:
        utils = [g.util_mean for g in report.gpus if g.util_mean is not None and not _lost(g)]
        util = _mean(utils) if utils else None
        if util is None and not any(g.summary is not None and g.summary.samples for g in report.gpus):
            # no sampler figures at all (its prolog did not run, the spool was lost): no verdict
            text = f"No verdict{so_far}: the GPU figures are missing (see the notes)."
        elif util is None:
            text = (f"No problems found{so_far}; GPU utilisation was not measured on these GPUs "
                    "(MIG slices do not report it).")
        else:
            # Below the bar of a well-used GPU, no rule fired, but "Good" would overstate it.
            label = "Good" if util >= GOOD_UTIL_PCT else "Fair"
            text = f"{label}{so_far}: the GPUs were busy {util:.0f}% of the time."
        if user:
            text += f" {len(user)} suggestion{'s' if len(user) > 1 else ''} below."
    if admin:
        nodes = ", ".join(sorted({str(h.evidence.get("node", "?")) for h in admin}))
        text += (f" A hardware problem on {nodes} was flagged for the admins; it does not count "
                 "against this job.")
    return text


# --- docs/hints.md ------------------------------------------------------------------------------


def rules_markdown() -> str:
    """docs/hints.md: every rule with its id, thresholds, needs and why (scripts/gen_hints_doc.py)."""
    lines = [
        "# Tuning hints",
        "",
        "<!-- Generated from slurm_gpu_eff/hints.py by scripts/gen_hints_doc.py: do not edit. -->",
        "",
        "Every `gpueff` report ends with hints: a finding in one sentence, the measured figures",
        "behind it (`evidence`), the `#SBATCH` line or code change to make (`fix`) and the",
        "GPU-hours it would have saved on this job (`savings_gpu_hours`, absent when it cannot be",
        "said). A rule never speaks from a metric that was not measured: a GPU on which a metric",
        "the rule needs was not measured (MIG slices have no utilisation; GPUs before Hopper have",
        "no GPM, so no SM activity, pipes, DRAM or PCIe figures) is left out of that rule.",
        "Hardware problems go to the admins and are left out of the user's verdict.",
        "",
        "## Site settings",
        "",
        "In the `[hints]` section of the config file. Thresholds are numbers; a message replaces",
        "the rule's wording and may name the hint's evidence figures (and `savings_gpu_hours`) in",
        "braces, optionally with a format such as `:.0f`; anything else in braces is printed as",
        "written, never evaluated. Links must be http(s) addresses.",
        "",
        "```toml",
        "[hints]",
        'disable = ["short_job", "time_limit"]',
        "low_util.warn_pct = 30",
        'low_util.message = "Your GPUs were busy only {util_mean_pct:.0f}% of the time."',
        'low_util.link = "https://hpc.example.org/docs/gpu-efficiency"',
        "```",
        "",
        "| id | title | audience | needs |",
        "|---|---|---|---|",
    ]
    for rule in RULES:
        needs = ", ".join(f"`{n}`" for n in rule.needs) or "-"
        lines.append(f"| [`{rule.id}`](#{rule.id}) | {rule.title} | {rule.audience} | {needs} |")
    for rule in RULES:
        lines += ["", f"## {rule.id}", "", f"**{rule.title}** (audience: {rule.audience}; needs: "
                  + (", ".join(f"`{n}`" for n in rule.needs) or "no particular metric") + ")",
                  "", rule.why, "", "| setting | default |", "|---|---|"]
        lines += [f"| `{rule.id}.{name}` | {value:g} |" for name, value in rule.params.items()]
        if rule.evidence:
            keys = ", ".join(f"`{k}`" for k in rule.evidence)
            lines += ["", f"Evidence (message placeholders): {keys}."]
    return "\n".join(lines) + "\n"
