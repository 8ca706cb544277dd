"""Issue 23: hints a user can act on without harm. Each fault the review found in the old
rules, each rule it found missing, and a "no harm" set of job shapes, asserting what the
hints must not say as well as what they must. Built as test_hints.py builds reports (hint_jobs.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_gpu_eff.report.hints import evaluate, verdict
from slurm_gpu_eff.report.shapes import Hint, JobReport
from tests.unit.hint_jobs import GIB, NO_GPM, Gpus, Reports

# A node of 8 GPUs, 64 cores and 1 TiB: 8 cores and 128 GiB per GPU
EIGHT_GPU_NODE = {"cpus": 64, "mem_mb": 1024 * 1024, "gpus": 8}


def ids(report: JobReport) -> set[str]:
    return {h.id for h in evaluate(report)}


def the(report: JobReport, rule: str) -> Hint:
    found = [h for h in evaluate(report) if h.id == rule]
    assert len(found) == 1, [h.to_dict() for h in evaluate(report)]
    return found[0]


def said(report: JobReport) -> str:
    """Everything the user reads: every hint's message and fix, and the verdict."""
    hints = evaluate(report)
    user = [f"{h.message} {h.fix}" for h in hints if h.audience == "user"]
    return " ".join([verdict(report, hints), *user])


# --- the faults ------------------------------------------------------------------------------


def test_a_job_that_failed_after_20_s_is_not_judged(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=0.0, mem_used=0), gpu(minor=1, util=0.0, mem_used=0)],
                        state="FAILED", elapsed_s=20)
    hint = the(report, "too_early")
    assert ids(report) == {"too_early"} and hint.severity == "info"
    assert hint.message.startswith("Failed early") and "not a verdict" in hint.message
    text = said(report)
    assert "CPU job" not in text and "--gres" not in text and "critical" not in text
    assert verdict(report, evaluate(report)).startswith("No verdict: Failed early")


@pytest.mark.parametrize("state", ["CANCELLED by 1000", "OUT_OF_MEMORY", "RUNNING"])
def test_cancelled_oom_and_just_started_runs_are_not_judged(
    job_report: Reports, gpu: Gpus, state: str,
) -> None:
    report = job_report([gpu(util=0.0, mem_used=0)], state=state, elapsed_s=120)
    assert ids(report) == {"too_early"}


def test_a_run_of_five_minutes_or_more_is_judged(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1, util=0.0, mem_used=0)], state="FAILED", elapsed_s=300)
    assert "too_early" not in ids(report) and "idle_gpus" in ids(report)


def test_idle_gpus_holding_memory_are_not_told_to_go(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1, util=1.0, mem_used=60 * GIB)])
    hint = the(report, "idle_gpus")
    assert "--gres=gpu:1" not in hint.fix and "sharding" in hint.fix
    assert hint.evidence["gpus_holding_memory"] == 1


def test_alternating_phases_get_their_frameworks_fix_only(job_report: Reports, gpu: Gpus) -> None:
    hist = [2800.0, 0, 0, 0, 0, 0, 0, 0, 0, 800.0]
    tf = the(job_report([gpu(util=22.0, util_histogram_s=hist)], frameworks=["tensorflow"]), "low_util")
    assert "tf.data" in tf.fix and "DataLoader" not in tf.fix
    unknown = the(job_report([gpu(util=22.0, util_histogram_s=hist)]), "low_util")
    assert "DataLoader" not in unknown.fix and "nsys profile" in unknown.fix
    assert "input pipeline that cannot keep" not in unknown.message  # not asserted as the cause


def test_idle_edges_are_not_staged_on_another_jobs_local_disk(job_report: Reports, gpu: Gpus) -> None:
    points = [0.0] * 15 + [30.0] * 75 + [1.0] * 10
    timeline = {"start": 0.0, "bucket_s": 10.0, "fields": ["util"], "points": [[u] for u in points]}
    hint = the(job_report([gpu(util=22.0, timeline=timeline)]), "low_util")
    assert hint.evidence["pattern"] == "idle_edges"
    assert "copy it to node-local disk" not in hint.fix and "deleted at its end" in hint.fix


