"""Links: PCIe, NVLink, and GPUs spread over nodes."""

from __future__ import annotations

from ..shapes import GpuLine, Hint, JobReport
from .core import PER_GPU, Rule, hint, m, mean, pct, where


def _link_bound(rule: str, kind: str, p: dict[str, float], report: JobReport) -> list[Hint]:
    rx, tx = f"{kind}_rx_mbps", f"{kind}_tx_mbps"
    threshold = p[f"{kind}_mbps"]

    def traffic(g: GpuLine) -> float:
        return (g.metric(rx) or 0.0) + (g.metric(tx) or 0.0)

    flagged = [g for g in report.gpus if traffic(g) > threshold and m(g, "sm_active") < p["sm_pct"]]
    if not flagged:
        return []
    mibs = mean(traffic(g) for g in flagged)
    sm = mean(g.metric("sm_active") or 0.0 for g in flagged)
    evidence = {
        f"{kind}_mean_mib_s": round(mibs), "sm_active_mean_pct": pct(sm), "gpus_concerned": len(flagged),
        "gpus": [where(g, **{f"{kind}_mean_mib_s": round(traffic(g))},
                        sm_active_mean_pct=pct(g.metric("sm_active") or 0.0)) for g in flagged],
    }
    if kind == "pcie":
        message = (f"PCIe-bound: {mibs:.0f} MiB/s between host and GPU (received + sent) while the SMs were "
                   f"active only {sm:.1f}%, so the GPU waits on transfers.")
        fix = ("Keep data on the GPU between steps (no per-step .cpu() / .to(\"cuda\") round trips), use "
               "pinned memory (pin_memory=True, .to(device, non_blocking=True)) and fewer, larger transfers")
    else:
        message = (f"NVLink-bound: {mibs:.0f} MiB/s between GPUs (received + sent) while the SMs were "
                   f"active only {sm:.1f}%, so the GPUs wait on each other.")
        fix = ("Communicate less per step: a larger per-GPU batch or gradient accumulation (DDP no_sync()), "
               "overlap the all-reduce with the backward pass (DDP bucket_cap_mb), or fewer GPUs")
    return [hint(rule, "warning", message, evidence, fix, None)]


def _pcie_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("pcie_bound", "pcie", p, report)


def _nvlink_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("nvlink_bound", "nvlink", p, report)


def _spread_nodes(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.nnodes <= 1 or job.gpus <= 0:
        return []
    per_node = job.gpus / job.nnodes
    if per_node >= p["gpus_per_node"] or job.gpus > p["gpus_per_node"]:
        return []
    evidence = {"nodes": job.nnodes, "gpus_allocated": job.gpus, "gpus_per_node_used": round(per_node, 1),
                "gpus_per_node": p["gpus_per_node"]}
    message = (f"GPUs spread over nodes: {job.gpus} GPUs on {job.nnodes} nodes would fit on one node of "
               f"{p['gpus_per_node']:.0f}, where they talk over NVLink instead of the network.")
    fix = f"#SBATCH --nodes=1 --gres=gpu:{job.gpus}"
    return [hint("spread_nodes", "info", message, evidence, fix, None)]


RULES: tuple[Rule, ...] = (
    Rule(
        "pcie_bound", "Host-device transfers (PCIe)",
        "12000 MiB/s received plus sent is a large share of what a PCIe Gen4 x16 link carries in "
        "practice. With SM activity under 50% at the same time, the GPU waits on copies to and from "
        "the host rather than computing.",
        {"pcie_mbps": 12000.0, "sm_pct": 50.0}, ("pcie_rx_mbps", "pcie_tx_mbps", "sm_active"), _pcie_bound,
        evidence=("pcie_mean_mib_s", "sm_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "nvlink_bound", "GPU-to-GPU communication (NVLink)",
        "100000 MiB/s of NVLink traffic received plus sent is a large share of a GPU's links. With SM "
        "activity under 50% at the same time, the GPUs spend their time exchanging data (gradients, "
        "activations) rather than computing.",
        {"nvlink_mbps": 100000.0, "sm_pct": 50.0}, ("nvlink_rx_mbps", "nvlink_tx_mbps", "sm_active"),
        _nvlink_bound, evidence=("nvlink_mean_mib_s", "sm_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "spread_nodes", "GPUs spread over more nodes than needed",
        "GPUs on one node talk over NVLink; across nodes, over the network, which is many times "
        "slower. A multi-node job with no more GPUs in all than one node holds (gpus_per_node, the "
        "site's node size) would run better packed, and leaves whole nodes free for others.",
        {"gpus_per_node": 4.0}, (), _spread_nodes,
        evidence=("nodes", "gpus_allocated", "gpus_per_node_used", "gpus_per_node"),
    ),
)
