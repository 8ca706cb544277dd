"""The sampler on newer Slurm: a job named by its SLUID in cgroup v2 (26.05), its cgroup
directory in every layout (orphan watch), and PrologFlags=RunInJob (24.05+), where the
sampler itself runs in the job's cgroup."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import GpuEffError
from slurm_gpu_eff.node import gpustats, jobenv, orphan
from slurm_gpu_eff.node import sampler as sampler_module
from slurm_gpu_eff.node.gpu import Reading
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.sampler import GpuStats, OrphanWatch, inside_job_cgroup, tell_run_in_job

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"
SLUID = "s51SM8AT3HNP00"


def own_cgroup(tmp_path: Path, fixture: str) -> tuple[str, str]:
    """A /proc whose entry for this process holds `fixture`; (proc, the job key in it)."""
    text = (FIXTURES / fixture).read_text()
    (tmp_path / "proc" / str(os.getpid())).mkdir(parents=True)
    (tmp_path / "proc" / str(os.getpid()) / "cgroup").write_text(text)
    return str(tmp_path / "proc"), jobenv.job_in_cgroup(text)


def job_for(key: str) -> JobContext:
    """The job a cgroup key names: by its id, or (26.05) by its SLUID."""
    return JobContext("4242", "gpu1", sluid=key) if jobenv.is_sluid(key) else JobContext(key, "gpu1")


# --- the job's own processes, named by their SLUID ----------------------------------------------

def test_a_shared_gpu_counts_the_jobs_processes_named_by_its_sluid() -> None:
    track = GpuStats(gpu=None, job_id="4242", sluid=SLUID)  # type: ignore[arg-type]
    track.jobs_of_pids.update({100: SLUID, 200: "s51SM8AT3HNP01", 1: ""})

    def poll(at: float) -> None:
        track.add(Reading(time=at, util=None, mem_util=None, mem_used_bytes=None, power_w=None,
                          energy_mj=None, pids=[(100, 5), (200, 7), (1, 11)],
                          process_sm={100: 40.0, 200: 30.0, 1: 10.0}), 1.0)

    poll(1.0)
    poll(2.0)
    assert track.shared_with == {"job s51SM8AT3HNP01", "processes outside any job"}
    assert track.stats["own_mem_used_bytes"].mean == 5
    assert track.stats["own_util"].mean == 40.0


def test_the_sampler_gives_the_sluid_to_its_gpus_and_binding_check(sim_node: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload's pid (this test process) traced to the job's SLUID, on a GPU the
    sampler was not bound to: the binding check sees the job's process there."""
    from slurm_gpu_eff.node.verify import MISMATCH

    sim_node.write_state(2, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80}}}]},
                         started_at=sim_node.now - 10, pid=os.getpid())

    def job_of_pid(pid: int) -> str:
        return SLUID if pid == os.getpid() else ""

    monkeypatch.setattr(sampler_module, "job_of_pid", job_of_pid)  # the node's other GPUs
    monkeypatch.setattr(gpustats, "job_of_pid", job_of_pid)  # the bound ones
    session = sim_node.session()
    job = JobContext(job_id="4242", node="gpu1", sluid=SLUID)
    sampler = sampler_module.Sampler(job, sim_node.config, session.bind([0]), clock=sim_node.clock,
                                     other_processes=session.other_processes,
                                     cgroup_root=str(sim_node.state_dir / "no-cgroups"))
    assert [g.sluid for g in sampler.gpus] == [SLUID] and sampler.binding.sluid == SLUID
    sampler.sample_once()
    binding = sampler.snapshot("running").binding
    assert binding is not None and binding["status"] == MISMATCH
    assert f"process {os.getpid()} of job 4242 runs on GPU minor 2" in binding["evidence"][0]


# --- the orphan watch finds the job's cgroup in every layout ------------------------------------

@pytest.mark.parametrize(("job", "where"), [
    (JobContext("42", "gpu1"), "devices/slurm_gpu1/uid_1001/job_42"),  # v1
    (JobContext("42", "gpu1"), "system.slice/gpu1_slurmstepd.scope/job_42"),  # v2, 24.11
    (JobContext("42", "gpu1", sluid=SLUID), f"system.slice/gpu1_slurmstepd.scope/{SLUID}"),  # 26.05
    (JobContext("42", "gpu1", sluid=SLUID), "system.slice/slurmstepd.scope/job_42"),  # CgroupJobIdPaths
])
def test_the_orphan_watch_sees_the_jobs_cgroup_and_its_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: JobContext, where: str,
) -> None:
    real = jobenv.job_cgroup_exists
    monkeypatch.setattr(orphan, "job_cgroup_exists",
                        lambda name, node: real(name, node, str(tmp_path)))
    watch = OrphanWatch(job, str(tmp_path / "absent" / "squeue"))
    assert not watch.ended() and not watch.seen  # not there yet
    (tmp_path / where).mkdir(parents=True)
    assert not watch.ended() and watch.seen
    (tmp_path / where).rmdir()
    watch.ended()
    assert watch.missing == 1


