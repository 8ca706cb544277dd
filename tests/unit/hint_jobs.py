"""Jobs for the hint rules' tests (test_hints*.py): a healthy GPU with changes, and a
finished job's report of such GPUs. conftest.py offers the two fixtures to every test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from slurm_gpu_eff import model
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.shapes import METRICS, JobReport

GIB = 1024**3
# A healthy GPU: busy, SMs active, tensor cores in use, memory 70% of 80 GiB, power 80%.
HEALTHY: dict[str, Any] = dict(
    util=95.0, power=560.0, mem_used=56 * GIB, sm_active=85.0, tensor_active=40.0, fp32_active=10.0,
    dram_active=40.0, pcie_rx_mbps=1000.0, pcie_tx_mbps=1000.0, nvlink_rx_mbps=500.0, nvlink_tx_mbps=500.0,
)
NO_GPM = ("sm_active", "tensor_active", "fp32_active", "dram_active", "pcie_rx_mbps", "pcie_tx_mbps",
          "nvlink_rx_mbps", "nvlink_tx_mbps")
Gpus = Callable[..., model.GpuSummary]
Reports = Callable[..., JobReport]


@pytest.fixture
def gpu(make_gpu: Gpus) -> Gpus:
    """A healthy GPU with changes: metric names (report.METRICS) set a mean, None drops the
    metric (not measured); pcie_link and nvlink are what NVML says of its links; any other
    keyword is a GpuSummary field."""

    def build(**changes: Any) -> model.GpuSummary:
        values = {**HEALTHY, **changes}
        metrics = {k: values.pop(k) for k in list(values) if k in METRICS and k != "util"}
        g = make_gpu(**values)
        for name, mean in metrics.items():
            if mean is not None:
                g.metrics[name] = {"mean": mean, "min": 0.0, "max": mean, "last": mean,
                                   "samples": 3600, "seconds": 3599.0}
        return g

    return build


@pytest.fixture
def job_report(make_job: Callable[..., Any], make_summary: Callable[..., model.NodeSummary],
               gpu: Gpus) -> Reports:
    """A finished job with these GPUs (default: one healthy), one node summary per node;
    frameworks as the node side reads them, node_shares as the Slurm layer passes them."""

    def build(gpus: list[model.GpuSummary] | None = None, frameworks: list[str] | None = None,
              node_shares: dict[str, dict[str, int]] | None = None, interactive: bool | None = None,
              **job: Any) -> JobReport:
        gpus = gpus if gpus is not None else [gpu()]
        nodes = list(dict.fromkeys(g.node for g in gpus))
        values = {"gpus": len(gpus), "nnodes": len(nodes), "nodelist": ",".join(nodes), **job}
        summaries = [make_summary(node=n, gpus=[g for g in gpus if g.node == n], frameworks=frameworks)
                     for n in nodes]
        slurm_job = make_job(**values)
        if interactive is not None:  # SlurmJob.interactive comes with the Slurm layer's change
            object.__setattr__(slurm_job, "interactive", interactive)
        return build_report(slurm_job, summaries, node_shares=node_shares)

    return build
