"""What the GPUs really did, per metric, against each profile's truth, on the real cluster.

gpu1 and gpu2 have simulated H100s (GPM: SM activity and pipes); gpu3 has A100s
without GPM, whose SM figures must be absent (null), never zero.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Cluster

pytestmark = [pytest.mark.cluster]  # the node side: the store's engine changes nothing here

H100_IDLE_W = 70.0


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def test_square_wave_that_snapshots_alias_is_measured_within_a_point(cluster: Cluster) -> None:
    """1 s period, 30% duty: a poll every 30 s (or every 1 s) sees 0 or 100; the driver's
    sample buffer, read losslessly, sees 30."""
    wave = {"low": 0, "high": 100, "period_s": 1, "duty": 0.3}
    profile = cluster.profile([{"seconds": 20, "gpus": {"*": {
        "util": wave, "sm_active": 45, "tensor_active": 20, "dram_active": 35,
        "fp32_active": 15, "pcie_rx_mbps": 900, "nvlink_tx_mbps": 300, "power_w": 400,
        "mem_used_gib": 12}}}])
    job = cluster.submit_profile("alice", profile, "-w", "gpu1", "--gres=gpu:1")
    assert cluster.wait_done(job) == "COMPLETED"
    gpu = cluster.gpueff(job, "alice", "--json").json()["gpus"][0]
    summary = cluster.summaries(job)["gpu1"]
    t0, t1 = summary["sampled_from"], summary["sampled_until"]
    busy = overlap(t0, t1, *cluster.played(job))  # the workload's own times: the GPU may have a new job now
    # Utilisation is measured from the driver's sample windows, which cover [t0, t1].
    util_truth = 30.0 * busy / (t1 - t0)
    assert gpu["util_source"] == "samples"
    assert abs(gpu["util_mean"] - util_truth) <= 1.0, (gpu["util_mean"], util_truth)
    assert gpu["util_max"] >= 80  # a 1/6 s window inside a 0.3 s burst is mostly busy
    for metric, value in (("sm_active", 45), ("tensor_active", 20), ("dram_active", 35),
                          ("fp32_active", 15), ("pcie_rx_mbps", 900), ("nvlink_tx_mbps", 300)):
        truth = value * busy / (t1 - t0)
        assert abs(gpu[f"{metric}_mean"] - truth) <= max(1.0, 0.01 * truth), (metric, gpu)
        assert gpu[f"{metric}_max"] == pytest.approx(value, abs=0.5)
    assert gpu["fp64_active_mean"] == 0.0  # measured and idle: zero, not null
    energy_truth = 400 * busy + H100_IDLE_W * ((t1 - t0) - busy)
    assert gpu["energy_source"] == "counter"
    assert abs(gpu["energy_j"] - energy_truth) <= 0.02 * energy_truth
    # Idle is counted in the driver's 1/6 s windows: of the 6 in each 1 s period, the
    # 0.3 s burst touches 2 or 3, so 3 or 4 read idle (< 5%).
    assert sum(gpu["util_histogram"]) == pytest.approx(1.0)
    rest = (t1 - t0) - busy
    low, high = (0.5 * busy + rest) / (t1 - t0), (4 / 6 * busy + rest) / (t1 - t0)
    assert low - 0.02 <= gpu["idle_fraction"] <= high + 0.02, (low, gpu["idle_fraction"], high)
    assert gpu["timeline"]["points"] and len(gpu["timeline"]["points"]) <= 720


@pytest.mark.serial  # needs all three nodes at once
def test_three_node_job_merges_nodes_and_says_which_part_is_missing(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 10, "gpus": {
        "*": {"util": 80, "sm_active": 60, "power_w": 350}, "1": {"util": 20}}}])
    job = cluster.submit_profile("bob", profile, "-N", "3", "--gres=gpu:2", "-J", "three-nodes",
                                 runner="srun")
    assert cluster.wait_done(job) == "COMPLETED"
    # Three nodes' final summaries reach the store (and the AdminComment) one by one: under
    # load a read between them says "partial", naming what is missing, as it should. The
    # test wants the whole job: it waits for it (bounded), and says what it saw if not.
    end = time.monotonic() + 60
    while True:
        data = cluster.gpueff(job, "bob", "--json").json()
        if (data["gpu_status"] == "complete" and data["missing_nodes"] == []) or time.monotonic() > end:
            break
        time.sleep(2)
    assert data["gpu_status"] == "complete" and data["missing_nodes"] == [], (
        data["gpu_status"], data["missing_nodes"],
        [(g["node"], g.get("status"), g.get("errors")) for g in data["gpus"]])
    by_node: dict[str, list[dict[str, Any]]] = {}
    for gpu in data["gpus"]:
        by_node.setdefault(gpu["node"], []).append(gpu)
    assert sorted(by_node) == ["gpu1", "gpu2", "gpu3"]
    for node, gpus in by_node.items():
        assert len(gpus) == 2
        assert gpus[0]["util_mean"] > 50 > gpus[1]["util_mean"] > 5  # per position
        if node == "gpu3":  # A100: no GPM, so SM activity is unknown, not zero
            assert gpus[0]["sm_active_mean"] is None and gpus[0]["gpm"] is False
        else:
            assert gpus[0]["sm_active_mean"] > 30 and gpus[0]["gpm"] is True
    assert data["gpu_hours_allocated"] == pytest.approx(6 * data["elapsed_s"] / 3600)
    text = cluster.gpueff(job, "bob").out
    assert text.count("gpu3 ") >= 2 and "n/a" in text

    # One node's part goes missing (a lost delivery): the report names it. Its figures
    # then never reached the AdminComment either (the users' read path): write it again
    # from the store as the deliverer would.
    assert cluster.store_execute("delete from node_summaries where job_id = ? and node = 'gpu2'",
                                 (job,)) == 1
    remirror = ("import sys\nfrom slurm_gpu_eff.config import load_config\n"
                "from slurm_gpu_eff.mirror import admin_comment\n"
                "from slurm_gpu_eff.slurm.access import connect\n"
                "from slurm_gpu_eff.store import open_store\n"
                "c = load_config()\nwith open_store(c.store_url) as store:\n"
                "    s = store.node_summaries(sys.argv[1])\n"
                "connect(c).set_comment(sys.argv[1], s[0].cluster, admin_comment(s, 6))\n")
    done = cluster.run([cluster.python, "-c", remirror, job])
    assert done.code == 0, done.err
    data = cluster.gpueff(job, "bob", "--json").json()
    assert data["gpu_status"] == "partial" and data["missing_nodes"] == ["gpu2"]
    assert any("gpu2" in note and "missing" in note for note in data["notes"])


def test_array_job_reports_each_task_and_totals(cluster: Cluster) -> None:
    # 10 s at 60%: a task's idle start and end (three start at once) may take 10 s together
    # before its mean falls to the bar of 30
    profile = cluster.profile([{"seconds": 10, "gpus": {"*": {"util": 60}}}])
    array = cluster.submit_profile("alice", profile, "--array=1-3", "--gres=gpu:1")
    for task in ("1", "2", "3"):
        cluster.wait_done(f"{array}_{task}")
    whole = cluster.gpueff(array, "alice", "--json")
    assert whole.code == 0, whole.err
    data = whole.json()
    assert data["kind"] == "array" and data["totals"]["tasks"] == 3
    assert sorted(t["job_id"] for t in data["tasks"]) == [f"{array}_{i}" for i in (1, 2, 3)]
    assert data["totals"]["gpu_hours_allocated"] == pytest.approx(
        sum(t["gpu_hours_allocated"] for t in data["tasks"]))
    for task in data["tasks"]:
        assert 30 < task["gpu_util_mean"] < 70
    one = cluster.gpueff(f"{array}_2", "alice", "--json").json()
    assert one["job_id"] == f"{array}_2" and len(one["gpus"]) == 1
    text = cluster.gpueff(array, "alice").out
    assert "array job, 3 parts" in text and "TOTAL" in text


def test_lost_gpu_throttling_xid_and_an_untouched_gpu(cluster: Cluster) -> None:
    profile = cluster.profile([
        {"seconds": 8, "gpus": {"0": {"util": 90, "power_w": 500, "throttle": ["power_cap"]},
                                "1": {"util": 0, "processes": 0}}},
        {"seconds": 6, "gpus": {"0": {"util": 90, "lost": True, "xid": [79]},
                                "1": {"util": 0, "processes": 0}}},
    ])
    job = cluster.submit_profile("alice", profile, "-w", "gpu2", "--gres=gpu:2")
    assert cluster.wait_done(job) == "COMPLETED"
    assert "drain" not in cluster.node_state("gpu2")
    data = cluster.gpueff(job, "alice", "--json").json()
    lost, idle = data["gpus"]
    assert lost["lost_at"] is not None and any("GPU lost" in f for f in lost["hardware_faults"])
    assert any("XID 79" in f for f in lost["hardware_faults"])
    assert lost["util_mean"] > 60  # figures up to the loss, not diluted by what came after
    assert lost["throttle_fraction"]["power_cap"] > 0.5
    assert lost["throttle_fraction"]["hw_thermal"] == 0
    assert idle["never_used"] is True and idle["processes_max"] == 0
    assert lost["never_used"] is False
    text = cluster.gpueff(job, "alice").out
    assert "not a fault of the job" in text and "power cap" in text


def test_heterogeneous_job_reports_each_component(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 6, "gpus": {"*": {"util": 70}}}])
    body = (
        "#SBATCH --gres=gpu:1 --mem=200M -w gpu1\n#SBATCH hetjob\n"
        "#SBATCH --gres=gpu:1 --mem=200M -w gpu2\n"
        f"srun --het-group=0,1 {cluster.sim} run {profile}"
    )
    job = cluster.submit("bob", body)
    cluster.wait_done(f"{job}+0")
    cluster.wait_done(f"{job}+1")
    data = cluster.gpueff(job, "bob", "--json").json()
    assert data["kind"] == "heterogeneous"
    parts = {t["job_id"]: t for t in data["tasks"]}
    assert sorted(parts) == [f"{job}+0", f"{job}+1"]
    assert [len(parts[f"{job}+{i}"]["gpus"]) for i in (0, 1)] == [1, 1]
    assert [parts[f"{job}+{i}"]["gpus"][0]["node"] for i in (0, 1)] == ["gpu1", "gpu2"]
    assert all(g["util_mean"] > 30 for t in data["tasks"] for g in t["gpus"])
    assert data["totals"]["gpu_hours_allocated"] == pytest.approx(
        sum(t["gpu_hours_allocated"] for t in data["tasks"]))


@pytest.mark.serial  # its bars of 2 and 3 points, on a machine no other job loads
def test_shared_gpu_is_said_and_the_jobs_own_share_is_measured(cluster: Cluster) -> None:
    """Another job's process on the GPU (the sim lists pid 1, which is in no job's cgroup):
    the report says the GPU was shared and splits out this job's own processes."""
    # 12.9 s: the polls (1 s) mostly fall just before the workload's whole seconds, so it
    # ends late in one; that poll, read as idle, cost 4 points of a 3-point bar
    profile = cluster.profile([{"seconds": 12.9, "gpus": {"*": {"util": 50, "shared_util": 30}}}])
    job = cluster.submit_profile("alice", profile, "-w", "gpu1", "--gres=gpu:1")
    assert cluster.wait_done(job) == "COMPLETED"
    data = cluster.gpueff(job, "alice", "--json").json()
    gpu = data["gpus"][0]
    node = gpu["node"]
    assert gpu["shared_with"] == ["processes outside any job"]
    started, ended = cluster.played(job)
    summary = cluster.summaries(job)[node]
    window = summary["sampled_until"] - summary["sampled_from"]
    assert gpu["shared_fraction"] == pytest.approx((ended - started) / window, abs=0.15)
    assert abs(gpu["util_whole_mean"] - cluster.truth(job, node, 80)) <= 2.0  # the whole GPU
    # This job's processes: read from the first poll that saw the other process (the
    # workload's start) to the sampler's end. The poll the workload left the GPU in is left
    # out, the rest of the tail after it counts idle: at least 50, less all the tail.
    own = summary["gpus"][0]["metrics"]["own_util"]
    tail = max(0.0, summary["sampled_until"] - ended)
    assert 50 * (1 - tail / own["seconds"]) - 1.0 <= gpu["own_util_mean"] <= 50 + 1.0
    assert gpu["util_mean"] == gpu["own_util_mean"]  # what the job is charged with
    assert any("was shared with processes outside any job" in n for n in data["notes"])


def test_a_gpu_used_by_the_job_alone_is_not_shared(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 4, "gpus": {"*": {"util": 50}}}])
    job = cluster.submit_profile("bob", profile, "-w", "gpu2", "--gres=gpu:1")
    assert cluster.wait_done(job) == "COMPLETED"
    gpu = cluster.gpueff(job, "bob", "--json").json()["gpus"][0]
    # the workload's pid was traced to this job through its cgroup
    assert gpu["shared_fraction"] == 0.0 and gpu["shared_with"] == []
    assert gpu["processes_max"] == 1 and gpu["own_util_mean"] is None