def test_low_util_savings_are_an_estimate_not_throughput(job_report: Reports, gpu: Gpus) -> None:
    hint = the(job_report([gpu(util=20.0, sm_active=None)]), "low_util")
    assert hint.savings_gpu_hours == 0.8 and getattr(hint, "savings_kind", None) == "estimated"
    assert hint.to_dict()["savings"]["kind"] == "estimated"
    assert "rests on utilisation alone" in hint.message


def test_sm_activity_near_utilisation_is_idle_time_not_small_kernels(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=62.0, sm_active=45.0)])
    assert "falsely_busy" not in ids(report)
    hint = the(report, "low_sm")
    assert "waits between its steps" in hint.message and "CUDA graphs" not in hint.fix


def test_an_nccl_wait_is_not_launch_overhead(job_report: Reports, gpu: Gpus) -> None:
    traffic = {"nvlink_rx_mbps": 20000.0, "nvlink_tx_mbps": 20000.0}
    gpus = [gpu(minor=i, util=100.0, sm_active=8.0, power=180.0, **traffic)
            for i in range(4)]
    hint = the(job_report(gpus, frameworks=["pytorch"]), "falsely_busy")
    assert hint.evidence["cause"] == "waiting" and "slow rank" in hint.fix
    assert "CUDA graphs" not in hint.fix and "torch.compile" not in hint.fix
    assert hint.savings_gpu_hours is None


def test_power_alone_no_longer_judges_busy_gpus(job_report: Reports, gpu: Gpus) -> None:
    no_gpm = dict.fromkeys(NO_GPM)
    assert "falsely_busy" not in ids(job_report([gpu(util=90.0, power=200.0, **no_gpm)]))


def test_fp32_simulation_codes_are_not_sent_autocast(job_report: Reports, gpu: Gpus) -> None:
    md = [gpu(fp32_active=60.0, tensor_active=0.0)]
    assert "tensor_cores_unused" not in ids(job_report(md, frameworks=["cuda"]))
    unknown = the(job_report(md), "tensor_cores_unused")
    assert unknown.severity == "info" and "autocast" not in unknown.fix and "accuracy" in unknown.fix


def test_memory_bound_kernels_with_busy_sms_are_seen(job_report: Reports, gpu: Gpus) -> None:
    hint = the(job_report([gpu(dram_active=75.0, sm_active=90.0)]), "memory_bound")
    assert hint.evidence["kind"] == "kernels"


def test_a_busy_gpu_with_little_memory_is_no_mig_candidate(job_report: Reports, gpu: Gpus) -> None:
    assert "gpu_memory" not in ids(job_report([gpu(mem_used=15 * GIB)]))


@pytest.mark.parametrize("framework, fix", [("tensorflow", "set_memory_growth"),
                                            ("jax", "XLA_PYTHON_CLIENT_PREALLOCATE=false")])
def test_full_memory_is_information_for_preallocating_frameworks(
    job_report: Reports, gpu: Gpus, framework: str, fix: str,
) -> None:
    hint = the(job_report([gpu(mem_used=79 * GIB)], frameworks=[framework]), "gpu_memory")
    assert hint.severity == "info" and fix in hint.fix and "by design" in hint.message
    assert "gradient checkpointing" not in hint.fix and "risk of running out" not in hint.message


