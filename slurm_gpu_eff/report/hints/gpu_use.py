"""Whether the job's GPUs did work: idle GPUs, low utilisation, idle stretches, busy GPUs doing little."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import (
    PER_GPU,
    Rule,
    cpus_per_gpu,
    duration,
    elapsed_h,
    gpu_h,
    gpus_word,
    hint,
    label,
    labels,
    lost,
    mean,
    pct,
    where,
)


def _idle_gpus(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    idle = [g for g in report.gpus
            if g.util_mean is not None and g.util_mean < p["idle_pct"] and not lost(g)]
    n, k = max(job.gpus, len(report.gpus)), len(idle)
    if not idle or (n == 1 and k < n):
        return []
    per_gpu = []
    details = []
    for g in idle:
        opened = None if g.summary is None or g.summary.processes_max is None else not g.never_used
        state = {True: "was opened but stayed idle", False: "was never opened by any process",
                 None: "stayed idle"}[opened]
        details.append(f"{label(g)} {state} ({g.util_mean:.1f}%)")
        per_gpu.append(where(g, util_mean_pct=pct(g.util_mean or 0.0), opened=opened))
    evidence = {
        "gpus_allocated": n, "gpus_idle": k,
        "gpus_never_opened": sum(1 for e in per_gpu if e["opened"] is False),
        "idle_pct": p["idle_pct"], "elapsed_s": job.elapsed_s, "gpus": per_gpu,
    }
    savings = k * elapsed_h(report)
    if k == n:
        head = "The GPU sat idle" if n == 1 else f"All {n} GPUs sat idle"
        fix = ("Run it as a CPU job (drop the '#SBATCH --gres=gpu:...' line), or make the code use "
               "the GPU: check that torch.cuda.is_available() is True inside the job")
        return [hint("idle_gpus", "critical", f"{head}: {'; '.join(details)}.", evidence, fix, savings)]
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
    return [hint("idle_gpus", "warning", message, evidence, fix, savings)]


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
                                  "idle_end_s": round(trail * bucket_s), "idle_edges_pct": pct(100 * share)}
    hist = g.summary.util_histogram_s if g.summary is not None else None
    total = sum(hist) if hist else 0.0
    if hist and total > 0:
        low, high = hist[0] / total, sum(hist[5:]) / total
        if low >= p["periodic_fraction"] and high >= p["periodic_fraction"]:
            return "periodic", {"low_time_pct": pct(100 * low), "high_time_pct": pct(100 * high)}
    states = [u < 10 for u in points if u < 10 or u > 50]
    switches = sum(1 for a, b in zip(states, states[1:], strict=False) if a != b)
    if switches >= p["switches"]:
        return "periodic", {"switches": switches}
    return "steady", {}


def _low_util(report: JobReport, p: dict[str, float]) -> list[Hint]:
    gpus = [g for g in report.gpus
            if g.util_mean is not None and g.util_mean >= p["idle_pct"] and not lost(g)]
    if not gpus:
        return []
    util = mean(g.util_mean or 0.0 for g in gpus)
    if util >= p["warn_pct"]:
        return []
    severity = "critical" if util < p["red_pct"] else "warning"
    patterns = [_pattern(g, p) for g in gpus]
    counts = Counter(name for name, _ in patterns)
    order = ("idle_edges", "periodic", "steady")
    pattern = max(order, key=lambda name: (counts[name], -order.index(name)))
    figures = [f for name, f in patterns if name == pattern]
    extra = {key: round(mean(f[key] for f in figures), 1) for key in figures[0]}
    alloc_h = len(gpus) * elapsed_h(report)
    evidence: dict[str, Any] = {
        "util_mean_pct": pct(util), "gpus_concerned": len(gpus), "gpu_hours_allocated": gpu_h(alloc_h),
        "pattern": pattern, **extra, "target_pct": p["target_pct"],
        "gpus": [where(g, util_mean_pct=pct(g.util_mean or 0.0), pattern=name)
                 for g, (name, _) in zip(gpus, patterns, strict=True)],
    }
    head = f"Low GPU utilisation ({util:.1f}%)"
    if pattern == "idle_edges":
        message = (f"{head}: the {gpus_word(len(gpus))} sat idle for the first "
                   f"{duration(extra['idle_start_s'])} and the last {duration(extra['idle_end_s'])} "
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
        cpus = cpus_per_gpu(report)
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
    return [hint("low_util", severity, message, evidence, fix, savings)]


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
    util = mean(g.util_mean or 0.0 for g in flagged)
    evidence: dict[str, Any] = {"util_mean_pct": pct(util), "gpus_concerned": len(flagged),
                                "proxy": "sm_active" if by_sm else "power"}
    gpus = [where(g, util_mean_pct=pct(g.util_mean or 0.0), sm_active_mean_pct=pct(g.metric("sm_active")
                   or 0.0)) for g in by_sm]
    gpus += [where(g, util_mean_pct=pct(g.util_mean or 0.0),
                    power_pct_of_limit=pct(100 * (g.power_mean_w or 0.0) / (g.power_limit_w or 1.0)))
             for g in by_power]
    head = "GPUs busy but doing little" if len(flagged) > 1 else "GPU busy but doing little"
    savings = None
    if by_sm:
        sm = mean(g.metric("sm_active") or 0.0 for g in by_sm)
        evidence["sm_active_mean_pct"] = pct(sm)
        message = (f"{head}: utilisation {util:.1f}% but SM activity only {sm:.1f}%, so its kernels are "
                   "too small to fill the GPU (launch overhead).")
        savings = sum(elapsed_h(report) * (1 - (g.metric("sm_active") or 0.0) / (g.util_mean or 1.0))
                      for g in by_sm)
    if by_power:
        power = mean(100 * (g.power_mean_w or 0.0) / (g.power_limit_w or 1.0) for g in by_power)
        evidence["power_pct_of_limit"] = pct(power)
        if not by_sm:
            message = (f"{head}: utilisation {util:.1f}% but power draw only {power:.1f}% of the limit "
                       "(power is the proxy: these GPUs do not measure SM activity), so its kernels are "
                       "likely too small to fill the GPU.")
        else:
            message = message[:-1] + f" ({labels(by_power)}: judged by power, {power:.1f}% of the limit)."
    evidence["gpus"] = gpus
    fix = ("Cut kernel-launch overhead: capture the step in CUDA graphs "
           "(torch.compile(model, mode=\"reduce-overhead\")), use larger batches, fuse small kernels "
           "(torch.compile)")
    return [hint("falsely_busy", "warning", message, evidence, fix, savings)]


def _idle_stretch(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """A GPU that did work, and also sat idle for one long stretch: its mean hides it."""
    elapsed = report.job.elapsed_s
    found = []
    for g in report.gpus:
        longest = g.summary.idle_longest if g.summary is not None else None
        if longest is None or g.util_mean is None or g.util_mean < p["idle_pct"] or lost(g):
            continue
        seconds = float(longest.get("seconds") or 0.0)
        if seconds >= 60 * p["min_minutes"] and seconds >= p["min_fraction"] * elapsed:
            found.append((seconds, float(longest.get("from_s") or 0.0), g))
    if not found:
        return []
    found.sort(key=lambda f: -f[0])
    seconds, start, g = found[0]
    more = f" ({len(found) - 1} more GPU(s) likewise)" if len(found) > 1 else ""
    message = (f"{label(g)} sat idle for {duration(seconds)} in one stretch, from {duration(start)} into "
               f"the job, though it averaged {g.util_mean:.0f}%{more}: the job held its GPUs while they "
               "waited.")
    evidence = {"idle_stretch_s": round(seconds), "idle_from_s": round(start), "elapsed_s": elapsed,
                "idle_stretch_pct": pct(100.0 * seconds / elapsed) if elapsed else None,
                "gpus": [where(x, idle_stretch_s=round(s), idle_from_s=round(f),
                                util_mean_pct=pct(x.util_mean or 0)) for s, f, x in found]}
    fix = ("If the GPU work was over, end the job there (run what follows as a CPU job with "
           "'#SBATCH --dependency=afterok:<jobid>'); if it waited on input, a checkpoint or another job, "
           "that wait is the thing to fix")
    return [hint("idle_stretch", "warning", message, evidence, fix, sum(s for s, _, _ in found) / 3600.0)]


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
                  "idle_edges_pct", "low_time_pct", "high_time_pct", "switches", "target_pct", *PER_GPU),
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
        evidence=("util_mean_pct", "sm_active_mean_pct", "power_pct_of_limit", "proxy", *PER_GPU),
    ),
)
