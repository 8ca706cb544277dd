"""jobenv: SLURM_JOB_GPUS and the rest of what Slurm puts in a hook's environment."""

from __future__ import annotations

import pytest

from slurm_gpu_eff.errors import BindingError
from slurm_gpu_eff.node.jobenv import JobContext, parse_job_gpus

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
        "uid": "1001", "account": "physics", "partition": "gpu", "job_gpus": "0,2",
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
