"""The Prometheus export on the development cluster (issue 12): with `[export]
textfile_dir` set, a running simulated job's figures appear in node_exporter's textfile
directory, parse with prometheus_client's parser for the Prometheus text format (what
node_exporter reads), and are gone after the job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Cluster, with_settings

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # every sampler exports meanwhile
NODE = "gpu1"


@pytest.fixture
def textfile(cluster: Cluster) -> Iterator[Path]:
    directory = cluster.dir / "textfile"
    directory.mkdir(exist_ok=True)
    before = cluster.config_file.read_text()
    cluster.config_file.write_text(with_settings(before, "export", {"textfile_dir": str(directory),
                                                                        "labels": "user"}))
    try:
        yield directory
    finally:
        cluster.config_file.write_text(before)


def test_a_running_job_s_figures_are_exported_and_gone_after_it(cluster: Cluster,
                                                                textfile: Path) -> None:
    level = {"util": 70, "power_w": 350, "mem_used_gib": 9}
    profile = cluster.profile([{"seconds": 12, "gpus": {"*": level}}])
    job = cluster.submit_profile("alice", profile, "-w", NODE, "--gres=gpu:2")
    path = textfile / f"gpueff-job-{job}.prom"
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} while job {job} runs"
        time.sleep(0.2)
    deadline = time.monotonic() + 30

    def at_level() -> bool:  # every poll rewrites the file: until the workload's level shows
        return (len(util) == 2 and all(abs(s.value - 0.70) < 0.05 for s in util)
                and all(abs(s.value - 350) < 5 for s in power))

    while True:
        families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
        util = families["gpueff_gpu_utilization_ratio"].samples
        power = families["gpueff_gpu_power_watts"].samples
        if at_level() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert at_level(), (util, power)
    labels = util[0].labels
    assert (labels["job_id"], labels["user"], labels["node"]) == (job, "alice", NODE)
    assert labels["account"]
    assert labels["uuid"].startswith("GPU-") and labels["minor"].isdigit()
    assert all(s.value > 0 for s in families["gpueff_gpu_energy_joules"].samples)
    assert cluster.wait_done(job) == "COMPLETED"
    assert not path.exists()
    assert [p.name for p in textfile.iterdir()] == []  # no temporary file left either
