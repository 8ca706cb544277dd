"""sbatch -> prolog -> sampler -> epilog -> store -> `gpueff`, on the real development cluster."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from tests import pg

from .conftest import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_store]

NODE = "gpu1"
IDLE = {"util": 0.0, "power_w": 70.0}  # the dev cluster's idle H100 (scripts/cluster.sh)


def window_truth(
    phases: list[tuple[float, dict[str, float]]], metric: str,
    started: float, ended: float, t0: float, t1: float,
) -> float:
    """Mean of a constant-phase profile over wall time [t0, t1], idle outside the workload."""
    total, covered, start = 0.0, 0.0, started
    for seconds, values in phases:
        lo, hi = max(t0, start), min(t1, start + seconds, ended)
        if hi > lo:
            total += values.get(metric, IDLE[metric]) * (hi - lo)
            covered += hi - lo
        start += seconds
    return (total + IDLE[metric] * ((t1 - t0) - covered)) / (t1 - t0)


def node_summary(cluster: Cluster, job_id: str) -> dict[str, Any]:
    rows = cluster.store_rows("select body from node_summaries where job_id = ?", (job_id,))
    assert len(rows) == 1, rows
    return pg.as_json(rows[0][0])


@pytest.mark.serial  # reads the simulated GPUs' last job: no other may use them after it
def test_two_gpu_job_reports_the_profiles_truth(cluster: Cluster) -> None:
    gpu0 = [(15, {"util": 80, "power_w": 400}), (8, {"util": 100, "power_w": 600})]
    gpu1 = [(15, {"util": 80, "power_w": 400}), (8, {"util": 10, "power_w": 150})]
    profile = cluster.profile([
        {"seconds": 15, "gpus": {"*": {"util": 80, "power_w": 400, "mem_used_gib": 30}}},
        {"seconds": 8, "gpus": {"0": {"util": 100, "power_w": 600},
                                "1": {"util": 10, "power_w": 150}}},
    ])
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:2", "-J", "known-averages")
    assert cluster.wait_done(job) == "COMPLETED"
    report = cluster.gpueff(job, "alice", "--json")
    assert report.code == 0, report.err
    data = report.json()
    summary = node_summary(cluster, job)
    job_gpus = [int(i) for i in summary["job_gpus"].split(",")]
    assert f"SLURM_JOB_GPUS={summary['job_gpus']}" in cluster.output(job)

    assert data["job_id"] == job and data["user"] == "alice" and data["state"] == "COMPLETED"
    assert data["gpu_status"] == "complete"
    assert [(g["node"], g["minor"]) for g in data["gpus"]] == [(NODE, m) for m in job_gpus]
    t0, t1 = summary["sampled_from"], summary["sampled_until"]
    for position, (gpu, phases) in enumerate(zip(data["gpus"], (gpu0, gpu1), strict=True)):
        state = cluster.sim_state(NODE, gpu["minor"])
        assert state["job_id"] == job and state["position"] == position
        util = window_truth(phases, "util", state["started_at"], state["ended_at"], t0, t1)
        power = window_truth(phases, "power_w", state["started_at"], state["ended_at"], t0, t1)
        assert abs(gpu["util_mean"] - util) <= 2.0, (gpu, util)
        assert abs(gpu["power_mean_w"] - power) <= 0.05 * power, (gpu, power)
        assert gpu["mem_used_max_bytes"] == 30 * 1024**3
        assert gpu["mem_total_bytes"] == 80 * 1024**3
        assert gpu["samples"] >= 20 and gpu["uuid"].startswith("GPU-")
        assert abs(gpu["energy_j"] - power * (t1 - t0)) <= 0.05 * power * (t1 - t0)
    # The node's other GPUs were not sampled: only the job's GPUs are in the summary.
    assert sorted(g["minor"] for g in summary["gpus"]) == sorted(job_gpus)
    assert data["gpu_hours_allocated"] == pytest.approx(2 * data["elapsed_s"] / 3600)
    assert data["cpu_efficiency"] is not None and data["mem_efficiency"] is not None

    text = cluster.gpueff(job, "alice")
    assert text.code == 0
    assert f"Job ID: {job}" in text.out and "GPU Utilisation:" in text.out
    assert "CPU Efficiency:" in text.out and "Memory Efficiency:" in text.out


@pytest.mark.serial  # needs its node to itself: which GPU the job gets is the point
def test_job_on_the_second_gpu_is_reported_on_minor_1(cluster: Cluster) -> None:
    blocker = cluster.submit("bob", "sleep 120", "-w", NODE, "--gres=gpu:1", "-J", "blocker")
    cluster.wait_state(blocker, {"RUNNING"})
    try:
        profile = cluster.profile([{"seconds": 10, "gpus": {"*": {"util": 70}}}])
        job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1")
        assert cluster.wait_done(job) == "COMPLETED"
    finally:
        cluster.run(["scancel", blocker])
    # Inside the job, CUDA numbering starts at 0 again; Slurm's node-level index does not.
    assert "SLURM_JOB_GPUS=1 CUDA_VISIBLE_DEVICES=0" in cluster.output(job)
    data = cluster.gpueff(job, "alice", "--json").json()
    assert [g["minor"] for g in data["gpus"]] == [1]
    assert data["gpus"][0]["util_mean"] > 50


def test_killed_sampler_gives_partial_figures_and_a_healthy_node(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 16, "gpus": {"*": {"util": 60, "power_w": 300}}}])
    submitted = time.time()
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    job_dir = cluster.spool(NODE) / "jobs" / job

    def workload_checkpointed() -> float:
        """Seconds of this job's workload the sampler's last checkpoint holds."""
        try:
            summary = json.loads((job_dir / "summary.json").read_text())
            started = cluster.sim_state(NODE, summary["gpus"][0]["minor"])["started_at"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return 0.0
        if started < submitted:
            return 0.0  # the GPU's last workload, not this job's yet
        return float(summary["sampled_until"] - started)

    deadline = time.monotonic() + 60
    while workload_checkpointed() < 3 and time.monotonic() < deadline:  # real load landed
        time.sleep(0.2)
    pid = int((job_dir / "sampler.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()

    assert cluster.wait_done(job) == "COMPLETED"
    assert "drain" not in cluster.node_state(NODE)
    data = cluster.gpueff(job, "alice", "--json").json()
    assert data["gpu_status"] == "partial"
    assert any("stopped unexpectedly" in note for note in data["notes"])
    assert data["sampled_until"] <= killed_at
    assert data["gpus"][0]["samples"] > 0 and data["gpus"][0]["util_mean"] > 30
    text = cluster.gpueff(job, "alice").out
    assert "partial" in text and "stopped unexpectedly" in text


def test_running_job_shows_figures_so_far(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 25, "gpus": {"*": {"util": 90}}}])
    job = cluster.submit_profile("bob", profile, "-w", NODE, "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    deadline = time.monotonic() + 30
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = cluster.gpueff(job, "bob", "--json")
        if result.code == 0:
            data = result.json()
            if data["gpus"] and data["gpus"][0]["util_mean"] and data["gpus"][0]["util_mean"] > 50:
                break
        time.sleep(1)
    assert data.get("gpu_status") == "running", data
    assert data["state"] == "RUNNING" and data["gpus"][0]["samples"] > 0
    cluster.run(["scancel", job])
    cluster.wait_done(job)


@pytest.mark.serial  # the store is down for every job meanwhile
def test_store_down_at_job_end_loses_nothing(cluster: Cluster) -> None:
    """The epilog cannot reach the store (SQLite: the file held locked; PostgreSQL: the
    server stopped): it returns at once all the same, the summary waits in the spool
    (`gpueff spool status` says so), and once the store is back it arrives by itself: no
    new job on the node, no command."""
    # long enough that sacct (which can lag seconds behind slurmctld on a loaded machine)
    # shows it RUNNING before it ends: the store must be down before its epilog
    profile = cluster.profile([{"seconds": 10, "gpus": {"*": {"util": 55}}}])
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    with cluster.store_down():  # the store is "down" until we let go
        assert cluster.wait_done(job) == "COMPLETED"
        outbox = cluster.spool(NODE) / "outbox"
        pending = [*outbox.glob(f"*-{job}-{NODE}-*.json"), *outbox.glob(f"inflight/*-{job}-{NODE}-*.json")]
        assert pending, "the summary should wait in the spool"
        status = cluster.run(["gpueff", "spool", "status", "--node", NODE])
        assert status.code == 0 and f"-{job}-{NODE}-" in status.out, status
    deadline = time.monotonic() + 60
    while True:
        done = cluster.gpueff(job, "alice", "--json")
        if done.code == 0 and done.json()["gpu_status"] == "complete":
            break
        assert time.monotonic() < deadline, f"the summary never arrived: {done.out}{done.err}"
        time.sleep(1)
    assert abs(done.json()["gpu_util_mean"] - 55) < 10


def test_clear_errors_for_unknown_job_and_job_without_gpus(cluster: Cluster) -> None:
    # The cluster keeps jobs private (PrivateData=jobs): to a user, an unknown job and
    # another user's are one answer, "not permitted" (docs/security.md); root is told.
    unknown = cluster.gpueff("987654", "alice")
    assert unknown.code == 10 and unknown.err.count("\n") == 1 and "987654" in unknown.err
    assert "PrivateData=jobs" in unknown.err
    unknown_to_root = cluster.run(["gpueff", "987654"])
    assert unknown_to_root.code == 3 and "987654 is not in Slurm's accounting" in unknown_to_root.err
    bad = cluster.gpueff("12;rm -rf /", "alice")
    assert bad.code == 2 and "not a Slurm job id" in bad.err
    cpu_job = cluster.submit("alice", "true")
    cluster.wait_done(cpu_job)
    none = cluster.gpueff(cpu_job, "alice")
    assert none.code == 4 and "has no GPUs" in none.err
    assert "Traceback" not in unknown.err + unknown_to_root.err + bad.err + none.err


def test_slurm_index_is_bound_through_the_device_file_not_assumed_to_be_the_minor(
    cluster: Cluster,
) -> None:
    """On gpu2, Slurm's GPU 0 is the device file nvidia0, whose minor is 3 (as AutoDetect
    may order GPUs by PCI bus): the job is confined to minor 3, and measured there."""
    profile = cluster.profile([{"seconds": 6, "gpus": {"*": {"util": 75}}}])
    probe = ("for f in " + str(cluster.dir / "nodes" / "gpu2") + "/nvidia?; do "
             "cat $f 2>&1 | grep -q 'not permitted' || echo allowed $f; done")
    job = cluster.submit_profile("alice", profile, "-w", "gpu2", "--gres=gpu:1", before=probe)
    assert cluster.wait_done(job) == "COMPLETED"
    output = cluster.output(job)
    allowed = [line.split()[-1] for line in output.splitlines() if line.startswith("allowed ")]
    assert len(allowed) == 1, output  # cgroup confinement: one device file
    index = int(allowed[0][-1])
    assert f"SLURM_JOB_GPUS={index} " in output
    minor = os.minor(os.stat(allowed[0]).st_rdev)
    assert minor == 3 - index != index
    data = cluster.gpueff(job, "alice", "--json").json()
    assert [g["minor"] for g in data["gpus"]] == [minor]
    assert data["gpus"][0]["util_mean"] > 50  # the workload drove that same device


def test_a_requeued_job_reports_the_run_sacct_reports(cluster: Cluster) -> None:
    """Issue 8, finding 5: a job preempted on one node and rerun on another is the same
    job id, two runs. Before, both runs' GPUs were merged: 2 GPUs for 1 allocated and a
    false idle verdict. Now the report counts the run sacct reports and names the other."""
    profile = cluster.profile([{"seconds": 12, "gpus": {"*": {"util": 70}}}])
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1", "--requeue")
    cluster.wait_state(job, {"RUNNING"})
    deadline = time.monotonic() + 30
    while not list((cluster.dir / "log").glob("gpueff-*.log")) or not any(
        f"job={job} sampler" in p.read_text() and "sampling" in p.read_text()
        for p in (cluster.dir / "log").glob("gpueff-*.log")
    ):
        assert time.monotonic() < deadline, "the first run was never sampled"
        time.sleep(0.2)
    time.sleep(3)
    assert cluster.run(["scontrol", "requeue", job]).code == 0
    other = "gpu3" if NODE != "gpu3" else "gpu2"
    deadline = time.monotonic() + 90
    # Slurm holds a requeued job for about 2 min once it is pending again: release it now,
    # on another node (an update made while the first run is still completing is lost).
    while cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).out.strip() != "RUNNING":
        assert time.monotonic() < deadline, "the requeued job never ran again"
        if cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).out.strip() == "PENDING":
            cluster.run(["scontrol", "update", f"jobid={job}", f"reqnodelist={other}", "starttime=now"])
        time.sleep(1)
    assert cluster.wait_done(job, timeout=120) == "COMPLETED"
    # The first run's line may be the one in the AdminComment a while yet: "this run has no
    # GPU figures stored yet" (exit 5) until the second run's is written, as a user sees.
    deadline = time.monotonic() + 30
    while (done := cluster.gpueff(job, "alice", "--json")).code == 5 and time.monotonic() < deadline:
        time.sleep(1)
    assert done.code == 0, done.err
    data = done.json()
    assert [g["node"] for g in data["gpus"]] == [other]
    assert data["idle_gpus"] == 0 and data["gpus"][0]["util_mean"] > 50
    assert any(f"earlier runs of job id {job}" in n and f"{NODE} from" in n for n in data["notes"])