def test_pcie_is_judged_per_direction_against_the_measured_link(job_report: Reports, gpu: Gpus) -> None:
    gen3 = {"gen": 3, "width": 16, "max_gen": 3, "max_width": 16}  # 15.76 GB/s each way
    one_way = job_report([gpu(sm_active=40.0, pcie_rx_mbps=8000.0, pcie_tx_mbps=100.0, pcie_link=gen3)])
    hint = the(one_way, "pcie_bound")
    assert hint.evidence["link"] == "PCIe Gen3 x16" and hint.evidence["link_source"] == "measured"
    gen5 = {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16}
    both_ways = job_report([gpu(sm_active=40.0, pcie_rx_mbps=7000.0, pcie_tx_mbps=7000.0, pcie_link=gen5)])
    assert "pcie_bound" not in ids(both_ways)  # 14000 MiB/s in all, 12% of a Gen5 link each way


def test_nvlink_bound_never_suggests_fewer_gpus(job_report: Reports, gpu: Gpus) -> None:
    link = {"links": 18, "version": 4, "gbps_per_dir": 450.0}
    gpus = [gpu(minor=i, sm_active=40.0, nvlink_rx_mbps=300000.0, nvlink_tx_mbps=300000.0, nvlink=link)
            for i in range(2)]
    hint = the(job_report(gpus), "nvlink_bound")
    assert "fewer GPUs" not in hint.fix and hint.evidence["link_source"] == "measured"


def test_twelve_gpus_over_six_eight_gpu_nodes(job_report: Reports, gpu: Gpus) -> None:
    gpus = [gpu(node=f"gpu{n}", minor=m) for n in range(1, 7) for m in range(2)]
    shares = {f"gpu{n}": EIGHT_GPU_NODE for n in range(1, 7)}
    hint = the(job_report(gpus, node_shares=shares), "spread_nodes")
    assert hint.fix == "#SBATCH --nodes=2 --gres=gpu:6" and hint.evidence["gpus_per_node"] == 8


def test_more_cores_are_never_asked_beyond_the_nodes_share(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=30.0, sm_active=None)], ncpus=8, total_cpu_s=0.95 * 3600 * 8,
                        node_shares={"gpu1": EIGHT_GPU_NODE})
    hint = next(h for h in evaluate(report) if h.id == "cpu_side" and h.severity == "warning")
    assert "--cpus-per-gpu=16" not in hint.fix and "share of cores" in hint.fix


def test_memory_advice_floor_is_8_gib(job_report: Reports) -> None:
    hint = the(job_report(alloc_mem_bytes=64 * GIB, max_rss_bytes=GIB), "cpu_side")
    assert hint.fix.startswith("#SBATCH --mem=8G ")


@pytest.mark.parametrize("state", ["OUT_OF_MEMORY", "FAILED"])
def test_no_memory_advice_for_failed_or_oom_runs(job_report: Reports, state: str) -> None:
    report = job_report(alloc_mem_bytes=64 * GIB, max_rss_bytes=2 * GIB, state=state)
    assert "--mem" not in said(report)


# --- the missing rules, each with a near miss --------------------------------------------------


def test_one_busy_gpu_three_idle_holding_memory(job_report: Reports, gpu: Gpus) -> None:
    gpus = [gpu(util=92.0, sm_active=None)] + [gpu(minor=i, util=8.0, sm_active=None, mem_used=60 * GIB)
                                               for i in range(1, 4)]
    report = job_report(gpus, elapsed_s=300, frameworks=["pytorch"])
    hint = the(report, "imbalance")
    assert hint.severity == "warning" and "DistributedDataParallel" in hint.fix
    assert "60 GiB each" in hint.message and "rests on utilisation alone" in hint.message
    near = [gpu(util=92.0, sm_active=None)] + [gpu(minor=i, util=50.0, sm_active=None) for i in range(1, 4)]
    assert "imbalance" not in ids(job_report(near, elapsed_s=300))


def test_middling_utilisation_with_few_active_sms(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=45.0, sm_active=12.0)], elapsed_s=300)
    hint = the(report, "low_sm")
    assert hint.severity == "warning" and hint.evidence["sm_active_mean_pct"] == 12.0
    assert not verdict(report, evaluate(report)).startswith("Fair")
    assert "low_sm" not in ids(job_report([gpu(util=45.0, sm_active=50.0)], elapsed_s=300))


