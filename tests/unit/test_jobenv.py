"""jobenv: SLURM_JOB_GPUS and the rest of what Slurm puts in a hook's environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu_eff.errors import BindingError
from slurm_gpu_eff.node.jobenv import (
    NO_JOB,
    JobContext,
    is_sluid,
    job_cgroup_exists,
    job_in_cgroup,
    job_of_pid,
    parse_job_gpus,
    same_job,
    valid_sluid,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"
SLUID = "s51SM8AT3HNP00"

GPU_UUID = "GPU-5f1c0a9e-3b2d-4c1e-9a7f-0123456789ab"
MIG_UUID = "MIG-8d2e4f6a-1b3c-5d7e-9f0a-b1c2d3e4f5a6"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0,1", [0, 1]),
        ("0-3", [0, 1, 2, 3]),
        ("0-1,3", [0, 1, 3]),
        (" 2 ", [2]),
        ("3,1", [3, 1]),  # Slurm's order is kept
        ("5-5", [5]),
        ("0, 2", [0, 2]),
        ("", []),
        ("(null)", []),
        ("N/A", []),
        (None, []),
        (GPU_UUID, [GPU_UUID]),
        (MIG_UUID, [MIG_UUID]),
        (f"{GPU_UUID},{MIG_UUID}", [GPU_UUID, MIG_UUID]),
    ],
)
def test_parse_job_gpus_forms(raw: str | None, expected: list[int | str]) -> None:
    assert parse_job_gpus(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", "SLURM_JOB_GPUS='abc': cannot read 'abc'"),
        ("3-1", "SLURM_JOB_GPUS='3-1': bad range '3-1'"),
        ("0,0", "SLURM_JOB_GPUS='0,0': a GPU is named twice"),
        ("0-2,1", "SLURM_JOB_GPUS='0-2,1': a GPU is named twice"),
        ("0-99999", "SLURM_JOB_GPUS='0-99999': bad range '0-99999'"),
        ("0,", "SLURM_JOB_GPUS='0,': cannot read ''"),
        ("-1", "SLURM_JOB_GPUS='-1': cannot read '-1'"),
        ("gpu:0", "SLURM_JOB_GPUS='gpu:0': cannot read 'gpu:0'"),
        ("GPU-", "SLURM_JOB_GPUS='GPU-': cannot read 'GPU-'"),
        ("GPU-xyz", "SLURM_JOB_GPUS='GPU-xyz': cannot read 'GPU-xyz'"),
        ("0-1-2", "SLURM_JOB_GPUS='0-1-2': cannot read '0-1-2'"),
    ],
)
def test_parse_job_gpus_errors(raw: str, message: str) -> None:
    with pytest.raises(BindingError) as raised:
        parse_job_gpus(raw)
    assert str(raised.value) == message


def test_the_widest_range_allowed_is_one_node_worth() -> None:
    assert parse_job_gpus("0-1023") == list(range(1024))
    with pytest.raises(BindingError, match="bad range"):
        parse_job_gpus("0-1024")


@pytest.mark.parametrize("raw", ["²", "٣", "٠-٢"])
def test_non_ascii_digits_are_a_binding_error(raw: str) -> None:
    with pytest.raises(BindingError):
        parse_job_gpus(raw)


SLURM_ENV = {
    "SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "gpu1", "SLURM_CLUSTER_NAME": "gpueffdev",
    "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1001", "SLURM_JOB_ACCOUNT": "physics",
    "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,2",
}


def test_job_context_from_a_prolog_environment() -> None:
    job = JobContext.from_env(SLURM_ENV)
    assert job.to_dict() == {
        "job_id": "4242", "node": "gpu1", "cluster": "gpueffdev", "user": "alice",
        "uid": "1001", "account": "physics", "partition": "gpu", "job_gpus": "0,2", "sluid": "",
    }


def test_job_context_round_trips_through_a_dict() -> None:
    job = JobContext.from_env(SLURM_ENV)
    assert JobContext.from_dict(job.to_dict()) == job
    assert JobContext.from_dict({"job_id": "7", "node": "n"}).to_dict()["user"] == ""


def test_job_context_node_falls_back_to_hostname_then_unknown() -> None:
    env = {"SLURM_JOB_ID": "5", "HOSTNAME": "vm"}
    assert JobContext.from_env(env).node == "vm"
    assert JobContext.from_env({"SLURM_JOB_ID": "5"}).node == "unknown"


def test_job_id_is_stripped() -> None:
    assert JobContext.from_env({"SLURM_JOB_ID": " 17 \n"}).job_id == "17"


@pytest.mark.parametrize("job_id", ["x", "", "12;rm -rf /", "-1", "12.batch", "../12"])
def test_non_numeric_job_id_is_a_binding_error(job_id: str) -> None:
    with pytest.raises(BindingError) as raised:
        JobContext.from_env({**SLURM_ENV, "SLURM_JOB_ID": job_id})
    assert str(raised.value) == f"SLURM_JOB_ID={job_id.strip()!r} is not a job id"


def test_missing_job_id_is_a_binding_error() -> None:
    with pytest.raises(BindingError, match="SLURM_JOB_ID='' is not a job id"):
        JobContext.from_env({"SLURMD_NODENAME": "gpu1"})


def test_non_ascii_digit_job_id_is_a_binding_error() -> None:
    with pytest.raises(BindingError):
        JobContext.from_env({**SLURM_ENV, "SLURM_JOB_ID": "٤٢"})


# --- SLURM_JOB_SLUID (Slurm 26.05) -------------------------------------------------------------

def test_the_sluid_comes_from_the_prolog_environment_and_round_trips() -> None:
    job = JobContext.from_env({**SLURM_ENV, "SLURM_JOB_SLUID": f" {SLUID}\n"})
    assert job.sluid == SLUID
    assert JobContext.from_dict(job.to_dict()) == job
    assert job.ids() == ("4242", SLUID)


def test_a_spool_record_from_before_the_sluid_still_loads() -> None:
    old = {"job_id": "7", "node": "gpu1", "cluster": "c", "user": "u", "uid": "1", "account": "a",
           "partition": "p", "job_gpus": "0"}
    job = JobContext.from_dict(old)
    assert job.sluid == "" and job.ids() == ("7",)


@pytest.mark.parametrize("raw", [
    "s51SM8AT3HNP0",  # 12 characters after the s
    "s51SM8AT3HNP000",  # 14
    "S51SM8AT3HNP00",  # capital S
    "x51SM8AT3HNP00",
    "s51SM8AT3HNPI0",  # I, L, O and U are not Crockford base32
    "s51SM8AT3HNPO0",
    "s51sm8at3hnp00",  # Slurm prints it in capitals
    "s51SM8AT3HNP0²",
    "s51SM8AT3/../0",
    "(null)", "4242", "",
])
def test_a_malformed_sluid_is_ignored_never_an_error(raw: str) -> None:
    assert valid_sluid(raw) == ""
    job = JobContext.from_env({**SLURM_ENV, "SLURM_JOB_SLUID": raw})
    assert job.sluid == "" and job.job_id == "4242"
    assert JobContext("7", "n", sluid=raw).sluid == ""


def test_a_process_key_is_this_job_by_its_id_or_its_sluid() -> None:
    job = JobContext("4242", "gpu1", sluid=SLUID)
    assert job.owns("4242") and job.owns(SLUID)
    assert not job.owns("424") and not job.owns("s51SM8AT3HNP01")
    assert not job.owns(NO_JOB) and not job.owns(None)
    assert not JobContext("4242", "gpu1").owns("")  # no SLUID: "" (outside any job) is not it
    assert same_job(SLUID, "1", SLUID) and not same_job("", "1", "")


# --- /proc/PID/cgroup in each release's layout (tests/fixtures/cgroup) ------------------------

# Which kind of answer each fixture must give: a job id (its job_N directory), a SLUID (the
# directory right under the stepd scope) or no job. The ids are read from the file, so a
# capture from the dev cluster can replace a file as it is.
FIXTURE_KINDS = {
    "proc-cgroup-22.05-v1.txt": "job",
    "proc-cgroup-22.05-v1-single.txt": "job",
    "proc-cgroup-22.05-v1-prolog.txt": "none",
    "proc-cgroup-26.05-v1.txt": "job",
    "proc-cgroup-24.11-v2.txt": "job",
    "proc-cgroup-24.11-v2-single.txt": "job",
    "proc-cgroup-24.11-v2-prolog.txt": "none",
    "proc-cgroup-24.11-v2-runinjob.txt": "job",
    "proc-cgroup-26.05-v2-sluid.txt": "sluid",
    "proc-cgroup-26.05-v2-jobid.txt": "job",
    "proc-cgroup-26.05-v2-prolog.txt": "none",
    "proc-cgroup-26.05-v2-runinjob.txt": "sluid",
}


def fake_proc(tmp_path: Path, text: str, pid: int = 4321) -> str:
    (tmp_path / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def test_every_fixture_is_listed() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(FIXTURE_KINDS)


@pytest.mark.parametrize(("name", "kind"), sorted(FIXTURE_KINDS.items()))
def test_job_of_pid_in_each_release_and_layout(tmp_path: Path, name: str, kind: str) -> None:
    text = (FIXTURES / name).read_text()
    key = job_of_pid(4321, fake_proc(tmp_path, text))
    if kind == "none":
        assert key == NO_JOB
    elif kind == "job":
        assert key and key.isdigit() and f"/job_{key}/" in text
    else:
        assert key and is_sluid(key) and f"slurmstepd.scope/{key}/" in text


@pytest.mark.parametrize(("text", "expected"), [
    ("12:devices:/slurm_gpu1/uid_1001/job_7/step_batch/task_0\n0::/system.slice/slurmd.service\n", "7"),
    ("4:freezer:/slurm/uid_0/job_1/step_batch\n", "1"),
    ("0::/system.slice/gpu1_slurmstepd.scope/job_12/step_batch/user/task_0\n", "12"),
    ("0::/system.slice/slurmstepd.scope/job_3/step_0/user/task_1\n", "3"),
    (f"0::/system.slice/gpu1_slurmstepd.scope/{SLUID}/step_batch/user/task_0\n", SLUID),
    (f"0::/system.slice/slurmstepd.scope/{SLUID}/step_extern/user/task_special\n", SLUID),
    (f"0::/system.slice/slurmstepd.scope/{SLUID}\n", SLUID),  # the job level itself
    ("0::/system.slice/gpu1_slurmstepd.scope/slurmd/system\n", NO_JOB),  # the prolog
    ("0::/system.slice/slurmstepd.scope/system\n", NO_JOB),  # stepds waiting
    # SLUID-shaped names anywhere else are not a job's
    (f"0::/user.slice/{SLUID}/app.scope\n", NO_JOB),
    (f"0::/system.slice/gpu1_slurmstepd.scope/slurmd/{SLUID}\n", NO_JOB),
    (f"0::/system.slice/slurmstepd.scope.d/{SLUID}\n", NO_JOB),
    (f"12:devices:/slurm/uid_0/{SLUID}/step_batch\n", NO_JOB),  # v1 never names a job so
    ("0::/init.scope\n", NO_JOB),
    ("", NO_JOB),
])
def test_the_job_named_in_a_cgroup_text(text: str, expected: str) -> None:
    assert job_in_cgroup(text) == expected


def test_an_unreadable_or_odd_cgroup_file(tmp_path: Path) -> None:
    assert job_of_pid(4321, str(tmp_path)) is None  # gone
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_bytes(b"0::/system.slice/\xff\xfe.scope/job_5/step_0\n")
    assert job_of_pid(77, str(tmp_path)) == "5"  # a name that is not UTF-8 does not raise


def test_this_process_is_in_no_job() -> None:
    assert job_of_pid(os.getpid()) in (NO_JOB, None)  # the tests do not run in a Slurm job


# --- the job's cgroup directory, for the orphan watch -----------------------------------------

@pytest.mark.parametrize("where", [
    "freezer/slurm_gpu2/uid_1001/job_42",  # v1, several slurmd on one host
    "devices/slurm/uid_0/job_42",  # v1
    "system.slice/slurmstepd.scope/job_42",  # v2
    "system.slice/gpu2_slurmstepd.scope/job_42",  # v2, several slurmd on one host
])
def test_the_jobs_cgroup_is_found_by_its_id_in_every_layout(tmp_path: Path, where: str) -> None:
    (tmp_path / where).mkdir(parents=True)
    assert job_cgroup_exists("42", "gpu2", str(tmp_path))
    assert not job_cgroup_exists("4", "gpu2", str(tmp_path))  # job_4 is not job_42
    assert not job_cgroup_exists(SLUID, "gpu2", str(tmp_path))


@pytest.mark.parametrize("where", [
    f"system.slice/slurmstepd.scope/{SLUID}",
    f"system.slice/gpu2_slurmstepd.scope/{SLUID}",
])
def test_the_jobs_cgroup_is_found_by_its_sluid_on_v2(tmp_path: Path, where: str) -> None:
    (tmp_path / where).mkdir(parents=True)
    assert job_cgroup_exists(SLUID, "gpu2", str(tmp_path))
    assert not job_cgroup_exists("s51SM8AT3HNP01", "gpu2", str(tmp_path))
    assert not job_cgroup_exists("42", "gpu2", str(tmp_path))


def test_the_jobs_cgroup_of_another_node_or_name_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "system.slice" / "gpu1_slurmstepd.scope" / "job_42").mkdir(parents=True)
    (tmp_path / "devices" / "slurm" / "uid_0" / SLUID).mkdir(parents=True)  # v1 never has one
    assert job_cgroup_exists("42", "gpu1", str(tmp_path))
    assert not job_cgroup_exists("42", "gpu2", str(tmp_path))  # another node on this host
    assert not job_cgroup_exists(SLUID, "gpu1", str(tmp_path))
    assert not job_cgroup_exists("*", "gpu1", str(tmp_path))  # not a job name: no glob
    assert not job_cgroup_exists("", "gpu1", str(tmp_path))
