"""The same answers through either way of asking Slurm (issue 21): every job shape of the
suite through `[slurm] backend = "commands"` and `"pyslurm"`, compared whole: `gpueff
--json`, `gpueff report --me`, the rows the report's sync takes from Slurm, and the
refusals under PrivateData=jobs. Where pyslurm is not built for the cluster's release
(26.05 has no pyslurm; a clone without ../shared/vendor builds none), the comparisons are
skipped with the reason; where it is built (22.05, 24.11), auto must pick it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster, with_settings

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
VENDOR = Path(os.environ.get("PYSLURM_SRC") or REPO.parent / "shared" / "vendor")  # as build-pyslurm.sh
BUILT_FOR = ("22.05", "24.11")  # the releases pyslurm's vendored sources cover
NOT_PERMITTED = 10
PROBE = ("from slurm_gpu_eff.config import load_config\n"
         "from slurm_gpu_eff.slurm.access import connect\n"
         "from slurm_gpu_eff.slurm.inproc import usable\n"
         "s = connect(load_config())\nprint(s.name)\nprint(usable()[1])\n")


def config_with(cluster: Cluster, backend: str) -> str:
    return str(cluster.write(f"gpueff-{backend}.toml",
                             with_settings(cluster.config_file.read_text(), "slurm", {"backend": backend})))


@pytest.fixture(scope="module")
def configs(cluster: Cluster) -> dict[str, str]:
    """A config file per backend; the comparisons skip, saying why, where pyslurm is not usable."""
    done = cluster.run([cluster.python, "-c", PROBE], user="alice")
    assert done.code == 0, done.err
    chosen, why = done.out.splitlines()[:2]
    release = cluster.env.get("GPUEFF_SLURM", "22.05")
    if release in BUILT_FOR and VENDOR.is_dir():
        assert chosen == "pyslurm", f"auto took {chosen} on {release}, where make builds pyslurm: {why}"
    elif chosen != "pyslurm":
        pytest.skip(f"pyslurm on Slurm {release}: {why}")
    return {name: config_with(cluster, name) for name in ("commands", "pyslurm")}


HOSTILE = "two\nlines \x1fand|pipes"  # a newline, the old sacct delimiter, sacct's default one


@pytest.fixture(scope="module")
def shapes(cluster: Cluster, configs: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each shape's job id (as users name it) and owner, every job finished with its figures."""
    work = cluster.profile([{"seconds": 6, "gpus": {"*": {"util": 70, "power_w": 300}}}])
    sim = f"{cluster.sim} run {work}"
    het = ("#SBATCH --gres=gpu:1 --mem=200M\n#SBATCH hetjob\n#SBATCH --gres=gpu:1 --mem=200M\n"
           f"srun --het-group=0,1 {sim}")
    gpu = "--gres=gpu:1"
    jobs = {
        "one task": ("alice", cluster.submit_profile("alice", work, gpu)),
        "multi-task": ("alice", cluster.submit("alice", f"srun -n 2 {sim}", gpu, "-n", "2")),
        "several steps": ("alice", cluster.submit("alice", f"srun -n 1 {sim}\nsrun -n 1 {sim}", gpu)),
        "multi-node": ("alice", cluster.submit_profile("alice", work, "-N", "2", "--ntasks-per-node=1", gpu,
                                                       runner="srun")),
        "array": ("bob", cluster.submit_profile("bob", work, "--array=1-2", gpu)),
        "heterogeneous": ("bob", cluster.submit("bob", het)),
        "hostile name": ("alice", cluster.submit_profile("alice", work, gpu, f"--job-name={HOSTILE}")),
    }
    jobs["requeued"] = ("alice", requeued(cluster, work))
    for _, job in jobs.values():
        for part in (job, f"{job}+0", f"{job}+1", f"{job}_1", f"{job}_2"):
            if cluster.run(["sacct", "-n", "-X", "-j", part, "--format=JobID"]).out.strip():
                cluster.wait_done(part, timeout=180)
    shown = {name: (user, job) for name, (user, job) in jobs.items()}
    shown["array task"] = ("bob", f"{jobs['array'][1]}_1")
    return shown