def test_input_read_in_the_main_process(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=30.0, sm_active=25.0)], ncpus=8, total_cpu_s=3600.0,
                        frameworks=["pytorch"])  # one core of eight busy
    hint = the(report, "main_loading")
    assert "num_workers=7" in hint.fix and hint.evidence["cores_busy_per_gpu"] == 1.0
    two_cores = job_report([gpu(util=30.0, sm_active=25.0)], ncpus=8, total_cpu_s=2 * 3600.0)
    assert "main_loading" not in ids(two_cores)


def test_cores_and_memory_above_the_nodes_share(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(), gpu(minor=1)], ncpus=32, alloc_mem_bytes=512 * GIB, total_cpu_s=32 * 3600.0,
                        node_shares={"gpu1": EIGHT_GPU_NODE})
    hint = the(report, "node_share")
    assert "--cpus-per-gpu=8" in hint.fix and "--mem-per-gpu=128G" in hint.fix
    at_share = job_report([gpu(), gpu(minor=1)], ncpus=16, alloc_mem_bytes=256 * GIB,
                          total_cpu_s=16 * 3600.0, node_shares={"gpu1": EIGHT_GPU_NODE})
    assert "node_share" not in ids(at_share)
    assert "node_share" not in ids(job_report([gpu(), gpu(minor=1)], ncpus=32))  # shares unknown


def test_an_idle_mig_slice(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=None, power=None, mig_gi_id=3, sm_active=1.0, mem_used=GIB // 2)])
    hint = the(report, "idle_mig")
    assert hint.severity == "critical" and "CPU job" in hint.fix
    busy = job_report([gpu(util=None, power=None, mig_gi_id=3, sm_active=5.0)])
    assert "idle_mig" not in ids(busy)


def test_an_idle_interactive_session(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=10.0, idle_s=5760.0, sampled_s=7200.0)], elapsed_s=7200, interactive=True)
    hint = the(report, "idle_interactive")
    assert hint.evidence["idle_time_pct"] == 80.0 and hint.savings_kind == "measured"
    assert hint.savings_gpu_hours == 1.6
    near = job_report([gpu(util=10.0, idle_s=2880.0, sampled_s=7200.0)], elapsed_s=7200, interactive=True)
    assert "idle_interactive" not in ids(near)


# --- the "no harm" set: what each job shape must not be told --------------------------------


def test_no_harm_fp32_simulation(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(fp32_active=70.0, tensor_active=0.0, dram_active=50.0)], frameworks=["cuda"])
    text = said(report)
    for harmful in ("autocast", "bfloat16", "bf16", "mixed precision", "torch", "DataLoader"):
        assert harmful not in text
    assert verdict(report, evaluate(report)).startswith("Good")


def test_no_harm_preallocating_framework(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(mem_used=78 * GIB)], frameworks=["jax"])
    text = said(report)
    assert "risk of running out" not in text and "gradient checkpointing" not in text
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" in text
    assert all(h.severity == "info" for h in evaluate(report))


def test_no_harm_sharded_model_with_idle_but_full_gpus(job_report: Reports, gpu: Gpus) -> None:
    gpus = [gpu()] + [gpu(minor=i, util=1.0, mem_used=70 * GIB) for i in range(1, 4)]
    report = job_report(gpus, frameworks=["pytorch"])
    text = said(report)
    assert "--gres=gpu:1" not in text and "--gpus=" not in text and "CPU job" not in text
    assert "Check the sharding" in text


def test_no_harm_nccl_wait_at_full_utilisation(job_report: Reports, gpu: Gpus) -> None:
    gpus = [gpu(minor=i, util=100.0, sm_active=10.0 if i else 70.0, power=170.0) for i in range(8)]
    report = job_report(gpus, frameworks=["pytorch"])
    text = said(report)
    for harmful in ("CUDA graphs", "reduce-overhead", "fewer GPUs", "--gres=gpu:"):
        assert harmful not in text
    assert "slow rank" in text


