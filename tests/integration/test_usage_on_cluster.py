"""`gpueff report` on the development cluster (issue 10): simulated jobs by two users,
then the report's figures against the sum of each job's own `gpueff JOBID --json`, and a
user's `--me` against the other user's jobs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Cluster

# serial: it counts every job alice and bob ran in its period
pytestmark = [pytest.mark.cluster, pytest.mark.cluster_store, pytest.mark.serial]
NOT_PERMITTED = 10


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


@pytest.fixture(scope="module")
def period_jobs(cluster: Cluster) -> dict[str, Any]:
    """alice: a 2-GPU job with one GPU idle and a busy 1-GPU job; bob: a 1-GPU job. The
    period starts when neither has a job left in the queue, so none crosses its start."""
    end = time.monotonic() + 120
    while cluster.run(["squeue", "-h", "-u", "alice,bob"]).out.strip() and time.monotonic() < end:
        time.sleep(1)
    since = time.time() - 1
    half = cluster.profile([{"seconds": 8, "gpus": {"0": {"util": 80, "power_w": 400}, "1": {"util": 0}}}])
    busy = cluster.profile([{"seconds": 8, "gpus": {"*": {"util": 90, "power_w": 500}}}])
    jobs = {
        "alice": [cluster.submit_profile("alice", half, "--gres=gpu:2", "-w", "gpu2"),
                  cluster.submit_profile("alice", busy, "--gres=gpu:1")],
        "bob": [cluster.submit_profile("bob", busy, "--gres=gpu:1")],
    }
    for job in [j for mine in jobs.values() for j in mine]:
        assert cluster.wait_done(job) == "COMPLETED"
        cluster.wait_mirrored(job)
    return {"since": since, "until": time.time() + 1, "jobs": jobs}


def report(cluster: Cluster, period: dict[str, Any], *args: str, user: str | None = None) -> Any:
    done = cluster.run(["gpueff", "report", "--since", stamp(period["since"]), "--until",
                        stamp(period["until"]), *args], user=user)
    return done


def test_the_report_adds_up_each_job_s_own_figures(cluster: Cluster, period_jobs: dict[str, Any]) -> None:
    done = report(cluster, period_jobs, "--by", "user", "--user", "alice,bob", "--format", "json",
                  "--top", "5")
    assert done.code == 0, done.err
    data = done.json()
    groups = {g["user"]: g for g in data["groups"]}
    assert set(groups) == {"alice", "bob"}
    for user, jobs in period_jobs["jobs"].items():
        own = [cluster.run(["gpueff", job, "--json"]).json() for job in jobs]
        group = groups[user]
        assert group["jobs"] == len(jobs)
        allocated = sum(j["gpu_hours_allocated"] for j in own)
        assert group["gpu_hours_allocated"] == pytest.approx(allocated, rel=1e-6)
        assert group["gpu_hours_used"] == pytest.approx(sum(j["gpu_hours_used"] for j in own), rel=1e-6)
        assert group["jobs_with_idle_gpu"] == sum(1 for j in own if j["idle_gpus"])
        energy = sum(j["gpu_energy_j"] for j in own) / 3.6e6
        assert group["energy_kwh"] == pytest.approx(energy, rel=1e-6)
        assert group["cost"] == pytest.approx(energy * 0.25, rel=1e-6)
        assert group["coverage_pct"] == pytest.approx(100)
    assert data["totals"]["jobs"] == 3
    assert data["top"][0]["job_id"] == period_jobs["jobs"]["alice"][0]  # the idle GPU wasted most
    assert data["top"][0]["main_hint"]["rule"] == "idle_gpus"


def test_a_user_s_own_report_shows_none_of_the_other_s_jobs(
    cluster: Cluster, period_jobs: dict[str, Any],
) -> None:
    done = report(cluster, period_jobs, "--me", "--format", "json", "--user", "bob", user="alice")
    assert done.code == 0, done.err
    shown = {j["job_id"] for j in done.json()["jobs"]}
    assert shown == set(period_jobs["jobs"]["alice"])
    text = report(cluster, period_jobs, "--me", user="alice")
    assert text.code == 0, text.err
    # the job table's first column (a job id as a substring may be any figure: "68.2%")
    lines = text.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("JOBID"))
    table = lines[head + 1:lines.index("", head)]
    assert {line.split()[0] for line in table} == set(period_jobs["jobs"]["alice"])
    assert "bob" not in text.out and "chem" not in text.out
    assert "The cluster's median user" in text.out  # root's report published it


def test_the_store_s_report_is_for_admins(cluster: Cluster, period_jobs: dict[str, Any]) -> None:
    refused = report(cluster, period_jobs, user="alice")
    assert refused.code == NOT_PERMITTED and "--me" in refused.err and refused.out == ""
    admin = report(cluster, period_jobs, "--format", "json", "--user", "alice", user="dave")
    assert admin.code == 0, admin.err
    assert {g["user"] for g in admin.json()["groups"]} == {"alice"}
    assert "last `gpueff report`" in admin.json()["notes"][0]
