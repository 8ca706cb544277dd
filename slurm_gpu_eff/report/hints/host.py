"""The CPU and Slurm side: the early-run gate, cores and memory (against the node's
share), input read in the main process, time limit, short jobs."""

from __future__ import annotations

import math
from typing import Any

from ..shapes import Hint, JobReport
from .core import (
    CAP_UNKNOWN,
    GIB,
    MIB,
    Rule,
    by_utilisation_alone,
    cores_cap,
    cpus_per_gpu,
    duration,
    elapsed_h,
    fitted,
    framework,
    gib,
    gpu_use,
    hint,
    node_share,
    pct,
    sbatch_time,
)


def _cpu_side(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.running:
        return []
    hints = []
    gpus = max(1, job.gpus)
    cpus = cpus_per_gpu(report)
    eff = job.cpu_efficiency
    use = gpu_use(report.gpus)
    starving = use is not None and use[0] < p["gpu_util_low"]  # then more workers need those CPUs
    if eff is not None and use is not None and eff > p["cpu_high"] and starving:
        evidence: dict[str, Any] = {"cpu_efficiency_pct": pct(eff), "gpu_use_pct": pct(use[0]),
                                    "gpu_use_basis": use[1], "cpus": job.ncpus, "gpus_allocated": job.gpus}
        message = (f"CPU-bound: the CPUs were {eff:.1f}% busy while the GPUs averaged {use[0]:.1f}% "
                   f"{use[1]}, so the CPU side (data loading, preprocessing) cannot keep up."
                   + by_utilisation_alone(report.gpus))
        hints.append(hint("cpu_side", "warning", message, evidence, _more_cpus_fix(report, cpus), None))
    if eff is not None and eff < p["cpu_low"] and job.ncpus > 2 * gpus and not starving:
        busy = job.ncpus * eff / 100
        wanted = max(2, math.ceil(2 * busy / gpus))
        if wanted * gpus < job.ncpus:
            evidence = {"cpu_efficiency_pct": pct(eff), "cpus": job.ncpus, "cpu_cores_used": round(busy, 1),
                        "gpus_allocated": job.gpus,
                        "cpu_core_hours_saved": round((job.ncpus - wanted * gpus) * elapsed_h(report), 1)}
            message = (f"Most CPUs unused: {job.ncpus} CPUs allocated, {eff:.1f}% used "
                       f"(about {busy:.1f} cores busy).")
            fix = f"#SBATCH --cpus-per-gpu={wanted}"
            hints.append(hint("cpu_side", "info", message, evidence, fix, None))
    memory = _memory(report, p)
    return hints + ([memory] if memory else [])


def _more_cpus_fix(report: JobReport, cpus: int) -> str:
    """More cores per GPU, never beyond the node's share (cores a node has per GPU)."""
    cap = cores_cap(report)
    if cap is not None and cpus >= cap:
        return (f"The job already holds the node's share of cores per GPU ({cap}): lighten the CPU work "
                "instead (preprocess once, ahead of the job; decode on the GPU, e.g. NVIDIA DALI)")
    wanted = 2 * cpus if cap is None else min(2 * cpus, cap)
    fix = f"#SBATCH --cpus-per-gpu={wanted}"
    if framework(report) == "pytorch":
        fix += f", with DataLoader(num_workers={wanted - 1})"
    return fix + (CAP_UNKNOWN if cap is None else "")


def _memory(report: JobReport, p: dict[str, float]) -> Hint | None:
    """--mem from the peak, as Princeton's jobstats: at least max(8 GiB, 1.2 x the peak),
    and only for jobs that completed (a failed or OOM-killed run's peak says nothing)."""
    job = report.job
    if job.state != "COMPLETED" or not job.alloc_mem_bytes or job.max_rss_bytes is None:
        return None
    per_node = job.alloc_mem_bytes / max(1, job.nnodes)  # --mem is per node
    mem_eff = 100 * job.max_rss_bytes / per_node
    # Slurm samples RSS, so short peaks escape it; a job squeezed under its real peak dies.
    target = max(job.max_rss_bytes * p["mem_factor"], p["mem_floor_gib"] * GIB)
    text = f"{math.ceil(target / GIB)}G"
    if mem_eff >= p["mem_low"] or math.ceil(target / GIB) * GIB >= per_node:
        return None
    evidence = {"mem_efficiency_pct": pct(mem_eff), "mem_allocated_gib": gib(per_node),
                "mem_peak_gib": gib(job.max_rss_bytes), "mem_suggested": text}
    message = (f"Memory over-requested: the peak was {job.max_rss_bytes / GIB:.2f} GiB of "
               f"{per_node / GIB:.2f} GiB allocated per node ({mem_eff:.1f}%).")
    fix = (f"#SBATCH --mem={text} ({p['mem_factor']:g} x the peak, at least {p['mem_floor_gib']:g} GiB: "
           "Slurm samples memory, so short peaks escape it)")
    return hint("cpu_side", "info", message, evidence, fix, None)


def _main_loading(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """About one core busy per GPU process, the rest idle, the GPUs under-used: the input
    is read in the main process (Princeton's "serial ratio")."""
    job, eff, use = report.job, report.job.cpu_efficiency, gpu_use(report.gpus)
    gpus = max(1, job.gpus)
    if eff is None or use is None or job.ncpus < p["min_cpus_per_gpu"] * gpus or use[0] >= p["gpu_low"]:
        return []
    per_gpu = job.ncpus * eff / 100 / gpus
    if not p["serial_low"] <= per_gpu <= p["serial_high"]:
        return []
    cpus = cpus_per_gpu(report)
    evidence = {"cpu_efficiency_pct": pct(eff), "cpus": job.ncpus, "gpus_allocated": job.gpus,
                "cores_busy_per_gpu": round(per_gpu, 2), "gpu_use_pct": pct(use[0]), "gpu_use_basis": use[1]}
    message = (f"Input read in the main process, likely: about {per_gpu:.1f} core busy per GPU of the "
               f"{cpus} each holds (CPU efficiency {eff:.0f}%, near 1 in {cpus}) while the GPUs averaged "
               f"{use[0]:.0f}% {use[1]}.")
    if use[1] == "utilisation":
        message += by_utilisation_alone(report.gpus)
    workers = max(1, cpus - 1)
    fix = fitted(report, {
        "pytorch": (f"DataLoader(..., num_workers={workers}, pin_memory=True, persistent_workers=True): "
                    "the default, num_workers=0, loads in the training process"),
        "tensorflow": "dataset.map(..., num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)",
        "jax": f"Load in worker processes (grain with worker_count={workers}, or tf.data with AUTOTUNE)",
    }, (f"Spread the input and preprocessing over the {cpus} cores each GPU holds (worker processes or "
        "threads), or ask for fewer cores if the work is serial by nature"))
    return [hint("main_loading", "warning", message, evidence, fix, None)]


def _node_share(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """Cores or memory per GPU above what a node has per GPU strand the node's other GPUs."""
    job, share = report.job, node_share(report)
    if share is None or job.gpus <= 0:
        return []
    cpus = job.ncpus / job.gpus
    mem_mb = job.alloc_mem_bytes / MIB / job.gpus if job.alloc_mem_bytes else None
    over, fixes = [], []
    if cpus > share["cpus"] * (1 + p["tolerance"]):
        over.append(f"{cpus:.0f} cores per GPU where a node has {share['cpus']:.0f}")
        fixes.append(f"--cpus-per-gpu={max(1, int(share['cpus']))}")
    if (mem_mb is not None and share["mem_mb"] and mem_mb > share["mem_mb"] * (1 + p["tolerance"])
            and _share_holds_the_peak(report, share["mem_mb"] * MIB, p)):
        over.append(f"{mem_mb / 1024:.0f} GiB of memory per GPU where a node has "
                    f"{share['mem_mb'] / 1024:.0f}")
        fixes.append(f"--mem-per-gpu={max(1, int(share['mem_mb'] // 1024))}G")
    if not over:
        return []
    evidence = {"cpus_per_gpu": round(cpus, 1), "share_cpus_per_gpu": round(share["cpus"], 1),
                "mem_gib_per_gpu": None if mem_mb is None else round(mem_mb / 1024, 1),
                "share_mem_gib_per_gpu": round(share["mem_mb"] / 1024, 1)}
    message = (f"More than the node's share per GPU: {' and '.join(over)}, so the node's other GPUs may "
               "be left without cores or memory for other jobs.")
    fix = ("#SBATCH " + " ".join(fixes) + " (the node's share; a job that needs more per GPU is CPU-bound: "
           "lighten its CPU work)")
    return [hint("node_share", "info", message, evidence, fix, None)]


def _share_holds_the_peak(report: JobReport, per_gpu: float, p: dict[str, float]) -> bool:
    """Whether --mem-per-gpu at the node's share leaves each node max(8 GiB, 1.2 x the
    peak), as cpu_side's --mem: only a completed run's peak tells what the job needs.
    The peak (the largest step's MaxRSS times its tasks) is the job's, so on several
    nodes this errs on the side of more memory."""
    job = report.job
    if job.state != "COMPLETED" or job.max_rss_bytes is None:
        return False
    per_node = per_gpu * job.gpus / max(1, job.nnodes)
    return per_node >= max(p["mem_factor"] * job.max_rss_bytes, p["mem_floor_gib"] * GIB)


# A run of five minutes or more is always judged (issue 23): a site may lower the gate's
# early_s, never raise it past this.
JUDGED_FROM_S = 300.0
ENDED = ("FAILED", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "PREEMPTED", "DEADLINE")


def _too_early(report: JobReport, p: dict[str, float]) -> list[Hint]:
    """The gate: a run that failed, was cancelled or has run under early_s gets this hint
    alone (evaluate drops the user's others): its figures are start-up, not a verdict."""
    job = report.job
    state = job.state.split()[0] if job.state else ""
    p = {**p, "early_s": min(p["early_s"], JUDGED_FROM_S)}
    if job.elapsed_s >= p["early_s"] or not (job.running or state in ENDED):
        return []
    evidence = {"elapsed_s": job.elapsed_s, "state": state, "early_s": p["early_s"]}
    if job.running:
        message = (f"Just started: the job has run {duration(job.elapsed_s)}; its figures are not a verdict "
                   "yet.")
        fix = f"Look again once it has run {p['early_s'] / 60:.0f} minutes"
    else:
        head = "Cancelled early" if state == "CANCELLED" else "Failed early"
        message = (f"{head}: the job ended {state} after {duration(job.elapsed_s)}; its figures are not a "
                   "verdict on how it uses the GPUs.")
        fix = ("Nothing to change from these figures" if state == "CANCELLED" else
               "See the job's error output (slurm-<jobid>.out) for why it stopped") + \
            f"; runs of {p['early_s'] / 60:.0f} minutes or more are judged"
    return [hint("too_early", "info", message, evidence, fix, None)]


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
                "time_used_pct": pct(100 * job.elapsed_s / job.timelimit_s), "suggested_time_s": suggested}
    message = (f"Time limit far above the run time: the job ran {sbatch_time(job.elapsed_s)} of its "
               f"{sbatch_time(job.timelimit_s)} limit ({100 * job.elapsed_s / job.timelimit_s:.0f}%); "
               "shorter limits start sooner through backfill.")
    fix = f"#SBATCH --time={sbatch_time(suggested)}"
    return [hint("time_limit", "info", message, evidence, fix, None)]


def _short_job(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.state != "COMPLETED" or job.gpus <= 0 or job.elapsed_s >= p["short_s"]:
        return []
    evidence = {"elapsed_s": job.elapsed_s, "short_s": p["short_s"], "gpus_allocated": job.gpus}
    message = (f"Very short GPU job: it ran {job.elapsed_s} s, so starting up and loading cost about as "
               "much as the work itself.")
    fix = (f"Bundle several such runs into one job (loop over the inputs in one script, or several srun "
           f"steps in one allocation) so that each GPU job runs {p['short_s'] / 60:.0f} min or more")
    return [hint("short_job", "info", message, evidence, fix, None)]


RULES: tuple[Rule, ...] = (
    Rule(
        "too_early", "Too early to judge",
        "A run that failed or was cancelled in its first 5 minutes, or has run under 5 minutes so "
        "far, gets this information alone: its figures are start-up (imports, loading), and an "
        "import error after 20 s is no reason to drop the GPU. Five minutes is Princeton's jobstats "
        "line for short jobs; a run that ran longer is judged by every rule. Hardware problems still "
        "go to the admins.",
        {"early_s": 300.0}, (), _too_early, evidence=("elapsed_s", "state", "early_s"),
    ),
    Rule(
        "cpu_side", "The CPU side of a GPU job",
        "CPUs over 90% busy (ours) while the GPUs average under 50% use (SM activity, else utilisation: "
        "DCGM's 'likely ineffective' line) mean the CPU side is the bottleneck; more cores are suggested "
        "only up to the node's share. CPUs under 10% busy (ours) with more than two per GPU are held for "
        "nothing, unless the GPUs starve. Memory under 25% of the request (ours) is suggested as "
        "Princeton's jobstats does, at least max(8 "
        "GiB, 1.2 x the peak), for completed jobs only (never for failed or OOM-killed runs).",
        {"cpu_high": 90.0, "gpu_util_low": 50.0, "cpu_low": 10.0, "mem_low": 25.0,
         "mem_floor_gib": 8.0, "mem_factor": 1.2}, (), _cpu_side,
        evidence=("cpu_efficiency_pct", "gpu_use_pct", "gpu_use_basis", "cpus", "gpus_allocated",
                  "cpu_cores_used", "cpu_core_hours_saved", "mem_efficiency_pct", "mem_allocated_gib",
                  "mem_peak_gib", "mem_suggested"),
    ),
    Rule(
        "main_loading", "Input read in the main process",
        "Princeton's jobstats flags a CPU efficiency near 1/ncpus (the 'serial ratio'): one busy core "
        "of many. Here 0.6 to 1.4 busy cores per GPU, with at least 2 held per GPU and the GPUs under "
        "50% use (ours), mean each GPU's process reads its input itself while its other cores idle. "
        "The fix is the job's framework's (PyTorch's DataLoader defaults to num_workers=0).",
        {"serial_low": 0.6, "serial_high": 1.4, "min_cpus_per_gpu": 2.0, "gpu_low": 50.0}, (), _main_loading,
        evidence=("cpu_efficiency_pct", "cpus", "gpus_allocated", "cores_busy_per_gpu", "gpu_use_pct",
                  "gpu_use_basis"),
    ),
    Rule(
        "node_share", "More cores or memory per GPU than the node's share",
        "A node's cores and memory divided by its GPUs (from Slurm's node config, never assumed) is "
        "each GPU's share; a job holding more per GPU leaves the node's other GPUs without cores or "
        "memory for others, which Princeton's job_defense_shield caps. Said as information, with a "
        "tolerance of 0 by default (ours). Memory is cut to the share only where that leaves a "
        "completed run max(8 GiB, 1.2 x its peak) per node, as cpu_side's --mem (Princeton's "
        "jobstats): never for a failed or OOM-killed run.",
        {"tolerance": 0.0, "mem_floor_gib": 8.0, "mem_factor": 1.2}, (), _node_share,
        evidence=("cpus_per_gpu", "share_cpus_per_gpu", "mem_gib_per_gpu", "share_mem_gib_per_gpu"),
    ),
    Rule(
        "time_limit", "Time limit far above the run time",
        "A job that used under a quarter of its time limit (ours; Princeton's jobstats flags under "
        "60%, for runs over 15 minutes) asked for far more than it needed; shorter limits backfill "
        "sooner. The suggestion is the run time times 1.5 (ours, headroom), rounded up to 5 "
        "minutes. Completed jobs only: a failed run says nothing about how long the work takes.",
        {"time_fraction": 0.25, "headroom": 1.5}, (), _time_limit,
        evidence=("elapsed_s", "timelimit_s", "time_used_pct", "suggested_time_s"),
    ),
    Rule(
        "short_job", "Job too short to be worth a GPU",
        "Under 5 minutes (Princeton's jobstats line for short jobs), starting Python, loading "
        "libraries and data and warming the GPU up cost as much as the work itself, and the "
        "scheduler's overhead per job weighs more. Completed jobs only.",
        {"short_s": 300.0}, (), _short_job, evidence=("elapsed_s", "short_s", "gpus_allocated"),
    ),
)