def test_no_harm_job_failing_after_20_seconds(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=0.0, mem_used=GIB)], state="FAILED", elapsed_s=20,
                        alloc_mem_bytes=64 * GIB, max_rss_bytes=GIB, timelimit_s=86400)
    text = said(report)
    for harmful in ("CPU job", "--gres", "--mem", "--time", "Poor", "critical"):
        assert harmful not in text
    assert "Failed early" in text and "not a verdict" in text


def test_no_harm_interactive_session(job_report: Reports, gpu: Gpus) -> None:
    report = job_report([gpu(util=1.0, idle_s=6800.0, sampled_s=7200.0, mem_used=GIB)], elapsed_s=7200,
                        interactive=True, frameworks=["pytorch"])
    text = said(report)
    for harmful in ("CPU job", "DataLoader", "--gres", "dependency"):
        assert harmful not in text
    assert "End the session" in text and "scancel" in text


# --- savings said as measured or estimated --------------------------------------------------


def test_json_and_text_say_whether_savings_are_measured(job_report: Reports, gpu: Gpus) -> None:
    from slurm_gpu_eff.report.render import render_text

    report = job_report([gpu(), gpu(minor=1, util=1.0, mem_used=0), gpu(minor=2, util=59.0, sm_active=30.0)])
    by_id = {h["id"]: h for h in report.to_dict()["hints"]}
    assert by_id["idle_gpus"]["savings"]["kind"] == "measured"
    assert by_id["low_sm"]["savings"]["kind"] == "estimated" and by_id["low_sm"]["savings"]["how"]
    assert by_id["low_sm"]["savings_gpu_hours"] == by_id["low_sm"]["savings"]["gpu_hours"]
    text = render_text(report)
    assert "would have saved: 1.000 GPU-hours on this job (measured idle)" in text
    assert "could save: up to" in text


# --- the review of the rules above (each failed on the rules as first built) ------------------

TWO_CORES_A_GPU = {"cpus": 16, "mem_mb": 1024 * 1024, "gpus": 8}  # 2 cores and 128 GiB per GPU


def test_feeding_the_gpu_asks_no_cores_beyond_the_nodes_share(job_report: Reports, gpu: Gpus) -> None:
    hist = [2800.0, 0, 0, 0, 0, 0, 0, 0, 0, 800.0]  # alternating phases
    report = job_report([gpu(util=22.0, util_histogram_s=hist)], ncpus=2, frameworks=["pytorch"],
                        node_shares={"gpu1": TWO_CORES_A_GPU})
    hint = the(report, "low_util")
    assert "DataLoader" in hint.fix and "--cpus-per-gpu" not in hint.fix
    unknown = the(job_report([gpu(util=22.0, util_histogram_s=hist)], ncpus=2, frameworks=["pytorch"]),
                  "low_util")
    assert "--cpus-per-gpu=4" in unknown.fix and "no more than the node's cores per GPU" in unknown.fix


def test_node_share_never_cuts_memory_below_the_peak(job_report: Reports, gpu: Gpus) -> None:
    big = dict(ncpus=32, alloc_mem_bytes=512 * GIB, total_cpu_s=32 * 3600.0,
               node_shares={"gpu1": EIGHT_GPU_NODE})
    needed = job_report([gpu(), gpu(minor=1)], max_rss_bytes=400 * GIB, **big)  # 2 x 128 GiB < 1.2 x 400
    assert "--cpus-per-gpu=8" in the(needed, "node_share").fix and "--mem" not in said(needed)
    assert "--mem-per-gpu=128G" in the(job_report([gpu(), gpu(minor=1)], max_rss_bytes=100 * GIB, **big),
                                       "node_share").fix
    for state in ("OUT_OF_MEMORY", "FAILED"):  # a failed run's peak says nothing of its need
        assert "--mem" not in said(job_report([gpu(), gpu(minor=1)], max_rss_bytes=GIB, state=state, **big))


