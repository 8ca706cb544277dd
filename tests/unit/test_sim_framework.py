"""The simulator presents a job as each framework the way the detection reads it: a
profile's "framework" makes the workload process map libraries of that framework's names,
and the sampler, through the stand-in NVML's process list and /proc/PID/maps, says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.node import gpustats
from slurm_gpu_eff.node.frameworks import classify_maps, read_maps
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import Sampler
from slurm_gpu_eff.sim.profile import FRAMEWORKS, ProfileError, parse_profile
from slurm_gpu_eff.sim.workload import FrameworkLibraries
from tests.configfile import write_config

ROOT = Path(__file__).resolve().parents[2]
PHASES = [{"seconds": 60, "gpus": {"*": {"util": 70, "mem_used_gib": 4}}}]


def test_a_profile_names_its_framework_or_none() -> None:
    assert parse_profile({"phases": PHASES}).framework == "none"
    assert parse_profile({"framework": "jax", "phases": PHASES}).framework == "jax"
    with pytest.raises(ProfileError, match="'framework' must be one of pytorch, tensorflow, jax, cuda, none"):
        parse_profile({"framework": "torch", "phases": PHASES})


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_libraries_mapped_read_as_the_framework(framework: str) -> None:
    libraries = FrameworkLibraries(framework)
    try:
        text = read_maps(os.getpid())
        assert text is not None
        mine = b"\n".join(line for line in text.splitlines()
                          if libraries.directory and libraries.directory.encode() in line)
        assert classify_maps(mine) == (set() if framework == "none" else {framework})
    finally:
        directory = libraries.directory
        libraries.close()
    if directory:
        assert not os.path.exists(directory)
        assert directory.encode() not in (read_maps(os.getpid()) or b"")  # unmapped


@pytest.fixture
def workload_config(sim_node: Any, tmp_path: Path) -> Path:
    """A config for `gpueff-sim run` in a subprocess: the simulated node's devices and
    state, no GPU map and no slurmd (Slurm's indexes are then the minors)."""
    return write_config(tmp_path / "workload.toml", {
        "gpu": {"library": sim_node.config.gpu_library, "map_file": ""},
        "slurm": {"slurmd": str(tmp_path / "no-slurmd")},
        "sim": {"devices": str(sim_node.devices_file), "state_dir": str(sim_node.state_dir)},
    })


@pytest.fixture
def start_workload(workload_config: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(framework: str, minor: int = 2) -> tuple[int, dict[str, Any]]:
        """`gpueff-sim run` on Slurm's GPU `minor` of gpu1, in its own process: its pid and
        the state it published, once it has."""
        profile = tmp_path / f"{framework}.json"
        profile.write_text(json.dumps({"framework": framework, "phases": PHASES}))
        env = {**os.environ, "SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": str(minor),
               "SLURMD_NODENAME": "gpu1", "TMPDIR": str(tmp_path)}
        process = subprocess.Popen(
            [sys.executable, "-m", "slurm_gpu_eff.sim.cli", "--config", str(workload_config),
             "run", str(profile)], cwd=ROOT, env=env, stderr=subprocess.PIPE)
        started.append(process)
        state = tmp_path / "state" / "gpu1" / f"gpu{minor}.json"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if state.exists() and json.loads(state.read_text()).get("pid") == process.pid:
                return process.pid, json.loads(state.read_text())
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.02)
        raise AssertionError("the workload published nothing")

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # ends the profile early: its libraries go
        process.wait(timeout=20)
        assert process.returncode == 0


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow", "jax", "cuda"])
def test_the_sampler_tells_a_workloads_framework_from_its_maps(
    sim_node: Any, start_workload: Any, monkeypatch: pytest.MonkeyPatch, framework: str,
) -> None:
    """The workload's pid is what NVML lists on the GPU; the sampler traces it to the job
    (its cgroup, here said by the test) and reads its maps once."""
    pid, state = start_workload(framework)
    monkeypatch.setattr(gpustats, "job_of_pid", lambda p: "9" if p == pid else "77")
    sim_node.now = state["started_at"] + 1.0  # the library's clock: the workload runs
    session = sim_node.session()
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([2]),
                      clock=sim_node.clock)
    sampler.sample_once()
    assert sampler.snapshot("running").gpus[0].processes_max == 1
    assert sampler.snapshot("running").frameworks == [framework]
    sim_node.now += 1.0
    sampler.sample_once()
    assert sampler.frameworks.examined == 1  # read once, not every poll


def test_a_workload_presented_as_no_framework_is_seen_but_not_recognised(
    sim_node: Any, start_workload: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid, state = start_workload("none")
    monkeypatch.setattr(gpustats, "job_of_pid", lambda p: "9" if p == pid else "77")
    sim_node.now = state["started_at"] + 1.0
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), sim_node.session().bind([2]),
                      clock=sim_node.clock)
    sampler.sample_once()
    assert sampler.snapshot("running").frameworks == []


def test_another_jobs_process_says_nothing_of_this_jobs_framework(
    sim_node: Any, start_workload: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, state = start_workload("pytorch")
    monkeypatch.setattr(gpustats, "job_of_pid", lambda p: "77")  # all of it another job's
    sim_node.now = state["started_at"] + 1.0
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), sim_node.session().bind([2]),
                      clock=sim_node.clock)
    sampler.sample_once()
    assert sampler.snapshot("running").frameworks is None
    assert sampler.frameworks.examined == 0
