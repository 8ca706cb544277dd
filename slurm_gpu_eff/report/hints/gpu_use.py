"""Whether the job's GPUs did work at all: idle GPUs and MIG slices, low utilisation,
idle stretches, idle interactive sessions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import (
    CAP_UNKNOWN,
    GIB,
    NSYS,
    PER_GPU,
    USE_THE_GPU,
    USE_THE_GPU_NEUTRAL,
    Rule,
    by_utilisation_alone,
    cores_cap,
    cpus_per_gpu,
    duration,
    elapsed_h,
    estimated,
    fitted,
    gib,
    gpus_word,
    hint,
    interactive,
    label,
    lost,
    mean,
    measured,
    mem_peak,
    pct,
    sm,
    used,
    where,
)

# Where idle GPUs hold memory, fewer GPUs may not hold the model: say what to check instead.
SHARDING = {
    "pytorch": (" (how the model is placed: device_map or manual .to() per part; DDP runs one process "
                "per GPU)"),
    "tensorflow": " (TensorFlow takes memory on every GPU it sees: set CUDA_VISIBLE_DEVICES or "
                  "tf.config.set_visible_devices to those it uses)",
    "jax": " (JAX preallocates on every device it sees: check that the mesh and sharding cover them all)",
}


def _fewer_gpus_fix(report: JobReport, idle: list[GpuLine], n: int) -> str:
    job, k = report.job, len(idle)
    if job.nnodes <= 1:
        return f"#SBATCH --gres=gpu:{n - k}"
    per_node = Counter(g.node for g in idle)
    if n % job.nnodes == 0 and len(per_node) == job.nnodes and len(set(per_node.values())) == 1:
        return (f"#SBATCH --gres=gpu:{n // job.nnodes - k // job.nnodes} "
                f"(per node: --gres counts the GPUs on each of the {job.nnodes} nodes)")
    return f"#SBATCH --gpus={n - k} (the job's GPUs over all its nodes) instead of a per-node --gres=gpu:..."


def _idle_gpus(report: JobReport, p: dict[str, float]) -> list[Hint]:
    if interactive(report):  # a session's idle GPUs: idle_interactive says what to do
        return []
    job = report.job
    idle = [g for g in report.gpus
            if g.util_mean is not None and g.util_mean < p["idle_pct"] and not lost(g)]
    n, k = max(job.gpus, len(report.gpus)), len(idle)
    if not idle or (n == 1 and k < n):
        return []
    # Memory not measured may hold a model's part as well: no fewer GPUs on a guess.
    holding = [g for g in idle if g.mem_used_max_bytes is None or mem_peak(g) >= p["held_gib"] * GIB]
    details, per_gpu = [], []
    for g in idle:
        opened = None if g.summary is None or g.summary.processes_max is None else not g.never_used
        state = {True: "was opened but stayed idle", False: "was never opened by the job",
                 None: "stayed idle"}[opened]
        held = "" if g not in holding else (", memory not measured" if g.mem_used_max_bytes is None
                                            else f", holding {mem_peak(g) / GIB:.1f} GiB")
        details.append(f"{label(g)} {state} ({g.util_mean:.1f}%{held})")
        per_gpu.append(where(g, util_mean_pct=pct(g.util_mean or 0.0), opened=opened,
                             mem_peak_gib=None if g.mem_used_max_bytes is None else gib(mem_peak(g))))
    evidence = {
        "gpus_allocated": n, "gpus_idle": k, "gpus_holding_memory": len(holding),
        "gpus_never_opened": sum(1 for e in per_gpu if e["opened"] is False),
        "idle_pct": p["idle_pct"], "elapsed_s": job.elapsed_s, "gpus": per_gpu,
    }
    savings = measured(k * elapsed_h(report), "the idle GPUs' hours in the allocation, each measured "
                       f"under {p['idle_pct']:g}% utilisation")
    if k == n:
        head = "The GPU sat idle" if n == 1 else f"All {n} GPUs sat idle"
        if holding:  # memory taken, no kernels: a hang or a wait, not a job that needs no GPU
            fix = ("Find where the job waited before running it again (its output; py-spy dump or a "
                   "debugger on the process): it took GPU memory but ran no kernels")
        else:
            fix = ("Run it as a CPU job (drop the '#SBATCH --gres=gpu:...' line), or make the code use "
                   "the GPU: " + fitted(report, USE_THE_GPU, USE_THE_GPU_NEUTRAL))
        return [hint("idle_gpus", "critical", f"{head}: {'; '.join(details)}.", evidence, fix, savings)]
    message = f"{k} of {n} GPUs sat idle: {'; '.join(details)}."
    if holding:
        fix = ("Check the sharding before asking for fewer GPUs: the idle GPUs hold memory (or it was not "
               "measured), so parts of the model or its data may live there" + fitted(report, SHARDING, "")
               + "; fewer GPUs may then not hold it")
    else:
        fix = _fewer_gpus_fix(report, idle, n)
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


def _feed_fix(report: JobReport, p: dict[str, float]) -> str:
    """What keeps a GPU fed between busy phases, in the job's own framework."""
    cpus, cap = cpus_per_gpu(report), cores_cap(report)
    least = int(p["min_cpus_per_gpu"])
    wanted = max(cpus, least if cap is None else min(least, cap))
    torch = (f"DataLoader(..., num_workers={max(1, wanted - 1)}, pin_memory=True, prefetch_factor=4, "
             "persistent_workers=True)")
    if wanted > cpus:
        torch += (f", with '#SBATCH --cpus-per-gpu={wanted}' for the workers"
                  + (CAP_UNKNOWN if cap is None else ""))
    return fitted(report, {
        "pytorch": torch + "; and keep evaluation and checkpoints short or less frequent",
        "tensorflow": ("tf.data: dataset.map(..., num_parallel_calls=tf.data.AUTOTUNE)"
                       ".prefetch(tf.data.AUTOTUNE); and keep evaluation and checkpoints short"),
        "jax": ("Load batches in worker processes (grain, or tf.data with AUTOTUNE) and put the next "
                "batch on the device (jax.device_put) while the step runs"),
    }, "Find what the GPU waits on between its busy phases (input, host-side work, evaluation, "
       "checkpoints): " + NSYS)