def requeued(cluster: Cluster, work: Path) -> str:
    """A job requeued while it ran, released at once to run again (two runs, one id)."""
    job = cluster.submit_profile("alice", work, "--gres=gpu:1", "--requeue")
    cluster.wait_state(job, {"RUNNING"})
    time.sleep(2)
    assert cluster.run(["scontrol", "requeue", job]).code == 0
    deadline = time.monotonic() + 90
    while (state := cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).out.strip()) != "RUNNING":
        assert time.monotonic() < deadline, "the requeued job never ran again"
        if state == "PENDING":  # Slurm holds a requeued job for minutes: release it now
            cluster.run(["scontrol", "update", f"jobid={job}", "starttime=now"])
        time.sleep(1)
    return job


def timeless(data: Any) -> Any:
    """A report without what depends on when it was made (none of its figures do)."""
    if isinstance(data, dict):
        return {k: timeless(v) for k, v in data.items() if k not in ("at", "generated_at")}
    if isinstance(data, list):
        return [timeless(v) for v in data]
    return data


def both(cluster: Cluster, configs: dict[str, str], user: str, *args: str) -> dict[str, Any]:
    out = {}
    for name, config in configs.items():
        done = cluster.run(["gpueff", *args, "--config", config], user=user)
        out[name] = (done.code, done.out, done.err)
    return out


SHAPES = ["one task", "multi-task", "several steps", "multi-node", "array", "array task",
          "heterogeneous", "requeued", "hostile name"]


@pytest.mark.parametrize("shape", SHAPES)
def test_gpueff_json_is_the_same_through_either_backend(
    cluster: Cluster, configs: dict[str, str], shapes: dict[str, tuple[str, str]], shape: str,
) -> None:
    user, job = shapes[shape]
    cluster.wait_mirrored(job.split("_")[0])
    got = both(cluster, configs, user, job, "--json")
    assert got["commands"][0] == 0, got["commands"]
    assert got["pyslurm"][0] == 0, got["pyslurm"]
    commands, pyslurm = (timeless(json.loads(got[n][1])) for n in ("commands", "pyslurm"))
    assert pyslurm == commands
    text = both(cluster, configs, user, job)
    assert text["pyslurm"][1] == text["commands"][1]


def test_another_users_job_is_refused_alike(
    cluster: Cluster, configs: dict[str, str], shapes: dict[str, tuple[str, str]],
) -> None:
    """Under PrivateData=jobs, bob gets exit status 10 and nothing of alice's job either way."""
    _, job = shapes["one task"]
    got = both(cluster, configs, "bob", job, "--json")
    for name, (code, out, err) in got.items():
        assert code == NOT_PERMITTED and out == "", (name, code, out, err)
        assert "alice" not in err and "PrivateData" in err, (name, err)


def test_me_is_the_same_through_either_backend(
    cluster: Cluster, configs: dict[str, str], shapes: dict[str, tuple[str, str]],
) -> None:
    since, until = (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) for t in (time.time() - 3600,
                                                                                       time.time() + 60))
    got = both(cluster, configs, "alice", "report", "--me", "--since", since, "--until", until,
               "--format", "json")
    assert got["commands"][0] == 0 and got["pyslurm"][0] == 0, got
    # this module's jobs, finished: other tests' jobs run on meanwhile (and the totals with them)
    ours = {job.split("_")[0] for _, job in shapes.values()}
    mine = {n: [job for job in timeless(json.loads(got[n][1]))["jobs"]
                if job["job_id"].split("_")[0].split("+")[0] in ours
                and job["state"] not in ("RUNNING", "PENDING")] for n in got}
    assert mine["pyslurm"] == mine["commands"]
    assert any(job["job_id"] == shapes["one task"][1] for job in mine["commands"])


SYNC = ("import dataclasses, json, sys, time\n"
        "from slurm_gpu_eff.config import load_config\n"
        "from slurm_gpu_eff.slurm.access import connect\n"
        "s = connect(load_config(sys.argv[1]))\n"
        "jobs = s.period_jobs(time.time() - 3600, time.time())\n"
        "print(json.dumps(sorted((dataclasses.asdict(j) for j in jobs), key=lambda j: j['job_id_raw'])))\n")


