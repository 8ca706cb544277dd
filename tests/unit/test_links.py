"""The GPU's links as node/gpu.py reads them through the real pynvml over the stand-in:
the PCIe link's highest current speed and its maxima, NVLink's active links, generation
and bandwidth; None where NVML has none; and the summary's round trip with them and the
job's frameworks."""

from __future__ import annotations

import json
from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.model import GpuSummary, NodeSummary
from slurm_gpu_eff.node import sampler as sampler_module
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import Sampler
from tests.unit.conftest import SIM_DEVICES

H100_SXM = {"pcie_gen": 5, "pcie_width": 16, "nvlinks": 18, "nvlink_version": 6}
H100_NVLINK = {"links": 18, "version": 4, "nvml_version": 6, "gbps_per_dir": 450.0}
H100_PCIE = {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}
BUSY = {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 90}}}]}


def devices(sim_node: Any, **changes: dict[str, Any]) -> None:
    """gpu1's devices with `changes` merged into minor N's spec (key "mN")."""
    sim_node.write_devices({"gpu1": [{**spec, **changes.get(f"m{spec['minor']}", {})}
                                     for spec in SIM_DEVICES]})


def counting(monkeypatch: pytest.MonkeyPatch, *names: str) -> dict[str, int]:
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(pynvml, name)

        def counted(*args: Any, _name: str = name, _real: Any = real) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(pynvml, name, counted)
    return calls


def test_an_h100_sxm_has_18_nvlinks_of_generation_4_and_450_gbs_each_way(sim_node: Any) -> None:
    devices(sim_node, m0=H100_SXM)
    (gpu,) = sim_node.session().bind([0])
    assert gpu.nvlink == H100_NVLINK
    assert gpu.unsupported == set() and gpu.errors == []


def nvlink(links: int, version: int | None, nvml: int | None, gbps: float | None) -> dict[str, Any]:
    return {"links": links, "version": version, "nvml_version": nvml, "gbps_per_dir": gbps}


@pytest.mark.parametrize(("spec", "expected"), [
    ({"nvlinks": 12, "nvlink_version": 5}, nvlink(12, 3, 5, 300.0)),
    ({"nvlinks": 6, "nvlink_version": 2}, nvlink(6, 2, 2, 150.0)),
    ({"nvlinks": 18, "nvlink_version": 7}, nvlink(18, 5, 7, 900.0)),
    ({"nvlinks": 18, "nvlinks_active": 16, "nvlink_version": 6}, nvlink(16, 4, 6, 400.0)),
    ({"nvlinks": 18, "nvlinks_active": 0}, nvlink(0, None, None, 0.0)),
    ({"nvlinks": 18, "nvlink_version": 8}, nvlink(18, 6, 8, None)),
    ({"nvlinks": 4, "nvlink_version": 99}, nvlink(4, None, 99, None)),
], ids=["a100", "v100", "b200", "two-links-down", "none-active", "rate-unknown", "version-unknown"])
def test_nvlink_by_generation(sim_node: Any, spec: dict[str, Any], expected: dict[str, Any]) -> None:
    devices(sim_node, m0=spec)
    (gpu,) = sim_node.session().bind([0])
    assert gpu.nvlink == expected


def test_a_gpu_without_nvlink_records_none_and_no_refusal(sim_node: Any) -> None:
    (gpu,) = sim_node.session().bind([0])  # SIM_DEVICES: no NVLink
    assert gpu.nvlink is None
    assert gpu.unsupported == set() and gpu.errors == []  # expected on PCIe cards: not listed


def test_nvlink_not_supported_by_the_driver_reads_none(sim_node: Any) -> None:
    devices(sim_node, m0={**H100_SXM, "unsupported": ["nvmlDeviceGetNvLinkState"]})
    (gpu,) = sim_node.session().bind([0])
    assert gpu.nvlink is None and gpu.errors == []


