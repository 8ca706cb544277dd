"""Links: PCIe and NVLink traffic judged against the link each GPU measured, per
direction; and GPUs spread over more nodes than they need."""

from __future__ import annotations

import math
from typing import Any

from ..shapes import GpuLine, Hint, JobReport
from .core import NSYS, PER_GPU, Rule, fitted, hint, mean, node_share, pct, sm, where

MIB_PER_GB = 1e9 / 2**20
# PCIe per lane and direction, GB/s after line encoding (PCI-SIG's rates: 8b/10b for
# Gen1-2, 128b/130b from Gen3, FLIT for Gen6).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}
# GPM exists on Hopper and newer only, whose PCIe is Gen5 x16: what a GPU that did not
# report its link is assumed to have; the evidence says "assumed".
ASSUMED_PCIE = {"gen": 5, "width": 16}


def _pcie_capacity(g: GpuLine) -> tuple[float, dict[str, Any]]:
    """MiB/s per direction, and how it was found."""
    link = getattr(g.summary, "pcie_link", None) or {}
    gen, width = ASSUMED_PCIE["gen"], ASSUMED_PCIE["width"]
    known = link.get("gen") in PCIE_LANE_GBPS and isinstance(link.get("width"), int) and link["width"] > 0
    if known:
        gen, width = int(link["gen"]), int(link["width"])
    about: dict[str, Any] = {"link": f"PCIe Gen{gen} x{width}",
                             "link_source": "measured" if known else "assumed"}
    top_gen, top_width = link.get("max_gen") or gen, link.get("max_width") or width
    if known and (top_gen > gen or top_width > width):
        about["link_below_max"] = f"Gen{top_gen} x{top_width}"
    return PCIE_LANE_GBPS[gen] * width * MIB_PER_GB, about


def _nvlink_capacity(g: GpuLine, p: dict[str, float]) -> tuple[float, dict[str, Any]]:
    link = getattr(g.summary, "nvlink", None) or {}
    gbps = link.get("gbps_per_dir")
    if isinstance(gbps, (int, float)) and gbps > 0:
        about = {"link": f"{link.get('links', '?')} NVLink links, {gbps:g} GB/s per direction",
                 "link_source": "measured"}
        return gbps * MIB_PER_GB, about
    return p["assumed_gbps"] * MIB_PER_GB, {"link": f"{p['assumed_gbps']:g} GB/s per direction",
                                            "link_source": "assumed"}


PCIE_FIX = {
    "pytorch": ("Keep data on the GPU between steps (no per-step .cpu() / .to(\"cuda\") round trips), use "
                "pinned memory (pin_memory=True, .to(device, non_blocking=True)) and fewer, larger "
                "transfers"),
    "tensorflow": ("Keep the data on the GPU between steps and let tf.data prefetch to it "
                   "(tf.data.experimental.prefetch_to_device(\"/gpu:0\"))"),
    "jax": ("Put the data on the device once (jax.device_put) and keep it there: no per-step np.asarray() or "
            "jax.device_get round trips"),
}
PCIE_NEUTRAL = ("Move data less: keep it on the GPU between steps, use pinned host memory and fewer, larger "
                "transfers overlapped with compute (CUDA streams); " + NSYS)
NVLINK_FIX = {
    "pytorch": ("Communicate less per step: a larger per-GPU batch or gradient accumulation (DDP no_sync()), "
                "and overlap the all-reduce with the backward pass (DDP bucket_cap_mb)"),
}
NVLINK_NEUTRAL = ("Communicate less per step or overlap it with compute: a larger per-GPU batch, gradient "
                  "accumulation, tensor-parallel groups kept within a node; " + NSYS)


def _link_bound(rule: str, kind: str, p: dict[str, float], report: JobReport) -> list[Hint]:
    rx, tx = f"{kind}_rx_mbps", f"{kind}_tx_mbps"
    flagged = []
    for g in report.gpus:
        capacity, about = _pcie_capacity(g) if kind == "pcie" else _nvlink_capacity(g, p)
        busiest = max(g.metric(rx) or 0.0, g.metric(tx) or 0.0)
        if busiest >= p["link_fraction"] * capacity and (sm(g) or 0.0) < p["sm_pct"]:
            flagged.append((g, busiest, capacity, about))
    if not flagged:
        return []
    share = mean(100 * b / c for _, b, c, _ in flagged)
    active = mean(sm(g) or 0.0 for g, _, _, _ in flagged)
    about = flagged[0][3]
    evidence = {
        f"{kind}_busiest_direction_mib_s": round(mean(b for _, b, _, _ in flagged)),
        "link_used_pct": pct(share), "sm_active_mean_pct": pct(active), **about,
        "gpus_concerned": len(flagged),
        "gpus": [where(g, rx_mib_s=round(g.metric(rx) or 0.0), tx_mib_s=round(g.metric(tx) or 0.0),
                       link_used_pct=pct(100 * b / c)) for g, b, c, _ in flagged],
    }
    link = about["link"]
    if about["link_source"] == "assumed":
        link += " (assumed: the GPU did not report its link)"
    if kind == "pcie":
        below = (f"; the link ran below its {about['link_below_max']}, worth an admin's look"
                 if "link_below_max" in about else "")
        message = (f"PCIe-bound: one direction carried {share:.0f}% of the link ({link}) while the SMs were "
                   f"active only {active:.1f}%, so the GPU waits on transfers{below}.")
        fix = fitted(report, PCIE_FIX, PCIE_NEUTRAL)
    else:
        message = (f"NVLink-bound: one direction carried {share:.0f}% of the links ({link}) while the SMs "
                   f"were active only {active:.1f}%, so the GPUs wait on each other.")
        fix = fitted(report, NVLINK_FIX, NVLINK_NEUTRAL)
    return [hint(rule, "warning", message, evidence, fix, None)]