def test_copy_traffic_gets_no_pytorch_idiom_outside_pytorch(job_report: Reports, gpu: Gpus) -> None:
    copies = [gpu(dram_active=70.0, sm_active=30.0)]
    for frameworks in (["cuda"], ["jax"], None):
        assert ".contiguous()" not in the(job_report(copies, frameworks=frameworks), "memory_bound").fix
    assert ".contiguous()" in the(job_report(copies, frameworks=["pytorch"]), "memory_bound").fix


def test_no_fewer_gpus_where_the_idle_ones_memory_was_not_measured(job_report: Reports, gpu: Gpus) -> None:
    hint = the(job_report([gpu(), gpu(minor=1, util=1.0, mem_used=None)]), "idle_gpus")
    assert "--gres=gpu:1" not in hint.fix and "sharding" in hint.fix
    assert "memory not measured" in hint.message


def test_uneven_gpus_holding_memory_are_not_told_ddp_alone(job_report: Reports, gpu: Gpus) -> None:
    """Others holding tens of GiB may be a model split over the GPUs: DDP puts a whole
    replica on every GPU, which such a model does not fit."""
    gpus = [gpu(util=92.0)] + [gpu(minor=i, util=8.0, sm_active=8.0, mem_used=60 * GIB) for i in range(1, 4)]
    hint = the(job_report(gpus, elapsed_s=300, frameworks=["pytorch"]), "imbalance")
    assert not hint.fix.startswith("Use DistributedDataParallel") and "split" in hint.fix
    assert "the model is spread over them" not in hint.message
    light = [gpu(util=92.0)] + [gpu(minor=i, util=8.0, sm_active=8.0, mem_used=GIB) for i in range(1, 4)]
    assert the(job_report(light, elapsed_s=300, frameworks=["pytorch"]), "imbalance").fix.startswith(
        "Use DistributedDataParallel")


def test_cpu_bound_and_mig_advice_say_they_rest_on_utilisation(job_report: Reports, gpu: Gpus) -> None:
    cpu_bound = job_report([gpu(util=30.0, sm_active=None)], ncpus=8, total_cpu_s=0.95 * 3600 * 8)
    hint = next(h for h in evaluate(cpu_bound) if h.id == "cpu_side" and h.severity == "warning")
    assert "rests on utilisation alone" in hint.message
    small = job_report([gpu(util=15.0, sm_active=None, mem_used=4 * GIB)])
    assert "rests on utilisation alone" in the(small, "gpu_memory").message
    measured = job_report([gpu(util=15.0, sm_active=12.0, mem_used=4 * GIB)])
    assert "rests on utilisation alone" not in the(measured, "gpu_memory").message


def test_a_site_cannot_raise_the_gate_past_five_minutes(make_job: Any, make_summary: Any, gpu: Gpus) -> None:
    """A site's too_early.early_s = 3600 would hide a failed run of ten minutes: the gate
    stops at five whatever the setting (a lower one is the site's)."""
    from slurm_gpu_eff.report.hints import HintSettings
    from slurm_gpu_eff.report.job import build_report

    job = make_job(state="FAILED", elapsed_s=600, gpus=2, nodelist="gpu1")
    summary = make_summary(node="gpu1", gpus=[gpu(), gpu(minor=1, util=0.0, mem_used=0)])
    raised = build_report(job, [summary], HintSettings.from_config({"too_early.early_s": "3600"}))
    said = {h.id for h in raised.hints}  # judged with the site's settings (ids() takes the defaults)
    assert "too_early" not in said and "idle_gpus" in said
    lowered = build_report(make_job(state="FAILED", elapsed_s=120, gpus=1, nodelist="gpu1"),
                           [make_summary(node="gpu1", gpus=[gpu()])],
                           HintSettings.from_config({"too_early.early_s": "60"}))
    assert "too_early" not in {h.id for h in lowered.hints}