def test_a_passing_nvlink_error_reads_none_and_is_said(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices(sim_node, m0=H100_SXM)

    def flaky(handle: Any, link: int) -> int:
        if link == 3:
            raise pynvml.NVMLError_Unknown()
        return 1

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", flaky)
    (gpu,) = sim_node.session().bind([0])
    assert gpu.nvlink is None  # three links counted of an unknown number: not a figure
    assert gpu.errors == ["NVLink: Unknown Error"]


def test_the_pcie_link_is_read_at_binding_and_its_highest_speed_kept(sim_node: Any) -> None:
    devices(sim_node, m0=H100_SXM)
    (gpu,) = sim_node.session().bind([0])  # idle: the link downshifted to Gen1
    assert gpu.pcie_link() == {"gen": 1, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}
    sim_node.write_state(0, BUSY, started_at=sim_node.now)
    sim_node.now += 1.0
    gpu.read_pcie(90.0)
    assert gpu.pcie_link()["gen"] == 5 and gpu.pcie_done
    sim_node.write_state(0, BUSY, started_at=sim_node.now - 1.0, ended_at=sim_node.now)
    sim_node.now += 1.0
    gpu.read_pcie(0.0)
    assert gpu.pcie_link()["gen"] == 5  # the highest seen, not the last


def test_pcie_is_read_on_busy_turns_else_now_and_then_and_not_once_at_its_most(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices(sim_node, m0=H100_SXM)
    (gpu,) = sim_node.session().bind([0])
    calls = counting(monkeypatch, "nvmlDeviceGetCurrPcieLinkGeneration")
    for _ in range(12):
        gpu.read_pcie(2.0)  # idle turns: every sixth
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 2
    gpu.read_pcie(None)  # unknown (a MIG slice): read
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 3
    sim_node.write_state(0, BUSY, started_at=sim_node.now)
    gpu.read_pcie(95.0)
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 4 and gpu.pcie_done
    for _ in range(12):
        gpu.read_pcie(95.0)
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 4


def test_pcie_not_supported_reads_none_and_stops_asking(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    unsupported = ["nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
                   "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkGeneration",
                   "nvmlDeviceGetCurrPcieLinkWidth"]
    devices(sim_node, m0={"unsupported": unsupported})
    (gpu,) = sim_node.session().bind([0])
    assert gpu.pcie_link() is None and gpu.pcie_done and gpu.errors == []
    calls = counting(monkeypatch, "nvmlDeviceGetCurrPcieLinkGeneration")
    gpu.read_pcie(None)
    assert calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 0


def test_a_passing_error_reading_the_link_costs_nothing_but_that_look(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices(sim_node, m0=H100_SXM)
    (gpu,) = sim_node.session().bind([0])

    def flaky(handle: Any) -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrPcieLinkGeneration", flaky)
    gpu.read_pcie(None)
    assert gpu.errors == [] and not gpu.pcie_done and gpu.pcie_link()["gen"] == 1


def test_the_sampler_looks_at_the_link_every_few_polls(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices(sim_node, m0=H100_SXM)
    monkeypatch.setattr(sampler_module, "LINK_EVERY_POLLS", 3)
    session = sim_node.session()
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]), clock=sim_node.clock)
    sim_node.write_state(0, BUSY, started_at=sim_node.now)
    for _ in range(2):
        sim_node.now += 1.0
        sampler.sample_once()
    assert sampler.snapshot("running").gpus[0].pcie_link["gen"] == 1  # not looked at yet
    sim_node.now += 1.0
    sampler.sample_once()
    summary = sampler.snapshot("running")
    assert summary.gpus[0].pcie_link == H100_PCIE
    assert summary.gpus[0].nvlink == H100_NVLINK


def test_a_mig_slice_reports_its_gpus_links(sim_node: Any) -> None:
    mig_gpu = {"minor": 4, "uuid": "GPU-44444444-4444-4444-4444-444444444444", "name": "NVIDIA H100 (sim)",
               **H100_SXM, "mig": [{"gi_id": 3, "uuid": "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
                                    "memory_total_gib": 10}]}
    sim_node.write_devices({"gpu1": [*SIM_DEVICES, mig_gpu]})
    (mig,) = sim_node.session().bind(["MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"])
    assert mig.nvlink == H100_NVLINK
    assert mig.pcie_link() == {"gen": 1, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}


def test_the_summary_round_trips_its_links_and_frameworks(make_summary: Any, make_gpu: Any) -> None:
    link = {"gen": 4, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5}
    nvlink = H100_NVLINK
    summary = make_summary(gpus=[make_gpu(pcie_link=link, nvlink=nvlink), make_gpu(minor=1)],
                           frameworks=["cuda", "pytorch"])
    again = NodeSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert again == summary
    assert again.frameworks == ["cuda", "pytorch"]
    assert (again.gpus[0].pcie_link, again.gpus[0].nvlink) == (link, nvlink)
    assert (again.gpus[1].pcie_link, again.gpus[1].nvlink) == (None, None)


def test_a_summary_from_before_these_fields_reads_them_as_not_measured(make_summary: Any) -> None:
    data = make_summary().to_dict()
    for key in ("frameworks",):
        del data[key]
    for gpu in data["gpus"]:
        del gpu["pcie_link"], gpu["nvlink"]
    old = NodeSummary.from_dict(data)
    assert old.frameworks is None and old.gpus[0].pcie_link is None and old.gpus[0].nvlink is None
    assert GpuSummary.from_dict(data["gpus"][0]).nvlink is None


def test_a_gpu_lost_between_its_read_and_the_link_look_is_the_next_polls_to_find(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices(sim_node, m0=H100_SXM)
    (gpu,) = sim_node.session().bind([0])

    def lost(handle: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrPcieLinkGeneration", lost)
    gpu.read_pcie(None)  # does not raise
    assert gpu.pcie_link()["gen"] == 1 and gpu.errors == []