def test_the_report_sync_takes_the_same_rows_through_either_backend(
    cluster: Cluster, configs: dict[str, str], shapes: dict[str, tuple[str, str]],
) -> None:
    rows = {}
    for name, config in configs.items():
        done = cluster.run([cluster.python, "-c", SYNC, config])
        assert done.code == 0, (name, done.err)
        # this module's jobs, finished: other tests' jobs run on meanwhile
        ours = {job.split("_")[0] for _, job in shapes.values()}
        rows[name] = [row for row in json.loads(done.out) if row["state"] not in ("RUNNING", "PENDING")
                      and row["job_id"].split("_")[0].split("+")[0] in ours]
    assert rows["pyslurm"] == rows["commands"]
    ids = {row["job_id"] for row in rows["commands"]}
    assert {shapes["one task"][1], f"{shapes['heterogeneous'][1]}+1", shapes["array task"][1]} <= ids


RUNNING = ("import dataclasses, json, sys\n"
           "from slurm_gpu_eff.config import load_config\n"
           "from slurm_gpu_eff.slurm.access import connect\n"
           "s = connect(load_config(sys.argv[1]), use='watch')\n"
           "jobs = {j: s.running_job(j) for j in sys.argv[2:]}\n"
           "print(json.dumps({'cluster': s.cluster(), 'private': s.private_jobs(), 'backend': s.name,\n"
           "                  'jobs': {j: v and dataclasses.asdict(v) for j, v in jobs.items()}}))\n")


def seconds(duration: str) -> int:
    """squeue's TimeUsed (D-HH:MM:SS, H:MM:SS, M:SS) in seconds."""
    days, _, clock = duration.rpartition("-")
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total + int(days or 0) * 86400


def test_the_idle_watch_reads_running_jobs_alike(cluster: Cluster, configs: dict[str, str]) -> None:
    """What the idle watch asks slurmctld (is the job running, whose, where, since when, its
    task's own id) is the same through either backend, for running jobs of each shape the
    watch meets (as the watch runs: SlurmUser's view). pyslurm 24.11's older find_id could
    not load a job at all (the watch sent no alert through it); its newer Job has no
    allocated TRES string: a GPU count asked per job (--gpus=N) is left out of the text the
    alert quotes, named here."""
    sleep = "sleep 120"
    ids = {
        "per node": cluster.submit("alice", sleep, "--gres=gpu:1"),
        "two nodes": cluster.submit("alice", sleep, "-N", "2", "--ntasks-per-node=1", "--gres=gpu:1"),
        "array": cluster.submit("bob", sleep, "--array=1-2", "--gres=gpu:1"),
        "per job": cluster.submit("alice", sleep, "-n", "2", "--gpus=2"),
    }
    try:
        for job in ids.values():
            cluster.wait_state(job.split("_")[0], {"RUNNING"})
        task = cluster.run(["squeue", "-h", "-j", ids["array"], "-o", "%A"]).out.split()
        asked = [*ids.values(), *task, "999999"]
        got = {}
        for name, config in configs.items():
            done = cluster.run([cluster.python, "-c", RUNNING, config, *asked], user="slurm")
            assert done.code == 0, (name, done.err)
            got[name] = json.loads(done.out)
        assert got["pyslurm"]["backend"] == "pyslurm" and got["commands"]["backend"] == "commands"
        commands, pyslurm = got["commands"], got["pyslurm"]
        assert commands["jobs"]["999999"] is None and pyslurm["jobs"]["999999"] is None
        per_job = ids["per job"]
        for job in asked[:-1]:
            one, other = dict(commands["jobs"][job] or {}), dict(pyslurm["jobs"][job] or {})
            assert one.get("state") == "RUNNING", (job, one)
            if job == per_job and "gres/gpu=" not in other["tres"]:
                assert one["tres"].replace(",gres/gpu=2", "") == other["tres"], (one, other)
                one, other = {**one, "tres": ""}, {**other, "tres": ""}
            # asked one after the other: the time run may have ticked on between the two
            assert abs(seconds(one.pop("run_time")) - seconds(other.pop("run_time"))) <= 5, job
            assert other == one, job
        assert (pyslurm["cluster"], pyslurm["private"]) == (commands["cluster"], commands["private"])
    finally:
        for job in ids.values():
            cluster.run(["scancel", job.split("_")[0]])
