"""The job's framework and its GPUs' links, on the real cluster: one job per framework the
simulator presents (its workload maps libraries of that framework's names, in the job's
cgroup), each stored summary's `frameworks` checked; and each GPU's `pcie_link` and
`nvlink` against the cluster's devices file (scripts/cluster.sh).

Written for issue 23's node side; not yet run on the cluster when it was written.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from .conftest import Cluster

# The node side: the store's engine changes nothing here.
pytestmark = [pytest.mark.cluster]

NODE = "gpu1"
BUSY = {"*": {"util": 90, "mem_used_gib": 8, "power_w": 400}}
FRAMEWORKS = {"pytorch": ["pytorch"], "tensorflow": ["tensorflow"], "jax": ["jax"],
              "cuda": ["cuda"], "none": []}


def submit(cluster: Cluster, framework: str, seconds: int = 12) -> str:
    profile = cluster.write("profile.json", json.dumps(
        {"framework": framework, "phases": [{"seconds": seconds, "gpus": BUSY}]}))
    return cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:1")


def stored(cluster: Cluster, job_id: str, timeout: float = 60) -> dict[str, Any]:
    """The job's final node summary, once the store has it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = cluster.summaries(job_id).get(NODE)
        if summary is not None and summary["status"] != "running":
            return summary
        time.sleep(0.5)
    raise AssertionError(f"no final summary of job {job_id} on {NODE} within {timeout:g} s")


def device_spec(cluster: Cluster, minor: int) -> dict[str, Any]:
    table = json.loads((cluster.dir / "sim" / "devices.json").read_text())
    return next(spec for spec in table[NODE] if spec["minor"] == minor)


def test_each_frameworks_job_is_told_from_its_gpu_process(cluster: Cluster) -> None:
    """All submitted at once, then checked: the sampler (root) reads the workload's
    /proc/PID/maps once, the workload being the job's by its cgroup."""
    jobs = {framework: submit(cluster, framework) for framework in FRAMEWORKS}
    for framework, job_id in jobs.items():
        ran = cluster.wait_played(job_id)
        summary = stored(cluster, ran)
        assert summary["frameworks"] == FRAMEWORKS[framework], (framework, summary.get("frameworks"))
        assert summary["gpus"][0]["processes_max"] == 1


def test_a_gpus_links_are_recorded_as_the_device_has_them(cluster: Cluster) -> None:
    """The PCIe link is read at binding (idle: the stand-in's link downshifts to Gen1) and
    on busy polls: a 12 s job at 90% sees it at its most. NVLink: as the devices file says."""
    job_id = cluster.wait_played(submit(cluster, "pytorch"))
    gpu = stored(cluster, job_id)["gpus"][0]
    spec = device_spec(cluster, gpu["minor"])
    gen, width = spec.get("pcie_gen", 4), spec.get("pcie_width", 16)
    assert gpu["pcie_link"] == {"gen": gen, "width": width, "max_gen": gen, "max_width": width,
                                "gpu_max_gen": spec.get("pcie_gpu_max_gen", gen)}
    links = spec.get("nvlinks", 0)
    if links == 0:
        assert gpu["nvlink"] is None
    else:
        assert gpu["nvlink"]["links"] == links
        assert gpu["nvlink"]["nvml_version"] == spec.get("nvlink_version", 6)
        if spec.get("nvlink_version", 6) == 6:  # NVLink 4.0, the cluster's H100s
            assert (gpu["nvlink"]["version"], gpu["nvlink"]["gbps_per_dir"]) == (4, 25.0 * links)


def test_a_job_whose_process_is_not_on_the_gpu_has_no_framework(cluster: Cluster) -> None:
    """A CPU-only step in a GPU job: no process on its GPU, nothing looked at."""
    job_id = cluster.submit("alice", "sleep 8", "-w", NODE, "--gres=gpu:1")
    cluster.wait_done(job_id)
    summary = stored(cluster, job_id)
    assert summary["frameworks"] is None