def _pcie_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("pcie_bound", "pcie", p, report)


def _nvlink_bound(report: JobReport, p: dict[str, float]) -> list[Hint]:
    return _link_bound("nvlink_bound", "nvlink", p, report)


def _spread_nodes(report: JobReport, p: dict[str, float]) -> list[Hint]:
    job = report.job
    if job.nnodes <= 1 or job.gpus <= 0:
        return []
    share = node_share(report)
    per_node = int(share["gpus"]) if share else int(p["gpus_per_node"])
    needed = math.ceil(job.gpus / max(1, per_node))
    if needed >= job.nnodes:
        return []
    size = "from Slurm's node config" if share else "the site's gpus_per_node setting"
    evidence = {"nodes": job.nnodes, "nodes_needed": needed, "gpus_allocated": job.gpus,
                "gpus_per_node_used": round(job.gpus / job.nnodes, 1), "gpus_per_node": per_node}
    message = (f"GPUs spread over nodes: {job.gpus} GPUs on {job.nnodes} nodes would fit on {needed} "
               f"node{'s' if needed > 1 else ''} of {per_node} GPUs ({size}), where more of them talk over "
               "NVLink instead of the network.")
    per = f"--gres=gpu:{job.gpus // needed}" if job.gpus % needed == 0 else f"--gpus={job.gpus}"
    fix = f"#SBATCH --nodes={needed} {per}"
    return [hint("spread_nodes", "info", message, evidence, fix, None)]


RULES: tuple[Rule, ...] = (
    Rule(
        "pcie_bound", "Host-device transfers (PCIe)",
        "Judged per direction against the link the GPU reported (generation and width from NVML, at "
        "PCI-SIG's per-lane rates), or Gen5 x16 where it reported none (GPM exists only on Hopper and "
        "newer, which are Gen5). Half the link one way (ours) with SM activity under 50% (DCGM's "
        "'likely ineffective' line) means the GPU waits on copies. Whether GPUDirect network traffic "
        "shows in these counters is unverified.",
        {"link_fraction": 0.5, "sm_pct": 50.0}, ("pcie_rx_mbps", "pcie_tx_mbps", "sm_active"), _pcie_bound,
        evidence=("pcie_busiest_direction_mib_s", "link_used_pct", "link", "link_source", "link_below_max",
                  "sm_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "nvlink_bound", "GPU-to-GPU communication (NVLink)",
        "Judged per direction against the GPU's active links as NVML reported them, or 450 GB/s per "
        "direction where it reported none (H100 SXM's usual figure, unverified). Half of that one way "
        "(ours) with SM activity under 50% (DCGM's 'likely ineffective' line) means the GPUs wait on "
        "each other. Fewer GPUs is never suggested: it breaks tensor- and pipeline-parallel models.",
        {"link_fraction": 0.5, "sm_pct": 50.0, "assumed_gbps": 450.0},
        ("nvlink_rx_mbps", "nvlink_tx_mbps", "sm_active"), _nvlink_bound,
        evidence=("nvlink_busiest_direction_mib_s", "link_used_pct", "link", "link_source",
                  "sm_active_mean_pct", *PER_GPU),
    ),
    Rule(
        "spread_nodes", "GPUs spread over more nodes than needed",
        "GPUs on one node talk over NVLink; across nodes, over the network, which is many times "
        "slower. A multi-node job that would fit on fewer nodes (their GPUs from Slurm's node config, "
        "else gpus_per_node, 4 by default: ours, a common node size) is flagged, as Princeton's "
        "job_defense_shield flags jobs using fewer GPUs per node than a node has.",
        {"gpus_per_node": 4.0}, (), _spread_nodes,
        evidence=("nodes", "nodes_needed", "gpus_allocated", "gpus_per_node_used", "gpus_per_node"),
    ),
)