# --- PrologFlags=RunInJob: the sampler runs in the job's own cgroup -------------------------------

@pytest.mark.parametrize("fixture", ["proc-cgroup-24.11-v2-runinjob.txt",
                                     "proc-cgroup-26.05-v2-runinjob.txt"])
def test_a_sampler_in_its_jobs_cgroup_says_so_once(tmp_path: Path, fixture: str) -> None:
    proc, key = own_cgroup(tmp_path, fixture)
    job = job_for(key)
    assert inside_job_cgroup(job, proc)
    log = tmp_path / "gpu1.log"
    note = tell_run_in_job(job, Config(checkpoint_s=30), HookLog(str(log), job.job_id, "sampler"), proc)
    assert "PrologFlags=RunInJob" in note and "30 s" in note
    [line] = log.read_text().splitlines()
    assert f"runs inside job {job.job_id}'s cgroup (PrologFlags=RunInJob" in line
    assert "it ends with the job" in line and "last checkpoint, up to 30 s" in line
    assert "marked partial" in line


@pytest.mark.parametrize("fixture", ["proc-cgroup-22.05-v1-prolog.txt", "proc-cgroup-24.11-v2-prolog.txt",
                                     "proc-cgroup-26.05-v2-prolog.txt"])
def test_a_sampler_outside_the_job_says_nothing(tmp_path: Path, fixture: str) -> None:
    proc, key = own_cgroup(tmp_path, fixture)
    job = JobContext("4242", "gpu1", sluid=SLUID)
    log = tmp_path / "gpu1.log"
    assert tell_run_in_job(job, Config(), HookLog(str(log), "4242", "sampler"), proc) == ""
    assert not log.exists()


def test_another_jobs_cgroup_is_not_ours(tmp_path: Path) -> None:
    proc, _ = own_cgroup(tmp_path, "proc-cgroup-24.11-v2-runinjob.txt")
    assert not inside_job_cgroup(JobContext("999999", "gpu1", sluid=SLUID), proc)


def test_detection_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not inside_job_cgroup(JobContext("42", "gpu1"), str(tmp_path / "no-proc"))

    def broken(pid: int, proc: str = "/proc") -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(sampler_module, "job_of_pid", broken)
    assert not inside_job_cgroup(JobContext("42", "gpu1"))


def test_the_run_in_job_note_goes_with_the_bindings_evidence() -> None:
    from slurm_gpu_eff.node.verify import UNVERIFIED, VERIFIED, BindingCheck

    check = BindingCheck("42", "gpu1", [1])
    check.note("the sampler ran inside the job's cgroup")
    check.note("the sampler ran inside the job's cgroup")  # once
    assert check.result() == {"status": UNVERIFIED, "gpu_use": "unknown", "evidence": [
        "no process of the job was seen on a GPU yet, and the job's cgroup does not list its devices",
        "the sampler ran inside the job's cgroup"]}
    check.processes(1, {7: "42"}, bound=True)
    assert check.result()["status"] == VERIFIED  # a note is no evidence either way
    assert check.result()["evidence"][-1] == "the sampler ran inside the job's cgroup"


def test_the_sampler_logs_run_in_job_at_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() says it before anything else, even when it then cannot sample."""
    def no_nvml(config: Config, node: str) -> None:
        raise GpuEffError("no NVML here")

    for name, value in {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "gpu1", "SLURM_JOB_GPUS": "0",
                        "SLURM_JOB_SLUID": SLUID}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sampler_module, "GpuSession", no_nvml)
    monkeypatch.setattr(sampler_module, "job_of_pid",
                        lambda pid, proc="/proc": SLUID if pid == os.getpid() else "")
    config = Config(log_file=str(tmp_path / "%n.log"), spool_dir=str(tmp_path / "spool"))

    class Stopped:
        requested = True

    sampler_module.run(str(tmp_path), config, stopper=Stopped())  # type: ignore[arg-type]
    lines = (tmp_path / "gpu1.log").read_text().splitlines()
    assert "PrologFlags=RunInJob" in lines[0] and "cannot sample: no NVML here" in lines[1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "missing"
