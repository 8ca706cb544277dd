"""The tuning hints: each rule fires on a profile that should trigger it, with the evidence,
fix and savings worked out here independently, and stays silent just across its threshold;
unmeasured metrics never speak; a site's [hints] settings change rules but run no code."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import parse_config
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.report.hints import (
    RULE_BY_ID,
    RULES,
    Hint,
    HintSettings,
    evaluate,
    rules_markdown,
    verdict,
)
from slurm_gpu_eff.report.shapes import JobReport
from tests.unit.hint_jobs import NO_GPM, Gpus, Reports

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2
H = 1.0  # the default job's elapsed hours (make_job: 3600 s)
def ids(report: JobReport, settings: HintSettings | None = None) -> set[str]:
    return {h.id for h in evaluate(report, settings)}


def one(report: JobReport, rule: str, settings: HintSettings | None = None, **where: Any) -> Hint:
    """The single hint of `rule` (matching `where`); its evidence keys are declared by the rule."""
    found = [h for h in evaluate(report, settings)
             if h.id == rule and all(getattr(h, k) == v for k, v in where.items())]
    assert len(found) == 1, [h.to_dict() for h in evaluate(report, settings)]
    assert set(found[0].evidence) <= set(RULE_BY_ID[rule].evidence)
    return found[0]


# --- idle_gpus ------------------------------------------------------------------------------


def test_one_of_two_gpus_never_opened(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(), gpu(minor=1, util=2.0, processes_max=0, mem_used=0)]), "idle_gpus")
    assert (hint.severity, hint.audience, hint.fix) == ("warning", "user", "#SBATCH --gres=gpu:1")
    assert hint.evidence["gpus_allocated"] == 2 and hint.evidence["gpus_idle"] == 1
    assert hint.evidence["gpus"] == [{"node": "gpu1", "minor": 1, "util_mean_pct": 2.0, "opened": False,
                                      "mem_peak_gib": 0.0}]
    assert hint.savings_gpu_hours == 1 * H and hint.savings_kind == "measured"
    assert hint.message.startswith("1 of 2 GPUs sat idle:") and "never opened" in hint.message


def test_opened_but_idle_is_told_apart(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(), gpu(minor=1, util=3.0, processes_max=1)]), "idle_gpus")
    assert hint.evidence["gpus"][0]["opened"] is True and "opened but stayed idle" in hint.message


def test_a_gpu_at_the_idle_threshold_is_not_idle(job_report: Reports, gpu: Gpus) -> None:
    assert "idle_gpus" not in ids(job_report([gpu(), gpu(minor=1, util=5.0)]))


def test_a_single_idle_gpu_is_critical_with_its_whole_time(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(util=0.4, mem_used=GIB)], elapsed_s=5400), "idle_gpus")
    assert hint.severity == "critical" and hint.savings_gpu_hours == 1.5
    assert "CPU job" in hint.fix and hint.message.startswith("The GPU sat idle")


def test_multi_node_idle_gpus_fix_is_per_node(job_report: Reports, gpu: Gpus) -> None:
    gpus = [gpu(node=n, minor=m, util=1.0 if m == 1 else 95.0, mem_used=GIB if m == 1 else 56 * GIB)
            for n in ("gpu1", "gpu2") for m in (0, 1)]
    hint = one(job_report(gpus), "idle_gpus")
    assert hint.fix.startswith("#SBATCH --gres=gpu:1 (per node") and hint.savings_gpu_hours == 2 * H
    uneven = [gpu(node=n, minor=m, util=1.0 if (n, m) == ("gpu2", 1) else 95.0, mem_used=GIB)
              for n in ("gpu1", "gpu2") for m in (0, 1)]
    assert one(job_report(uneven), "idle_gpus").fix.startswith("#SBATCH --gpus=3 ")


# --- low_util -------------------------------------------------------------------------------


def timeline(utils: list[float | None], bucket_s: float = 10.0) -> dict[str, Any]:
    return {"start": 0.0, "bucket_s": bucket_s, "fields": ["util", "sm_active", "power_w", "mem_used_gib"],
            "points": [[u, None, 100.0, 1.0] for u in utils]}


@pytest.mark.parametrize("util, severity", [(12.0, "critical"), (15.0, "warning"), (24.9, "warning")])
def test_steady_low_utilisation(job_report: Reports, gpu: Gpus, util: float, severity: str) -> None:
    hint = one(job_report([gpu(util=util, sm_active=None)]), "low_util")
    assert hint.severity == severity and hint.evidence["pattern"] == "steady"
    assert hint.evidence["util_mean_pct"] == util
    assert hint.savings_gpu_hours == round(1 * H * (1 - util / 100), 3) and hint.savings_kind == "estimated"
    assert "larger batch" in hint.fix and "nsys profile" in hint.fix
    assert "rests on utilisation alone" in hint.message


def test_utilisation_at_the_warning_threshold_is_not_low(job_report: Reports, gpu: Gpus) -> None:
    assert "low_util" not in ids(job_report([gpu(util=25.0)]))


def test_idle_start_and_end_mean_data_staging(job_report: Reports, gpu: Gpus) -> None:
    points = [0.0] * 15 + [30.0] * 75 + [1.0] * 10  # 150 s idle, then 100 s at the end
    hint = one(job_report([gpu(util=22.0, timeline=timeline(points))]), "low_util")
    assert hint.evidence["pattern"] == "idle_edges"
    assert (hint.evidence["idle_start_s"], hint.evidence["idle_end_s"]) == (150, 100)
    assert hint.evidence["idle_edges_pct"] == 25.0
    assert "--dependency=afterok:" in hint.fix and "first 2.5 min and the last 100 s" in hint.message


def test_idle_edges_of_exactly_the_edge_fraction_are_not_staging(job_report: Reports, gpu: Gpus) -> None:
    points = [0.0] * 10 + [30.0] * 80 + [0.0] * 10
    hint = one(job_report([gpu(util=22.0, timeline=timeline(points))]), "low_util")
    assert hint.evidence["pattern"] == "steady"


def test_alternating_busy_and_idle_means_a_starving_input_pipeline(job_report: Reports, gpu: Gpus) -> None:
    hist = [2800.0, 0, 0, 0, 0, 0, 0, 0, 0, 800.0]
    torch = ["pytorch"]
    hint = one(job_report([gpu(util=22.0, util_histogram_s=hist)], ncpus=4, frameworks=torch), "low_util")
    assert hint.evidence["pattern"] == "periodic"
    assert (hint.evidence["low_time_pct"], hint.evidence["high_time_pct"]) == (77.8, 22.2)
    assert "num_workers=3" in hint.fix and "pin_memory=True" in hint.fix and "cpus-per-gpu" not in hint.fix
    few_cpus = one(job_report([gpu(util=22.0, util_histogram_s=hist)], ncpus=2, frameworks=["pytorch"]),
                   "low_util")
    assert "num_workers=3" in few_cpus.fix and "#SBATCH --cpus-per-gpu=4" in few_cpus.fix


def test_too_little_busy_time_is_not_periodic(job_report: Reports, gpu: Gpus) -> None:
    hist = [3300.0, 0, 0, 0, 0, 0, 0, 0, 0, 300.0]  # 8.3% over 50%: under periodic_fraction
    hint = one(job_report([gpu(util=12.0, util_histogram_s=hist)]), "low_util")
    assert hint.evidence["pattern"] == "steady"


def test_a_timeline_that_switches_is_periodic(job_report: Reports, gpu: Gpus) -> None:
    points = [30.0, 0.0, 80.0, 0.0, 80.0, 0.0, 30.0]  # four switches between idle and busy
    hint = one(job_report([gpu(util=20.0, timeline=timeline(points))]), "low_util")
    assert hint.evidence["pattern"] == "periodic" and hint.evidence["switches"] == 4
    three = [30.0, 0.0, 80.0, 0.0, 80.0, 30.0, 30.0]
    hint = one(job_report([gpu(util=20.0, timeline=timeline(three))]), "low_util")
    assert hint.evidence["pattern"] == "steady"


def test_low_util_leaves_idle_gpus_out_of_its_mean(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(util=20.0), gpu(minor=1, util=1.0)]), "low_util")
    assert hint.evidence["util_mean_pct"] == 20.0 and hint.evidence["gpus_concerned"] == 1
    assert hint.savings_gpu_hours == round(H * (1 - 20 / 100), 3)


# --- falsely_busy ---------------------------------------------------------------------------


def test_busy_with_few_active_sms(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(util=95.0, sm_active=40.0)], frameworks=["pytorch"]), "falsely_busy")
    assert hint.severity == "warning" and hint.evidence["cause"] == "small_kernels"
    assert (hint.evidence["util_mean_pct"], hint.evidence["sm_active_mean_pct"]) == (95.0, 40.0)
    assert hint.savings_gpu_hours == round(H * (1 - 40 / 95), 3) and hint.savings_kind == "estimated"
    assert "CUDA graphs" in hint.fix and "torch.compile" in hint.fix
    # relative to utilisation: at 60%, SM activity under 0.6 of it (36%) is needed
    assert one(job_report([gpu(util=60.0, sm_active=35.9)]), "falsely_busy").evidence["util_mean_pct"] == 60.0


@pytest.mark.parametrize("util, sm", [(95.0, 50.0), (59.9, 20.0), (60.0, 36.0)])
def test_not_falsely_busy_across_either_threshold(
    job_report: Reports, gpu: Gpus, util: float, sm: float,
) -> None:
    assert "falsely_busy" not in ids(job_report([gpu(util=util, sm_active=sm)]))


def test_without_gpm_nothing_is_said_of_busy_gpus(job_report: Reports, gpu: Gpus) -> None:
    # power alone cannot tell small kernels from an NCCL wait: no guess from it any more
    no_gpm = dict.fromkeys(NO_GPM)
    assert "falsely_busy" not in ids(job_report([gpu(util=90.0, power=100.0, **no_gpm)]))


# --- tensor cores, memory-bound, PCIe, NVLink -----------------------------------------------


def test_fp32_without_tensor_cores(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(fp32_active=30.0, tensor_active=0.5)], frameworks=["pytorch"]),
               "tensor_cores_unused")
    assert (hint.evidence["fp32_active_mean_pct"], hint.evidence["tensor_active_mean_pct"]) == (30.0, 0.5)
    assert hint.savings_gpu_hours == round(H * 30 / 100 * 0.5, 3) and hint.savings_kind == "estimated"
    assert "rough" in (hint.savings_how or "")
    assert "torch.bfloat16" in hint.fix and hint.severity == "warning"


@pytest.mark.parametrize("fp32, tensor", [(30.0, 1.0), (20.0, 0.0)])
def test_tensor_cores_near_misses(job_report: Reports, gpu: Gpus, fp32: float, tensor: float) -> None:
    assert "tensor_cores_unused" not in ids(job_report([gpu(fp32_active=fp32, tensor_active=tensor)]))


def test_memory_bound(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(dram_active=60.0, sm_active=40.0)]), "memory_bound")
    assert hint.severity == "info" and hint.savings_gpu_hours is None and hint.evidence["kind"] == "copies"
    assert (hint.evidence["dram_active_mean_pct"], hint.evidence["sm_active_mean_pct"]) == (60.0, 40.0)
    assert "memory_bound" not in ids(job_report([gpu(dram_active=59.9, sm_active=40.0)]))
    # memory-stalled warps count as SM-active: high SM activity no longer hides it
    kernels = one(job_report([gpu(dram_active=75.0, sm_active=90.0)]), "memory_bound")
    assert kernels.evidence["kind"] == "kernels" and "wait on memory" in kernels.message


# half the link one way: PCIe Gen5 x16 (assumed, no link reported) 63.01 GB/s, 450 GB/s NVLink
PCIE_HALF = 0.5 * 16 * 3.938e9 / 2**20
NVLINK_HALF = 0.5 * 450e9 / 2**20


@pytest.mark.parametrize("kind, high, low", [("pcie", (PCIE_HALF, 100.0), (PCIE_HALF - 1, PCIE_HALF - 1)),
                                             ("nvlink", (100.0, NVLINK_HALF), (NVLINK_HALF - 1, 100.0))])
def test_transfer_bound(
    job_report: Reports, gpu: Gpus, kind: str, high: tuple[float, float], low: tuple[float, float],
) -> None:
    def traffic(rx_tx: tuple[float, float]) -> JobReport:
        return job_report([gpu(sm_active=40.0, **{f"{kind}_rx_mbps": rx_tx[0], f"{kind}_tx_mbps": rx_tx[1]})])

    hint = one(traffic(high), f"{kind}_bound")
    assert hint.evidence[f"{kind}_busiest_direction_mib_s"] == round(max(high))
    assert hint.evidence["link_used_pct"] == 50.0 and hint.evidence["link_source"] == "assumed"
    assert hint.severity == "warning" and hint.savings_gpu_hours is None
    assert "fewer GPUs" not in hint.fix and "assumed" in hint.message
    assert f"{kind}_bound" not in ids(traffic(low))  # just under half the link, each way


# --- gpu_memory -----------------------------------------------------------------------------


def test_little_gpu_memory_suggests_a_smaller_gpu(job_report: Reports, gpu: Gpus) -> None:
    small = gpu(mem_used=8 * GIB, util=15.0, sm_active=12.0)
    hint = one(job_report([small]), "gpu_memory")
    assert hint.severity == "info" and hint.savings_gpu_hours is None
    assert (hint.evidence["mem_peak_gib"], hint.evidence["mem_total_gib"], hint.evidence["mem_peak_pct"]) == \
        (8.0, 80.0, 10.0)
    assert hint.evidence["mem_needed_gib"] == 10 and "at least 10 GiB" in hint.fix
    # Princeton's three conditions: memory alone (a busy GPU) or many cores is no MIG candidate
    assert "gpu_memory" not in ids(job_report([gpu(mem_used=8 * GIB)]))
    assert "gpu_memory" not in ids(job_report([gpu(mem_used=8 * GIB, util=15.0, sm_active=21.0)]))
    assert "gpu_memory" not in ids(job_report([gpu(mem_used=11 * GIB, util=15.0, sm_active=12.0)]))
    assert "gpu_memory" not in ids(job_report([small], ncpus=16))


def test_nearly_full_gpu_memory_is_an_oom_risk(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(mem_used=76 * GIB)], frameworks=["pytorch"]), "gpu_memory")
    assert hint.severity == "warning" and hint.evidence["mem_peak_pct"] == 95.0
    assert "gradient checkpointing" in hint.fix
    neutral = one(job_report([gpu(mem_used=76 * GIB)]), "gpu_memory")
    assert "torch" not in neutral.fix and "smaller batch" in neutral.fix
    assert "gpu_memory" not in ids(job_report([gpu(mem_used=75.9 * GIB)]))


# --- spread_nodes, cpu_side, time ------------------------------------------------------------


def test_gpus_spread_over_nodes_that_one_node_would_hold(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(node="gpu1"), gpu(node="gpu2")]), "spread_nodes")
    assert hint.fix == "#SBATCH --nodes=1 --gres=gpu:2" and hint.severity == "info"
    assert (hint.evidence["nodes"], hint.evidence["gpus_per_node_used"]) == (2, 1.0)
    six = [gpu(node=n, minor=m) for n in ("gpu1", "gpu2") for m in range(3)]
    assert "spread_nodes" not in ids(job_report(six))  # 6 GPUs do not fit a 4-GPU node


def cpu_job(fraction: float, ncpus: int = 4) -> dict[str, Any]:
    return {"ncpus": ncpus, "total_cpu_s": fraction * 3600 * ncpus}


def test_saturated_cpus_starving_gpu(job_report: Reports, gpu: Gpus) -> None:
    hint = one(job_report([gpu(util=30.0, sm_active=None)], **cpu_job(0.95)), "cpu_side", severity="warning")
    assert (hint.evidence["cpu_efficiency_pct"], hint.evidence["gpu_use_pct"]) == (95.0, 30.0)
    assert hint.fix.startswith("#SBATCH --cpus-per-gpu=8")  # 4 CPUs for 1 GPU, doubled
    assert "cpu_side" not in ids(job_report([gpu(util=30.0, sm_active=None)], **cpu_job(0.90)))
    assert "cpu_side" not in ids(job_report([gpu(util=50.0, sm_active=None)], **cpu_job(0.95)))


def test_idle_cpus_suggest_fewer(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1)], **cpu_job(0.05, ncpus=32))
    hint = one(report, "cpu_side", severity="info")
    assert hint.fix == "#SBATCH --cpus-per-gpu=2"  # 1.6 cores used, twice that over 2 GPUs, at least 2
    assert (hint.evidence["cpu_cores_used"], hint.evidence["cpu_core_hours_saved"]) == (1.6, 28.0)
    assert "cpu_side" not in ids(job_report([gpu(), gpu(minor=1)], **cpu_job(0.10, ncpus=32)))
    assert "cpu_side" not in ids(job_report([gpu(), gpu(minor=1)], **cpu_job(0.05, ncpus=4)))
    # a starving GPU needs those CPUs for DataLoader workers: low_util says so, cpu_side stays quiet
    starving = job_report([gpu(util=20.0, sm_active=15.0), gpu(minor=1, util=20.0, sm_active=15.0)],
                          **cpu_job(0.05, ncpus=32))
    assert "low_util" in ids(starving) and "cpu_side" not in ids(starving)


@pytest.mark.parametrize("alloc, rss, mem", [
    (64 * GIB, 6 * GIB, "8G"),  # 7.2 GiB, raised to the 8 GiB floor
    (64 * GIB, 10 * GIB, "12G"),  # 1.2 x the peak, rounded up to whole GiB
])
def test_memory_over_requested(job_report: Reports, alloc: int, rss: int, mem: str) -> None:
    hint = one(job_report(alloc_mem_bytes=alloc, max_rss_bytes=rss), "cpu_side")
    assert hint.fix.startswith(f"#SBATCH --mem={mem} ") and hint.evidence["mem_suggested"] == mem
    assert hint.evidence["mem_efficiency_pct"] == round(100 * rss / alloc, 1)


def test_memory_suggestion_never_goes_under_the_floor(job_report: Reports) -> None:
    # 8000 MiB asked, 900 MiB used: the floor (8 GiB) is above the request, so no hint at all
    assert "cpu_side" not in ids(job_report(alloc_mem_bytes=8000 * MIB, max_rss_bytes=900 * MIB))


def test_memory_at_the_threshold_and_running_jobs_get_no_cpu_side_hint(job_report: Reports) -> None:
    assert "cpu_side" not in ids(job_report(alloc_mem_bytes=64 * GIB, max_rss_bytes=16 * GIB))
    assert "cpu_side" not in ids(job_report(state="RUNNING", max_rss_bytes=10 * MIB, **cpu_job(0.01, 32)))


@pytest.mark.parametrize("elapsed, limit, time", [(3600, 8 * 3600, "01:30:00"), (1001, 4 * 3600, "00:30:00"),
                                                  (12 * 3600, 3 * 86400, "18:00:00")])
def test_time_limit_far_above_run_time(job_report: Reports, elapsed: int, limit: int, time: str) -> None:
    hint = one(job_report(elapsed_s=elapsed, timelimit_s=limit), "time_limit")
    assert hint.fix == f"#SBATCH --time={time}" and hint.severity == "info"
    assert hint.evidence["suggested_time_s"] == math.ceil(elapsed * 1.5 / 300) * 300
    assert hint.evidence["time_used_pct"] == round(100 * elapsed / limit, 1)


def test_time_limit_near_misses(job_report: Reports) -> None:
    assert "time_limit" not in ids(job_report(elapsed_s=3600, timelimit_s=4 * 3600))  # exactly 25%
    assert "time_limit" not in ids(job_report(elapsed_s=3600, timelimit_s=8 * 3600, state="FAILED"))


def test_short_job(job_report: Reports) -> None:
    hint = one(job_report(elapsed_s=299), "short_job")
    assert hint.evidence["elapsed_s"] == 299 and "5 min" in hint.fix
    assert "short_job" not in ids(job_report(elapsed_s=300))
    assert "short_job" not in ids(job_report(elapsed_s=30, state="FAILED"))


# --- hardware -------------------------------------------------------------------------------


def throttled(reason: str, seconds: float) -> dict[str, Any]:
    return {"throttle_s": {"power_cap": 0.0, reason: seconds}, "throttle_observed_s": 3600.0}


def test_thermal_slowdown_goes_to_the_admins(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1, **throttled("hw_thermal", 360.0))])
    hint = one(report, "hardware")
    assert (hint.audience, hint.severity, hint.evidence["minor"]) == ("admin", "warning", 1)
    assert hint.evidence["throttle_pct"] == {"hw_thermal": 10.0}
    assert "not your job's fault" in hint.message and "--exclude=gpu1" in hint.fix
    assert verdict(report, evaluate(report)).startswith("Good: the GPUs were busy 95%")
    assert "for the admins" in verdict(report, evaluate(report))


def test_slowdowns_at_the_threshold_and_power_cap_are_no_problem(job_report: Reports, gpu: Gpus) -> None:
    assert "hardware" not in ids(job_report([gpu(**throttled("hw_slowdown", 180.0))]))
    assert "hardware" not in ids(job_report([gpu(**throttled("power_cap", 3600.0))]))


@pytest.mark.parametrize("fault, severity, words", [
    ({"xid_events": [{"time": 1.0, "xid": 79}]}, "critical", "XID 79"),
    ({"ecc_uncorrected": 2}, "critical", "2 uncorrected ECC"),
    ({"lost_at": 1_700_000_100.0}, "critical", "fell off the bus"),
    ({"xid_events": [{"time": 1.0, "xid": 13}]}, "warning", "job's own code"),
])
def test_hardware_faults(
    job_report: Reports, gpu: Gpus, fault: dict[str, Any], severity: str, words: str,
) -> None:
    hint = one(job_report([gpu(**fault)]), "hardware")
    assert hint.severity == severity and words in hint.message and hint.audience == "admin"


def test_a_lost_gpu_is_not_the_users_idle_gpu(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1, util=1.0, lost_at=1_700_000_100.0)])
    assert ids(report) == {"hardware"}
    text = verdict(report, evaluate(report))
    assert text.startswith("Good: the GPUs were busy 95% of the time. A hardware problem on gpu1")


# --- whole jobs -----------------------------------------------------------------------------


def test_a_healthy_job_gets_no_hint_and_a_good_verdict(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1)])
    assert evaluate(report) == []
    assert verdict(report, []) == "Good: the GPUs were busy 95% of the time."


def test_verdict_without_warnings_but_middling_use_is_fair(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=40.0, sm_active=35.0)])
    assert verdict(report, []) == "Fair: the GPUs were busy 40% of the time."
    report = job_report([gpu(util=70.0, sm_active=60.0)])
    assert verdict(report, []) == "Good: the GPUs were busy 70% of the time."


def test_unmeasured_gpm_metrics_never_speak(job_report: Reports, gpu: Gpus) -> None:
    no_gpm = dict.fromkeys(NO_GPM)
    assert evaluate(job_report([gpu(util=95.0, power=600.0, **no_gpm)])) == []
    # thresholds a zero would meet: the GPU without GPM must still be left out
    settings = HintSettings.from_config({"memory_bound.dram_pct": "0", "memory_bound.sm_pct": "100"})
    hint = one(job_report([gpu(), gpu(minor=1, **no_gpm)]), "memory_bound", settings)
    assert [g["minor"] for g in hint.evidence["gpus"]] == [0]


def test_mig_slices_without_utilisation_get_no_utilisation_hints(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=None, power=None, mig_gi_id=1), gpu(minor=1, util=None, power=None)],
                        **cpu_job(0.99))
    found = ids(report)
    assert not found & {"idle_gpus", "low_util", "falsely_busy", "cpu_side"}
    assert verdict(report, evaluate(report)).startswith("No problems found")


def test_hints_are_sorted_by_severity_then_savings(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=1.0, ecc_uncorrected=1, mem_used=0), gpu(minor=1, fp32_active=30.0,
                         tensor_active=0.0), gpu(minor=2, util=59.0, sm_active=30.0)],
                        elapsed_s=3000, timelimit_s=86400, frameworks=["pytorch"])
    hints = evaluate(report)
    assert [(h.id, h.savings_gpu_hours) for h in hints] == [
        ("hardware", None), ("idle_gpus", round(3000 / 3600, 3)),
        ("imbalance", round(2 * 3000 / 3600 * (1 - (85 + 30) / 2 / 85), 3)),
        ("low_sm", round(3000 / 3600 * (1 - 30 / 80), 3)),
        ("tensor_cores_unused", round(3000 / 3600 * 0.3 * 0.5, 3)), ("time_limit", None)]


def test_verdict_names_the_worst_finding(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1, util=2.0)])
    assert verdict(report, evaluate(report)) == "Needs attention: 1 of 2 GPUs sat idle; see the hints below."
    two = job_report([gpu(), gpu(minor=1, util=2.0), gpu(minor=2, util=60.0, sm_active=45.0)])
    assert verdict(two, evaluate(two)).startswith(
        "Needs attention: 1 of 3 GPUs sat idle (and 1 more finding);")
    idle = job_report([gpu(util=1.0)])
    assert verdict(idle, evaluate(idle)).startswith("Poor: The GPU sat idle")
    running = job_report([gpu(util=20.0)], state="RUNNING")
    assert verdict(running, evaluate(running)).startswith(
        "Needs attention so far: Low GPU utilisation (20.0%); see")


def test_hint_to_dict(job_report: Reports, gpu: Gpus) -> None:
    data = one(job_report([gpu(util=20.0)]), "low_util").to_dict()
    assert list(data) == ["id", "severity", "audience", "message", "evidence", "fix", "savings_gpu_hours",
                          "savings", "link"]
    assert data["savings"] == {"gpu_hours": 0.8, "kind": "estimated", "how": data["savings"]["how"]}
    assert "100% minus utilisation" in data["savings"]["how"]


# --- site settings --------------------------------------------------------------------------


def test_disable_and_threshold_override(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=30.0)])
    assert "low_util" not in ids(report)
    stricter = HintSettings.from_config({"low_util.warn_pct": "35"})
    assert one(report, "low_util", stricter).severity == "warning"
    off = HintSettings.from_config({"disable": "low_util, cpu_side", "low_util.warn_pct": "35"})
    assert "low_util" not in ids(report, off)


def test_message_override_fills_evidence_and_evaluates_nothing(job_report: Reports, gpu: Gpus) -> None:
    template = ("Busy {util_mean_pct:.0f}% ({savings_gpu_hours} GPU-h); {__class__} "
                "{util_mean_pct.__class__} {gpus[0]} {util_mean_pct!r} {nope} {util_mean_pct:>999999999} "
                "{{literal}}")
    settings = HintSettings.from_config({"low_util.message": template,
                                         "low_util.link": "https://hpc.example.org/gpu"})
    hint = one(job_report([gpu(util=20.0)]), "low_util", settings)
    assert hint.message == ("Busy 20% (0.8 GPU-h); {__class__} {util_mean_pct.__class__} {gpus[0]} "
                            "{util_mean_pct!r} {nope} {util_mean_pct:>999999999} {literal}")
    assert hint.link == "https://hpc.example.org/gpu" and hint.to_dict()["link"] == hint.link


@pytest.mark.parametrize("key, value, named", [
    ("nope.warn_pct", "3", "[hints] nope.warn_pct"),
    ("low_util.nope", "3", "[hints] low_util.nope"),
    ("low_util.warn_pct", "many", "[hints] low_util.warn_pct"),
    ("low_util.warn_pct", "nan", "[hints] low_util.warn_pct"),
    ("low_util.warn_pct", "-1", "[hints] low_util.warn_pct"),
    ("disable", "low_util, nope", "'nope'"),
    ("threshold", "3", "[hints] threshold"),
    ("low_util.link", "javascript:alert(1)", "[hints] low_util.link"),
    ("low_util.message", "unclosed {", "[hints] low_util.message"),
])
def test_bad_settings_name_the_key(key: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        HintSettings.from_config({key: value})
    assert named in str(caught.value)


# --- the rules and their docs ---------------------------------------------------------------


def test_rules_are_well_formed_and_documented() -> None:
    assert len(RULE_BY_ID) == len(RULES) >= 13
    doc = rules_markdown()
    for rule in RULES:
        assert rule.audience in ("user", "admin") and 2 <= len(re.findall(r"[.!?](\s|$)", rule.why)) <= 4
        assert f"## {rule.id}\n" in doc
        for name, value in rule.params.items():
            assert f"| `{rule.id}.{name}` | {value:g} |" in doc


def test_every_threshold_is_named_in_its_rules_text() -> None:
    """docs/hints.md gives each threshold its source or says it is ours: a default the
    text never names has neither (issue 23)."""
    words = {0.5: "half", 0.25: "a quarter"}
    for rule in RULES:
        for name, value in rule.params.items():
            forms = {f"{value:g}", f"{value * 100:g}%", f"{value / 60:g} min", words.get(value, f"{value:g}")}
            named = (re.search(rf"(?<![\d.]){re.escape(form)}(?!\d|\.\d)", rule.why) for form in forms)
            assert any(named), f"{rule.id}.{name} = {value:g}"


def test_the_documented_example_settings_parse() -> None:
    example = rules_markdown().split("```toml\n", 1)[1].split("```", 1)[0]
    settings = HintSettings.from_config(parse_config(example, "docs").hints)
    assert settings.disabled == {"short_job", "time_limit"} and settings.params["low_util"]["warn_pct"] == 30


def test_docs_hints_md_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_hints_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_the_doc_check_notices_a_stale_file(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_hints_doc", REPO / "scripts" / "gen_hints_doc.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.TARGET = tmp_path / "hints.md"
    script.TARGET.write_text("stale\n", encoding="utf-8")
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    assert script.TARGET.read_text(encoding="utf-8") == rules_markdown()


# -- idle_stretch: a mean hides a GPU that worked and then idled for ten minutes -------------

def test_a_long_idle_stretch_in_a_busy_job(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=80.0, idle_longest={"from_s": 1800.0, "seconds": 900.0}), gpu(minor=1)])
    (hint,) = [h for h in evaluate(report) if h.id == "idle_stretch"]
    assert hint.severity == "warning" and hint.savings_gpu_hours == pytest.approx(0.25)
    assert hint.evidence["idle_stretch_s"] == 900 and hint.evidence["idle_from_s"] == 1800
    assert hint.evidence["idle_stretch_pct"] == pytest.approx(25.0)
    assert "gpu1 GPU 0 sat idle for 15 min in one stretch, from 30 min into the job" in hint.message


@pytest.mark.parametrize(("util", "longest", "elapsed_s"), [
    (80.0, {"from_s": 0.0, "seconds": 599.0}, 3600),  # under 10 minutes
    (80.0, {"from_s": 0.0, "seconds": 900.0}, 10000),  # under 10% of the run
    (2.0, {"from_s": 0.0, "seconds": 3600.0}, 3600),  # an idle GPU: idle_gpus says it
    (80.0, None, 3600),  # not recorded (a summary from before it was)
])
def test_no_idle_stretch_hint(job_report: Reports, gpu: Gpus, util: float, longest: Any,
                              elapsed_s: int) -> None:
    report = job_report([gpu(util=util, idle_longest=longest)], elapsed_s=elapsed_s)
    assert "idle_stretch" not in [h.id for h in evaluate(report)]


def test_the_report_names_the_longest_idle_stretch(job_report: Reports, gpu: Gpus) -> None:
    from slurm_gpu_eff.report.render import render_text

    report = job_report([gpu(util=80.0, idle_longest={"from_s": 1800.0, "seconds": 900.0}),
                         gpu(minor=1, idle_longest={"from_s": 10.0, "seconds": 30.0})])
    assert report.to_dict()["longest_idle"] == {"node": "gpu1", "minor": 0, "seconds": 900.0,
                                                "from_s": 1800.0}
    assert "Longest idle stretch: gpu1 GPU 0, 00:15:00 from 00:30:00 into the job" in render_text(report)
    assert job_report([gpu(idle_longest={"from_s": 0.0, "seconds": 59.0})]).longest_idle is None