def _low_util(report: JobReport, p: dict[str, float]) -> list[Hint]:
    gpus = used(report, p)
    if not gpus or interactive(report):
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
    sms = [s for s in (sm(g) for g in gpus) if s is not None]
    evidence: dict[str, Any] = {
        "util_mean_pct": pct(util), "gpus_concerned": len(gpus), "gpu_hours_allocated": round(alloc_h, 3),
        "pattern": pattern, **extra,
        "gpus": [where(g, util_mean_pct=pct(g.util_mean or 0.0), pattern=name)
                 for g, (name, _) in zip(gpus, patterns, strict=True)],
    }
    if len(sms) == len(gpus):
        evidence["sm_active_mean_pct"] = pct(mean(sms))
    head = f"Low GPU utilisation ({util:.1f}%)"
    if pattern == "idle_edges":
        message = (f"{head}: the {gpus_word(len(gpus))} sat idle for the first "
                   f"{duration(extra['idle_start_s'])} and the last {duration(extra['idle_end_s'])} "
                   f"({extra['idle_edges_pct']:.0f}% of the run): loading or saving (data, model, "
                   "checkpoints) outside the GPU's work.")
        fix = ("Do the preparation and the post-processing apart from the GPU job: in a CPU job that "
               "writes to shared storage, with this one started after it by '#SBATCH "
               "--dependency=afterok:<CPU job id>' (not node-local /tmp: it is private to each job and "
               "deleted at its end); or overlap the loading with the GPU's work")
    elif pattern == "periodic":
        if "low_time_pct" in extra:
            shape = (f"{extra['low_time_pct']:.0f}% of the time under 10% and "
                     f"{extra['high_time_pct']:.0f}% over 50%")
        else:
            shape = f"{extra['switches']:.0f} switches between idle and busy"
        message = (f"{head}: busy and idle phases alternate ({shape}): the GPU waits between phases, on "
                   "input, host-side work, evaluation or checkpoints.")
        fix = _feed_fix(report, p)
    else:
        message = (f"{head}: steadily low: too little work per step for this GPU, or waits between "
                   "its kernels.")
        fix = ("Give each GPU more work (a larger batch or problem per GPU) and find what it waits on: "
               + NSYS)
    savings = estimated(alloc_h * (1 - util / 100), "the time no kernel ran (100% minus utilisation) on "
                        "the GPUs concerned: a bound, reached only if the same work filled the busy time")
    return [hint("low_util", severity, message + by_utilisation_alone(gpus), evidence, fix, savings)]


