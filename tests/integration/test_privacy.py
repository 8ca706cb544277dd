"""Who sees whose figures (issue 9), on the development cluster with PrivateData=jobs:
alice (physics) and bob (chem) are users, carol coordinates physics, dave is in the admin
group that reads the store, root is Slurm's administrator. See docs/security.md."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_store]

NOT_PERMITTED = 10


def mirrored(cluster: Cluster, job_id: str, timeout: float = 60) -> str:
    """The job's AdminComment once it holds its final figures (root reads every job)."""
    end = time.monotonic() + timeout
    text = ""
    while time.monotonic() < end:
        text = cluster.run(["sacct", "-j", job_id, "-X", "-n", "-P", "--format=AdminComment"]).out.strip()
        if "figures=" in text and "status=running" not in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"job {job_id}'s AdminComment has no final figures after {timeout} s: {text!r}")


@pytest.fixture(scope="module")
def jobs(cluster: Cluster) -> dict[str, str]:
    """A finished GPU job of alice's and one of bob's, their figures in the AdminComment."""
    profile = cluster.profile([{"seconds": 8, "gpus": {"*": {"util": 73, "power_w": 420}}}])
    found = {user: cluster.submit_profile(user, profile, "--gres=gpu:1") for user in ("alice", "bob")}
    for job in found.values():
        assert cluster.wait_done(job) == "COMPLETED"
        mirrored(cluster, job)
    return found


def test_a_user_reads_their_own_job_through_slurm_and_not_another_s(
    cluster: Cluster, jobs: dict[str, str],
) -> None:
    own = cluster.gpueff(jobs["alice"], "alice", "--json")
    assert own.code == 0, own.err
    report = own.json()
    assert report["source"] == "accounting"  # alice cannot open the store: sacct it is
    assert report["user"] == "alice" and report["gpus"][0]["util_mean"] > 50
    other = cluster.gpueff(jobs["bob"], "alice", "--json")
    assert other.code == NOT_PERMITTED, other.err
    assert other.out == "" and "not among the jobs Slurm lets you see" in other.err
    # No word of bob's job beyond its id: not his account, not the 73% it ran at.
    told = other.err.replace(jobs["bob"], "JOB")
    assert "chem" not in told and "bob" not in told and "73" not in told and "%" not in told
    # Nor through Slurm itself: sacct shows alice nothing of bob's job.
    assert cluster.run(["sacct", "-j", jobs["bob"], "-X", "-n", "-P", "--format=User,AdminComment"],
                       user="alice").out.strip() == ""


def test_a_coordinator_reads_their_account_s_jobs_only(cluster: Cluster, jobs: dict[str, str]) -> None:
    physics = cluster.gpueff(jobs["alice"], "carol", "--json")
    assert physics.code == 0, physics.err
    assert physics.json()["user"] == "alice"
    assert cluster.gpueff(jobs["bob"], "carol").code == NOT_PERMITTED


def test_admins_read_everyone_s(cluster: Cluster, jobs: dict[str, str]) -> None:
    for job in jobs.values():
        by_root = cluster.run(["gpueff", job, "--json"])
        assert by_root.code == 0, by_root.err
        # dave is no Slurm operator (sacct hides the job) but reads the store.
        by_dave = cluster.gpueff(job, "dave", "--json")
        assert by_dave.code == 0, by_dave.err
        report = by_dave.json()
        assert report["source"] == "store" and report["gpus"][0]["util_mean"] > 50
        assert "does not show you this job" in report["notes"][0]


def read_as(cluster: Cluster, user: str, path: str) -> str:
    """What `user` gets opening `path` (a file, or a directory's listing)."""
    script = ("import os, sys\np = sys.argv[1]\ntry:\n"
              "    print(os.listdir(p) if os.path.isdir(p) else len(open(p, 'rb').read()))\n"
              "except OSError as e:\n    print(type(e).__name__)\n")
    return cluster.run([cluster.python, "-c", script, path], user=user).out.strip()


def test_the_store_spool_and_logs_are_closed_to_users(cluster: Cluster, jobs: dict[str, str]) -> None:
    config = cluster.config()
    logs = sorted((cluster.dir / "log").glob("gpueff-*.log"))
    closed = [str(cluster.spool("gpu1")), *map(str, logs)]
    if cluster.engine == "sqlite":
        closed.append(config.store_path)
    assert logs and cluster.spool("gpu1").exists()
    for path in closed:
        assert read_as(cluster, "alice", path) == "PermissionError", path
    if cluster.engine == "sqlite":
        assert read_as(cluster, "dave", config.store_path) not in ("PermissionError", "")
    else:
        connect = ("import sys, psycopg\ntry:\n    psycopg.connect(sys.argv[1]).close(); print('connected')\n"
                   "except Exception as e:\n    print(type(e).__name__)\n")
        said = {user: cluster.run([cluster.python, "-c", connect, config.store_read_url],
                                  user=user).out.strip()
                for user in ("alice", "dave")}
        assert said["alice"] != "connected" and said["dave"] == "connected", said


def test_no_user_can_write_an_admin_comment(cluster: Cluster, jobs: dict[str, str]) -> None:
    forged = "gpueff1 status=complete nodes=1 gpus=1 util=99.0"
    job = jobs["alice"]
    assert cluster.run(["sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set",
                        f"AdminComment={forged}"], user="alice").code != 0
    assert "util=99.0" not in mirrored(cluster, job)


def test_a_running_job_s_live_figures_reach_its_owner(cluster: Cluster) -> None:
    """Mirrored every live_mirror_s (5 s on the dev cluster) while the job runs."""
    profile = cluster.profile([{"seconds": 30, "gpus": {"*": {"util": 64}}}])
    job = cluster.submit_profile("alice", profile, "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    end, report = time.monotonic() + 25, None
    while time.monotonic() < end:
        result = cluster.gpueff(job, "alice", "--json")
        if result.code == 0:
            report = json.loads(result.out)
            break
        time.sleep(1)
    assert report is not None, f"no live figures for alice's running job {job}: {result.err}"
    assert report["source"] == "accounting" and report["gpu_status"] == "running"
    assert cluster.gpueff(job, "bob").code == NOT_PERMITTED
    cluster.run(["scancel", job])
