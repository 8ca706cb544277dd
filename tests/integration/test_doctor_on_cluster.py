"""`gpueff doctor` on the development cluster (issue 12): ready on a GPU node, a MIG node
and as a login node would run it; a broken NVML named with its fix and exit status 11."""

from __future__ import annotations

import json

import pytest

from .conftest import Cluster, with_settings

pytestmark = [pytest.mark.cluster]


@pytest.mark.parametrize("node", ["gpu1", "mig1"])
def test_the_development_cluster_is_ready(cluster: Cluster, node: str) -> None:
    done = cluster.run(["gpueff", "doctor", "--json", "--node", node])
    result = json.loads(done.out)
    failed = [c for c in result["checks"] if not c["ok"]]
    assert (done.code, result["ready"], failed) == (0, True, []), done.err
    names = [c["name"] for c in result["checks"]]
    # this host is slurmctld's too: SlurmUser's mail spool, mail log and store access are checked
    assert names == ["config", "config-file", "venv", "Prolog", "Epilog", "MailProg", "PrologFlags", "nvml",
                     "gres", "spool", "store", "mail-spool", "mail-log", "store-slurmuser", "accounting",
                     "slurm backend"]
    nvml = next(c for c in result["checks"] if c["name"] == "nvml")
    assert nvml["message"].startswith("driver ") and "GPM " in nvml["message"]


def test_a_host_without_gpus_skips_the_node_checks(cluster: Cluster) -> None:
    done = cluster.run(["gpueff", "doctor", "--json", "--node", "login1"])
    result = json.loads(done.out)
    assert done.code == 0 and result["ready"] is True
    assert "nvml" not in [c["name"] for c in result["checks"]]


def test_nvml_that_cannot_load_is_named_with_its_fix(cluster: Cluster) -> None:
    broken = cluster.write("gpueff.toml", with_settings(cluster.config_file.read_text(), "gpu", {}).replace(
        f'library = "{cluster.config().gpu_library}"', 'library = "/nonexistent/libnvidia-ml.so.1"'))
    done = cluster.run(["gpueff", "doctor", "--node", "gpu1", "--config", str(broken)])
    assert done.code == 11
    assert "FAIL nvml: cannot load the NVML library /nonexistent/libnvidia-ml.so.1" in done.out
    assert "fix: install the NVIDIA driver" in done.out and "Not ready: 1 check(s) failed." in done.out