def _idle_stretch(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """A GPU that did work, and also sat idle for one long stretch: its mean hides it."""
    if interactive(report):
        return []
    elapsed = report.job.elapsed_s
    found = []
    for g in used(report, p):
        longest = g.summary.idle_longest if g.summary is not None else None
        if longest is None:
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
    savings = measured(sum(s for s, _, _ in found) / 3600.0, f"each GPU's longest stretch under "
                       f"{p['idle_pct']:g}% utilisation, measured, once per GPU that did work")
    return [hint("idle_stretch", "warning", message, evidence, fix, savings)]


def _idle_mig(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """MIG slices report no utilisation, but GPM measures their SM activity."""
    slices = [g for g in report.gpus if g.summary is not None and g.summary.mig_gi_id is not None
              and g.util_mean is None and not lost(g)]
    idle = [g for g in slices if (sm(g) or 0.0) < p["sm_idle_pct"]]
    if not idle or interactive(report):
        return []
    n, k = max(report.job.gpus, len(slices)), len(idle)
    holding = [g for g in idle if mem_peak(g) >= p["held_gib"] * GIB]
    evidence = {"slices_allocated": n, "slices_idle": k, "sm_idle_pct": p["sm_idle_pct"],
                "slice_hours_idle": round(k * elapsed_h(report), 3),
                "gpus": [where(g, sm_active_mean_pct=pct(sm(g) or 0.0), mem_peak_gib=gib(mem_peak(g)))
                         for g in idle]}
    names = "; ".join(f"{label(g)} at {sm(g) or 0.0:.1f}% SM activity" for g in idle)
    message = (f"{'The MIG slice' if n == 1 else f'{k} of {n} MIG slices'} sat idle: {names} (measured by "
               "GPM: MIG slices report no utilisation).")
    if k == n and not holding:
        fix = ("Run it as a CPU job (drop the '#SBATCH --gres=gpu:...' line), or make the code use the "
               "slice: " + fitted(report, USE_THE_GPU, USE_THE_GPU_NEUTRAL))
    elif holding:
        fix = ("Check where the job waited, or how its work is placed over the slices: the idle slices "
               "hold memory but ran no kernels")
    else:
        fix = f"#SBATCH --gres=gpu:<slice type>:{n - k}"
    return [hint("idle_mig", "critical" if k == n else "warning", message, evidence, fix, None)]


def _idle_interactive(report: JobReport, p: dict[str, float]) -> list[Hint]:
    if not interactive(report):
        return []
    gpus = [g for g in report.gpus if g.summary is not None and g.summary.idle_s is not None
            and g.sampled_s > 0 and not lost(g)]
    if not gpus:
        return []
    idle_s = sum(g.summary.idle_s or 0.0 for g in gpus if g.summary is not None)
    share = idle_s / sum(g.sampled_s for g in gpus)
    if share < p["idle_fraction"] or idle_s / len(gpus) < 60 * p["min_minutes"]:
        return []
    evidence = {"idle_time_pct": pct(100 * share), "idle_gpu_hours": round(idle_s / 3600, 3),
                "elapsed_s": report.job.elapsed_s, "gpus_concerned": len(gpus)}
    message = (f"Interactive session mostly idle: its {gpus_word(len(gpus))} sat idle {100 * share:.0f}% "
               f"of the time ({duration(idle_s / len(gpus))} each), held from other users.")
    fix = ("End the session when you are done (exit, or scancel <jobid>) and ask for the time you will "
           "use (salloc --time=...); run long work as a batch job (sbatch), which frees the GPUs when it "
           "ends")
    savings = measured(idle_s / 3600, "the GPUs' measured time under 5% utilisation in the session")
    return [hint("idle_interactive", "warning", message, evidence, fix, savings)]


RULES: tuple[Rule, ...] = (
    Rule(
        "idle_gpus", "Idle GPUs in the allocation",
        "A GPU under 5% mean utilisation ran a kernel at most one moment in twenty (NVML counts any "
        "kernel, however small), so it did no useful work; its GPU-hours are measured idle. Fewer "
        "GPUs are advised only when the idle ones hold under 2 GiB (ours: a CUDA context, not a "
        "model): with more, parts of the model may live there, and the hint says to check the "
        "sharding. Interactive sessions are idle_interactive's.",
        {"idle_pct": 5.0, "held_gib": 2.0}, ("util",), _idle_gpus,
        evidence=("gpus_allocated", "gpus_idle", "gpus_holding_memory", "gpus_never_opened", "idle_pct",
                  "elapsed_s", "gpus"),
    ),
    Rule(
        "low_util", "Low utilisation overall",
        "Princeton's jobstats alarms at 25% and 15% mean utilisation; we warn under 25% and call it "
        "critical under 15%, on the GPUs that did work (5% or more: idle_gpus' line). The timeline "
        "tells idle edges (over 20% of the run: loading or saving), alternating phases (each at least "
        "10% of the run, or 4 switches: the GPU waits between phases) and steady low use (ours, from "
        "the timeline's shape); the fix is the job's framework's (PyTorch's asks for 4 cores per GPU "
        "at least, ours, never beyond the node's share), else neutral with Nsight Systems. Savings are an "
        "estimate: the time no kernel ran, an upper bound.",
        {"red_pct": 15.0, "warn_pct": 25.0, "idle_pct": 5.0, "edge_fraction": 0.2,
         "periodic_fraction": 0.1, "switches": 4.0, "min_cpus_per_gpu": 4.0},
        ("util",), _low_util,
        evidence=("util_mean_pct", "sm_active_mean_pct", "gpu_hours_allocated", "pattern", "idle_start_s",
                  "idle_end_s", "idle_edges_pct", "low_time_pct", "high_time_pct", "switches", *PER_GPU),
    ),
    Rule(
        "idle_stretch", "A long idle stretch in a busy job",
        "A mean hides a GPU that worked for an hour and then sat idle for ten minutes. Each GPU's "
        "longest stretch under 5% utilisation is recorded; one of at least 10 minutes and 10% of the "
        "run (ours), on a GPU that did work, is reported with where in the job it was. Savings: the "
        "stretches' GPU-hours, measured, once per GPU.",
        {"idle_pct": 5.0, "min_minutes": 10.0, "min_fraction": 0.1}, ("util",), _idle_stretch,
        evidence=("idle_stretch_s", "idle_from_s", "elapsed_s", "idle_stretch_pct", "gpus"),
    ),
    Rule(
        "idle_mig", "Idle MIG slices",
        "MIG slices report no utilisation through NVML, but GPM measures their SM activity "
        "(nvmlGpmMigSampleGet). A slice under 5% SM activity (ours, the idle line of whole GPUs) did "
        "no useful work; one holding 2 GiB or more (ours, as idle_gpus) is told to check where the "
        "job waited, not to drop it. A slice is a fraction of a GPU, so no GPU-hours are claimed.",
        {"sm_idle_pct": 5.0, "held_gib": 2.0}, ("sm_active",), _idle_mig,
        evidence=("slices_allocated", "slices_idle", "sm_idle_pct", "slice_hours_idle", "gpus"),
    ),
    Rule(
        "idle_interactive", "An idle interactive session",
        "An interactive session (no batch step, as Slurm records it) whose GPUs sat under 5% "
        "utilisation half its time or more, and 30 minutes or more per GPU (ours), held them from "
        "others while nobody used them. Savings: that idle time, measured.",
        {"idle_fraction": 0.5, "min_minutes": 30.0}, ("util",), _idle_interactive,
        evidence=("idle_time_pct", "idle_gpu_hours", "elapsed_s", "gpus_concerned"),
    ),
)
