"""The CPU and Slurm side: cores, memory, time limit, short jobs."""

from __future__ import annotations

import math
from typing import Any

from ..shapes import Hint, JobReport
from .core import GIB, MIB, Rule, cpus_per_gpu, elapsed_h, gib, hint, mean, pct, sbatch_time


def _cpu_side(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.running:
        return []
    hints = []
    gpus = max(1, job.gpus)
    cpus = cpus_per_gpu(report)
    eff = job.cpu_efficiency
    utils = [g.util_mean for g in report.gpus if g.util_mean is not None]
    if eff is not None and utils and eff > p["cpu_high"] and mean(utils) < p["gpu_util_low"]:
        util = mean(utils)
        evidence: dict[str, Any] = {"cpu_efficiency_pct": pct(eff), "util_mean_pct": pct(util),
                                    "cpus": job.ncpus, "gpus_allocated": job.gpus}
        message = (f"CPU-bound: the CPUs were {eff:.1f}% busy while the GPUs averaged {util:.1f}%, so the "
                   "CPU side (data loading, preprocessing) cannot keep up.")
        fix = f"#SBATCH --cpus-per-gpu={2 * cpus}, with DataLoader(num_workers={2 * cpus - 1})"
        hints.append(hint("cpu_side", "warning", message, evidence, fix, None))
    starving = bool(utils) and mean(utils) < p["gpu_util_low"]  # then more workers need those CPUs
    if eff is not None and eff < p["cpu_low"] and job.ncpus > 2 * gpus and not starving:
        used = job.ncpus * eff / 100
        wanted = max(2, math.ceil(2 * used / gpus))
        if wanted * gpus < job.ncpus:
            evidence = {"cpu_efficiency_pct": pct(eff), "cpus": job.ncpus, "cpu_cores_used": round(used, 1),
                        "gpus_allocated": job.gpus,
                        "cpu_core_hours_saved": round((job.ncpus - wanted * gpus) * elapsed_h(report), 1)}
            message = (f"Most CPUs unused: {job.ncpus} CPUs allocated, {eff:.1f}% used "
                       f"(about {used:.1f} cores busy).")
            fix = f"#SBATCH --cpus-per-gpu={wanted}"
            hints.append(hint("cpu_side", "info", message, evidence, fix, None))
    if job.mem_efficiency is not None and job.alloc_mem_bytes and job.max_rss_bytes is not None:
        per_node = job.alloc_mem_bytes / max(1, job.nnodes)  # --mem is per node
        mem_eff = 100 * job.max_rss_bytes / per_node
        # Never below a floor: Slurm samples RSS, so short peaks escape it, and a job
        # squeezed under its real peak dies; the floor is site-tunable.
        target = max(job.max_rss_bytes * 1.25, p["mem_floor_mib"] * MIB)
        text = f"{math.ceil(target / GIB)}G" if target >= GIB else f"{max(1, math.ceil(target / MIB))}M"
        if mem_eff < p["mem_low"] and target < per_node:
            evidence = {"mem_efficiency_pct": pct(mem_eff), "mem_allocated_gib": gib(per_node),
                        "mem_peak_gib": gib(job.max_rss_bytes), "mem_suggested": text}
            message = (f"Memory over-requested: the peak was {job.max_rss_bytes / GIB:.2f} GiB of "
                       f"{per_node / GIB:.2f} GiB allocated per node ({mem_eff:.1f}%).")
            fix = f"#SBATCH --mem={text} (the peak plus 25%, at least {p['mem_floor_mib']:g} MiB)"
            hints.append(hint("cpu_side", "info", message, evidence, fix, None))
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
)
