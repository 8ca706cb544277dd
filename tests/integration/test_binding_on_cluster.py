"""Issue 7 on the real cluster: the sampler runs the real pynvml over the stand-in
libnvidia-ml.so.1; the binding checks itself (verified for an honest job, a mismatch when
the gres mapping lies); a MIG slice named by Slurm's gres index is measured on that slice."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, Cluster, with_settings

pytestmark = [pytest.mark.cluster]  # the node side: the store's engine changes nothing here

STANDIN = str(REPO / "build" / "nvml" / "current" / "libnvidia-ml.so.1")
NODE = "gpu1"


def sampler_pid(cluster: Cluster, node: str, job: str, timeout: float = 30) -> int:
    pid_file = cluster.spool(node) / "jobs" / job / "sampler.pid"
    deadline = time.monotonic() + timeout
    while not pid_file.exists():
        assert time.monotonic() < deadline, f"no sampler for job {job} on {node}"
        time.sleep(0.2)
    return int(pid_file.read_text().split()[0])


def test_the_sampler_runs_the_real_pynvml_over_the_stand_in_library(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 12, "gpus": {"*": {"util": 65}}}])
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    pid = sampler_pid(cluster, NODE, job)
    bound(cluster, NODE, job)  # past nvmlInit: the GPUs are bound
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert STANDIN in maps
    assert "/pynvml" not in maps  # pynvml is Python: what is mapped is the C library below it
    assert cluster.wait_done(job) == "COMPLETED"
    data = cluster.gpueff(job, "alice", "--json").json()
    assert data["binding"]["status"] == "verified", data["binding"]
    assert data["gpus"][0]["util_mean"] > 50


def bound(cluster: Cluster, node: str, job: str, timeout: float = 30) -> str:
    """The sampler's log line saying which GPUs it bound."""
    log = cluster.dir / "log" / f"gpueff-{node}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines()
                 if f"job={job} sampler" in line and "sampling" in line]
        if lines:
            return lines[0]
        time.sleep(0.2)
    raise AssertionError(f"the sampler of job {job} did not bind within {timeout} s")


LIAR = """#!/bin/sh
# slurmd -G, lying: Slurm's index i named as the device file of minor (i+1) mod 4
d={devices}
for i in 0 1 2 3; do
  echo "slurmd: Gres Name=gpu Count=1 Index=$i ID=7696487 File=$d/nvidia$(( (i + 1) % 4 ))" >&2
done
"""


@pytest.mark.serial  # every job started meanwhile is bound through the lying gres list
def test_a_lying_gres_mapping_is_reported_as_a_mismatch(cluster: Cluster) -> None:
    """The hooks' config names a slurmd whose gres list is off by one; the job's own
    workload (with the real mapping, as CUDA would see its GPU) plays on the GPU Slurm gave
    it. The sampler reads another GPU: it must say so, not report it as the job's."""
    etc = cluster.config_file
    original = etc.read_text()
    honest = cluster.write("honest.toml", original)  # what the job itself reads
    liar = cluster.write("slurmd-liar", LIAR.format(devices=cluster.dir / "nodes" / NODE))
    liar.chmod(0o755)
    # The liar's GPU map is a file of its own: the job's workload reads the node's true one.
    lying = with_settings(original, "slurm", {"slurmd": str(liar)})
    etc.write_text(lying.replace("gpu-map.json", "gpu-map-liar.json"))
    try:
        profile = cluster.profile([{"seconds": 25, "gpus": {"*": {"util": 80}}}])
        job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1",
                                     f"--export=ALL,GPUEFF_CONFIG={honest}")
        cluster.wait_state(job, {"RUNNING"})
        bound(cluster, NODE, job)  # the sampler has read the lying config and bound
    finally:
        etc.write_text(original)
    assert cluster.wait_done(job) == "COMPLETED"
    data = cluster.gpueff(job, "alice", "--json").json()
    assert data["binding"]["status"] == "mismatch", data["binding"]
    evidence = " ".join(data["binding"]["nodes"][NODE]["evidence"])
    assert f"of job {job} runs on GPU minor" in evidence and "not bound to" in evidence
    text = cluster.gpueff(job, "alice")
    assert "GPU Binding: mismatch" in text.out
    assert "the GPUs measured may not be the job's own" in text.out


def test_a_mig_slice_named_by_its_gres_index_is_measured_on_that_slice(cluster: Cluster) -> None:
    profile = cluster.profile([{"seconds": 14, "gpus": {"*": {
        "sm_active": 45, "tensor_active": 30, "mem_used_gib": 6}}}])
    job = cluster.submit_profile("alice", profile, "-p", "mig", "--gres=gpu:1")
    assert cluster.wait_done(job) == "COMPLETED", cluster.output(job)
    index = int(cluster.output(job).split("SLURM_JOB_GPUS=")[1].split()[0])
    data = cluster.gpueff(job, "alice", "--json").json()
    (gpu,) = data["gpus"]
    devices = (cluster.dir / "sim" / "devices.json").read_text()
    assert gpu["uuid"].startswith("MIG-") and gpu["uuid"] in devices
    # SLURM_JOB_GPUS counts positions in slurmd's gres list (slurmd -G prints Index=12 and
    # 21, the files' own numbers): 0 is nvidia-cap12 = gpu0/gi1, 1 is nvidia-cap21 = gpu0/gi2
    assert gpu["mig_gi_id"] == {0: 1, 1: 2}[index]
    assert gpu["util_mean"] is None  # NVML has no utilisation for a MIG slice
    assert 40 < gpu["sm_active_max"] <= 45.5  # GPM of that GPU instance: the profile's level
    assert abs(gpu["mem_used_max_bytes"] - 6 * 2**30) < 2**20
    assert os.path.exists(cluster.dir / "sim" / "state" / "mig1" / f"{gpu['uuid']}.json")
