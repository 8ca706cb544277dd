"""The stand-in libnvidia-ml.so.1 (slurm_gpu_eff/sim/standin/) under the real pynvml.

The first part ports every test of test_sim_nvml.py (the Python imitation this library
replaces) with its figures; the rest covers what the library adds: NVML's calling
conventions (sizing calls, versioned structs, NULL pointers), the deliberate
differences from the imitation, the drivers' quirks, the "old driver" variant, and
robustness. The `node` fixture writes a devices file whose mtime (the simulated driver's
load) is BOOT, a config naming it, and scripts the library's clock (node.now).
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.sim.workload import process_start
from tests import standin
from tests.configfile import toml
from tests.unit.conftest import SIM_DEVICES, SimNode

GIB = 1024**3
BOOT = 1_700_000_000.0
BUSY = {"phases": [{"seconds": 100, "gpus": {"*": {
    "util": 80, "mem_util": 30, "mem_used_gib": 10, "power_w": 300,
}}}]}
EVENT_FIELDS = ("throttle", "xid", "processes", "lost", "energy_reset", "nvml_error")
MIG_GPU = {
    "minor": 4, "uuid": "GPU-44444444-4444-4444-4444-444444444444", "name": "NVIDIA H100 (sim)",
    "sample_period_s": 0.5,
    "mig": [{"gi_id": 3, "uuid": "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa", "memory_total_gib": 10},
            {"gi_id": 5, "uuid": "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb", "memory_total_gib": 20}],
}


# --- the state file and the simulated node ---------------------------------------------------

def _level(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [float(value.get("low", 0)), float(value["high"]), float(value["period_s"]),
                float(value.get("duty", 0.5))]
    return [float(value), 0.0, 0.0, 1.0]


def phases(profile: dict[str, Any], position: int = 0) -> list[dict[str, Any]]:
    """A profile's phases as job GPU number `position` plays them: what the library reads
    ("*" applied, then the position's own settings)."""
    out, start = [], 0.0
    for phase in profile["phases"]:
        gpus = phase.get("gpus", {})
        merged = {**gpus.get("*", {}), **gpus.get(str(position), {})}
        levels = {name: _level(v) for name, v in merged.items() if name not in EVENT_FIELDS}
        events = {name: v for name, v in merged.items() if name in EVENT_FIELDS}
        out.append({"start_s": start, "seconds": float(phase["seconds"]), "levels": levels, **events})
        start += float(phase["seconds"])
    return out


class Node(SimNode):
    """Simulated node gpu1 in tmp_path, with the library's clock under the test's control;
    its state files are written with this file's own `phases`, not the package's."""

    def __init__(self, root: Path, lib: ctypes.CDLL) -> None:
        super().__init__(root, lib)
        self.root = root
        self.config_file = root / "gpueff.toml"

    def write_config(self, text: str | None = None) -> None:
        if text is None:
            text = toml({"gpu": {"library": "x"},
                         "sim": {"devices": str(self.devices_file), "state_dir": str(self.state_dir)}})
        self.config_file.write_text(text, encoding="utf-8")

    def state_path(self, key: int | str) -> Path:
        name = f"gpu{key}.json" if isinstance(key, int) else f"{key}.json"
        return self.state_dir / self.node / name

    def write_state(
        self, key: int | str, profile: dict[str, Any], started_at: float, ended_at: float | None = None,
        position: int = 0, prior_extra_j: float = 0.0, pid: int | None = None,
        pid_start: int | None = None,
    ) -> Path:
        """What the in-job workload publishes for GPU `key` (minor) or a MIG UUID, written
        whole and renamed into place as the workload does."""
        path = self.state_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"job_id": "4242", "position": position, "profile": profile,
                 "phases": phases(profile, position), "started_at": started_at, "ended_at": ended_at,
                 "prior_extra_j": prior_extra_j, "pid": pid, "pid_start": pid_start}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        os.replace(tmp, path)
        return path


def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> Node:
    monkeypatch.setattr(pynvml, "nvmlLib", pynvml.nvmlLib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    lib = standin.load(pynvml, standin.library_path(variant))
    standin.shut_down(lib)
    node = Node(tmp_path, lib)
    node.write_devices({"gpu1": SIM_DEVICES})
    node.write_config()
    (node.state_dir / node.node).mkdir(parents=True)
    monkeypatch.setenv("GPUEFF_CONFIG", str(node.config_file))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")
    node.now = BOOT + 1000.0
    return node


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    made = make_node(tmp_path, monkeypatch, "current")
    yield made
    standin.shut_down(made.lib)
    standin.set_clock(made.lib, None)


@pytest.fixture
def old_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    made = make_node(tmp_path, monkeypatch, "old")
    yield made
    standin.shut_down(made.lib)
    standin.set_clock(made.lib, None)


def handle(minor: int) -> Any:
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        if pynvml.nvmlDeviceGetMinorNumber(h) == minor:
            return h
    raise AssertionError(f"no minor {minor}")


def with_specs(node: Node, *extra: dict[str, Any], **changes: dict[str, Any]) -> None:
    """gpu1's devices with `changes` merged into the spec of minor N (key "mN") and
    `extra` specs appended; then nvmlInit."""
    specs = [{**spec, **changes.get(f"m{spec['minor']}", {})} for spec in SIM_DEVICES]
    node.write_devices({"gpu1": specs + list(extra)})
    pynvml.nvmlInit()


# === the port of test_sim_nvml.py ===================================================================

# --- the device list ------------------------------------------------------------------------------

def test_devices_enumerate_in_file_order_with_their_identity(node: Node) -> None:
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    assert [pynvml.nvmlDeviceGetMinorNumber(h) for h in handles] == [1, 2, 0, 3]
    assert pynvml.nvmlDeviceGetUUID(handles[2]) == "GPU-00000000-0000-0000-0000-000000000000"
    assert pynvml.nvmlDeviceGetName(handles[3]) == "NVIDIA A100 (sim)"
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handles[0]) == 700_000  # mW
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handles[3]) == 400_000


def test_index_out_of_range_is_invalid_argument(node: Node) -> None:
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(-1)


def test_a_handle_must_be_a_device(node: Node) -> None:
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(0)
    real = pynvml.nvmlDeviceGetHandleByIndex(0)
    inside = ctypes.cast(ctypes.c_void_p(ctypes.cast(real, ctypes.c_void_p).value + 8), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a pointer into a device, not to one
        pynvml.nvmlDeviceGetName(inside)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t))


def test_missing_devices_file_is_driver_not_loaded(node: Node) -> None:
    node.write_config(toml({"sim": {"devices": str(node.root / "absent.json"),
                                    "state_dir": str(node.state_dir)}}))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_a_node_missing_from_the_devices_file_is_driver_not_loaded(
    node: Node, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "gpu9")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


# --- uninitialised use ----------------------------------------------------------------------------

def test_calls_before_init_raise_uninitialized(node: Node) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_a_handle_is_dead_after_shutdown(node: Node) -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetMinorNumber(h)


def test_every_init_reads_the_settings_afresh(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """The imitation's configure() reset an initialised library; the library has no
    configure: it reads its settings at every nvmlInit, and a failed init leaves an
    initialised library serving what it had."""
    node.write_devices({"gpu1": SIM_DEVICES, "gpu2": SIM_DEVICES[:1]})
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4
    monkeypatch.setenv("SLURMD_NODENAME", "gpu2")
    pynvml.nvmlInit()  # the refcount is 2 now
    assert pynvml.nvmlDeviceGetCount() == 1
    monkeypatch.setenv("GPUEFF_CONFIG", str(node.root / "absent.toml"))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1  # one init still holds it
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


# --- errors, shaped like pynvml's ---------------------------------------------------------------

def error_text(lib: ctypes.CDLL, code: int) -> str:
    fn = lib.nvmlErrorString
    fn.restype = ctypes.c_char_p
    return fn(code).decode()


def test_nvmlerror_code_builds_its_subclass(node: Node) -> None:
    error = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(error) is pynvml.NVMLError_NotSupported
    assert isinstance(error, pynvml.NVMLError)
    assert error.value == 3
    assert str(error) == "Not Supported"
    assert error_text(node.lib, 3) == "Not Supported"  # the library's own text agrees


def test_subclasses_carry_their_code_and_message(node: Node) -> None:
    lost = pynvml.NVMLError_GpuIsLost()
    assert (lost.value, str(lost)) == (15, "GPU is lost")
    assert isinstance(lost, pynvml.NVMLError)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert error_text(node.lib, 15) == "GPU is lost"


def test_an_unknown_code_builds_the_base_class(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string))
    error = pynvml.NVMLError(12345)
    assert type(error) is pynvml.NVMLError
    assert error.value == 12345
    with monkeypatch.context() as unloaded:  # no library: pynvml's own fallback
        unloaded.setattr(pynvml, "nvmlLib", None)
        unloaded.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        assert str(error) == "NVML Error with code 12345"
    assert str(pynvml.NVMLError(12345)) == "Unknown Error"  # the library's text, as the driver's


def test_an_unsupported_function_raises_not_supported(node: Node) -> None:
    pynvml.nvmlInit()
    a100 = handle(3)  # its spec: "unsupported": ["nvmlDeviceGetTotalEnergyConsumption"]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(a100)
    assert pynvml.nvmlDeviceGetPowerUsage(a100) == 50_000  # the rest still works


# --- readings: idle, busy, ended --------------------------------------------------------------

def test_an_idle_gpu_reads_idle_values(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (0, 0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (memory.total, memory.used, memory.free) == (80 * GIB, 0, 80 * GIB)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000


def test_a_constant_workload_reads_its_constants(node: Node) -> None:
    node.write_state(0, BUSY, started_at=BOOT + 950.0)
    pynvml.nvmlInit()  # now = BOOT + 1000: 50 s into a 100 s phase
    h = handle(0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (80, 30)
    assert isinstance(rates.gpu, int)
    memory = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (memory.total, memory.used, memory.free) == (80 * GIB, 10 * GIB, 70 * GIB)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 300_000  # mW
    # other GPUs of the node have no workload: idle
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(1)).gpu == 0


def test_energy_counter_is_the_integral_of_power_since_driver_load(node: Node) -> None:
    node.write_state(0, BUSY, started_at=BOOT + 950.0)
    pynvml.nvmlInit()
    h = handle(0)
    # 1000 s at 60 W idle + 50 s at (300 - 60) W more = 60000 + 12000 J
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 72_000_000  # mJ
    node.now = BOOT + 1010.0
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 75_000_000  # +10 s at 300 W
    node.now = BOOT + 1100.0  # the 100 s phase ended at BOOT + 1050: idle after it
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == (1100 * 60 + 100 * 240) * 1000


def test_energy_counter_increases_between_calls(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(1)
    readings = []
    for step in range(5):
        node.now = BOOT + 10.0 + step * 0.5
        readings.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
    assert readings == [600_000 + 30_000 * i for i in range(5)]  # 60 W idle: 30 J per 0.5 s


def test_a_workload_that_ended_reads_idle(node: Node) -> None:
    node.write_state(0, BUSY, started_at=BOOT + 950.0, ended_at=BOOT + 970.0)
    pynvml.nvmlInit()  # now = BOOT + 1000: ended 30 s ago, though its profile runs 100 s
    h = handle(0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (0, 0)
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 0
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == (1000 * 60 + 20 * 240) * 1000


def test_utilisation_is_the_mean_of_the_last_complete_sample_window(node: Node) -> None:
    wave = {"phases": [{"seconds": 100, "gpus": {"*": {
        "util": {"low": 0, "high": 100, "period_s": 1, "duty": 0.5}}}}]}
    node.write_state(0, wave, started_at=BOOT + 950.0)  # minor 0: 0.5 s windows
    node.write_state(2, wave, started_at=BOOT + 950.0)  # minor 2: 1 s windows
    pynvml.nvmlInit()
    node.now = BOOT + 959.75  # last complete 0.5 s window: t in [9.0, 9.5): high
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 100
    node.now = BOOT + 960.25  # window [9.5, 10.0): low
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    # 1 s windows span a whole period: the duty-weighted mean, whatever the instant
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 50


def test_power_is_a_one_second_average(node: Node) -> None:
    profile = {"phases": [{"seconds": 0.5, "gpus": {"*": {"power_w": 500}}}]}
    node.write_state(0, profile, started_at=BOOT + 999.25)
    pynvml.nvmlInit()  # [now - 1, now]: 0.25 s idle, 0.5 s at 500 W, 0.25 s idle
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == 280_000  # (15 + 250 + 15) J / 1 s


def test_memory_used_is_capped_at_the_total(node: Node) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"mem_used_gib": 60}}}]}
    node.write_state(3, profile, started_at=BOOT + 990.0)  # a 40 GiB card
    pynvml.nvmlInit()
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle(3))
    assert (memory.total, memory.used, memory.free) == (40 * GIB, 40 * GIB, 0)


def test_a_corrupt_state_file_reads_idle(node: Node) -> None:
    path = node.write_state(0, BUSY, started_at=BOOT + 950.0)
    path.write_text('{"position": 0, "phases": ', encoding="utf-8")  # half-written
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == 60_000


def test_per_gpu_position_selects_the_override(node: Node) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 20}, "1": {"util": 70}}}]}
    node.write_state(0, profile, started_at=BOOT + 900.0, position=0)
    node.write_state(2, profile, started_at=BOOT + 900.0, position=1)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 20
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 70


# --- driven by state files as the in-job publisher writes them ---------------------------------------

def test_publisher_state_files_drive_the_readings(node: Node) -> None:
    """The job's GPUs [2, 0]: minor 2 plays position 0, minor 0 position 1, with the
    workload's pid (alive: this process)."""
    for position, minor in enumerate([2, 0]):
        node.write_state(minor, BUSY, started_at=BOOT + 900.0, position=position, pid=os.getpid())
    state = json.loads(node.state_path(0).read_text())
    assert (state["position"], state["pid"], state["phases"][0]["levels"]["util"]) == (
        1, os.getpid(), [80.0, 0.0, 0.0, 1.0])
    pynvml.nvmlInit()
    node.now = BOOT + 1001.0  # its window [1000, 1001] is after the 100 s profile: idle
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 0
    node.now = BOOT + 1000.0  # window [999, 1000]: the profile's last second
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 80
    node.now = BOOT + 950.0
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 80
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(1)).gpu == 0  # not the job's


def test_publisher_end_makes_the_gpu_idle(node: Node) -> None:
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=os.getpid())
    node.write_state(0, BUSY, started_at=BOOT + 950.0, ended_at=BOOT + 960.0, pid=os.getpid())
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == (1000 * 60 + 10 * 240) * 1000


def test_energy_counter_never_runs_backwards_across_workloads(node: Node) -> None:
    pynvml.nvmlInit()
    node.write_state(0, BUSY, started_at=BOOT + 100.0, ended_at=BOOT + 120.0)
    node.now = BOOT + 500.0
    before = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    assert before == (500 * 60 + 20 * 240) * 1000
    # the next job on this GPU carries the energy earlier workloads added: 20 s at +240 W
    node.write_state(0, BUSY, started_at=BOOT + 500.0, prior_extra_j=20 * 240.0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == before
    node.now = BOOT + 501.0
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == before + 300_000


# --- the library must not invent API ----------------------------------------------------------------

CURRENT_EXPORTS = {
    "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkVersion",
    "gpueffSimSetClock",
}
OLD_DRIVER_LACKS = {
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
}
# The pynvml functions the package calls (slurm_gpu_eff/node/gpu.py and its tests).
PACKAGE_USES = [
    "nvmlInit", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetSamples", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait", "nvmlEventSetFree", "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkVersion",
]


def exported(path: str) -> set[str]:
    """The library's dynamic symbols (what dlsym can find)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def looked_up(name: str, seen: set[str] | None = None) -> set[str]:
    """The C symbols pynvml's function `name` looks up, through the pynvml functions it
    calls in turn."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    source = inspect.getsource(getattr(pynvml, name))
    symbols = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    for called in set(re.findall(r"\b(nvml\w+)\(", source)) - {name}:
        if inspect.isfunction(getattr(pynvml, called, None)):
            symbols |= looked_up(called, seen)
    return symbols


def nvml_header() -> str:
    import nvidia

    for directory in nvidia.__path__:
        path = Path(directory) / "cu13" / "include" / "nvml.h"
        if path.exists():
            return path.read_text(encoding="utf-8")
    raise AssertionError("nvml.h (nvidia-nvml-dev) is not installed")


def test_library_exports_the_api_the_package_uses() -> None:
    names = exported(standin.library_path())
    needed = set().union(*(looked_up(name) for name in PACKAGE_USES))
    assert {"nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlEventSetWait_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetTemperatureV"} <= needed
    assert needed <= names


def test_library_exports_exactly_its_api() -> None:
    assert exported(standin.library_path()) == CURRENT_EXPORTS
    assert exported(standin.library_path("old")) == CURRENT_EXPORTS - OLD_DRIVER_LACKS


# nvmlInit_v2: what nvml.h makes of a C caller's nvmlInit (pynvml calls nvmlInitWithFlags).
@pytest.mark.parametrize("symbol", sorted(CURRENT_EXPORTS - {"gpueffSimSetClock", "nvmlInit_v2"}))
def test_every_exported_symbol_is_one_pynvml_looks_up(symbol: str) -> None:
    source = inspect.getsource(pynvml)
    assert f'_nvmlGetFunctionPointer("{symbol}")' in source, f"pynvml never calls {symbol}"


@pytest.mark.parametrize("symbol", sorted(CURRENT_EXPORTS - {"gpueffSimSetClock"}))
def test_every_exported_symbol_is_declared_in_nvml_h(symbol: str) -> None:
    """nvml.h declares it, so the compiler held our definition to NVIDIA's parameters."""
    assert re.search(rf"DECLDIR[\w\s*]*\b{symbol}\s*\(", nvml_header()), symbol


def header_constants() -> dict[str, int]:
    text = nvml_header()
    found = {name: int(value, 0) for name, value in
             re.findall(r"#define\s+(\w+)\s+(0x[0-9A-Fa-f]+|\d+)(?:U?LL|U)?\b", text)}
    enums = re.findall(r"\b(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*(?:,|//|$)", text, re.MULTILINE)
    found.update({name: int(value, 0) for name, value in enums})
    return found


def test_header_constants_the_library_uses_match_pynvml() -> None:
    header = header_constants()
    same_name = [n for n in dir(pynvml) if n.startswith("NVML_ERROR_")] + [
        "NVML_GPM_METRICS_GET_VERSION", "NVML_GPM_SUPPORT_VERSION", "nvmlEventTypeXidCriticalError",
        "nvmlClocksEventReasonGpuIdle", "nvmlClocksEventReasonSwPowerCap",
        "nvmlClocksEventReasonSwThermalSlowdown", "NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM",
        "NVML_TOTAL_POWER_SAMPLES", "NVML_GPU_UTILIZATION_SAMPLES", "NVML_MEMORY_UTILIZATION_SAMPLES",
        "NVML_VALUE_TYPE_UNSIGNED_INT", "NVML_DEVICE_MIG_DISABLE", "NVML_DEVICE_MIG_ENABLE",
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_GPM_METRIC_MAX", "NVML_GPM_METRIC_SM_UTIL",
        "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "NVML_GPM_METRIC_DRAM_BW_UTIL",
        "NVML_GPM_METRIC_FP64_UTIL", "NVML_GPM_METRIC_FP32_UTIL", "NVML_GPM_METRIC_FP16_UTIL",
        "NVML_GPM_METRIC_PCIE_TX_PER_SEC", "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
        "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
    ]
    assert len(same_name) >= 40
    for name in same_name:
        assert header[name] == getattr(pynvml, name), name
    # nvml.h 13.5 has these three only under their older ClocksThrottleReason names
    for reason in ("HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"):
        ours = header[f"nvmlClocksThrottleReason{reason}"]
        assert ours == getattr(pynvml, f"nvmlClocksEventReason{reason}"), reason
    # versioned structs: NVML_STRUCT_VERSION(name, v) = sizeof | v << 24, same layouts
    assert pynvml.nvmlMemory_v2 == ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) | 2 << 24
    assert pynvml.nvmlTemperature_v1 == ctypes.sizeof(pynvml.c_nvmlTemperature_v1_t) | 1 << 24


# === what the library adds ============================================================================

# --- configuration -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [
    '[gpu]\nlibrary = "x"\n',  # no [sim]
    '[sim]\nstate_dir = "{state}"\n',  # no devices
    '[sim]\ndevices = "{devices}"\n',  # no state_dir
    '[sim]\ndevices = "{devices}"\nstate_dir = "{state}"\ntime_scale = "fast"\n',
    '[sim]\ndevices = "{devices}"\nstate_dir = "{state}"\ntime_scale = 0\n',
    '[sim]\ndevices = "{devices}"\nstate_dir = "{state}"\ntime_scale = -2\n',
    '[other]\ndevices = "{devices}"\nstate_dir = "{state}"\n',
])
def test_an_incomplete_config_is_driver_not_loaded(node: Node, config: str) -> None:
    node.write_config(config.format(devices=node.devices_file, state=node.state_dir))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_config_keys_and_sections_are_case_insensitive_with_comments(node: Node) -> None:
    node.write_config(f'# site config\n# another comment\n[GPU]\nlibrary = "x"\n[ Sim ]\n'
                      f'  DEVICES = "{node.devices_file}"  \nState_Dir="{node.state_dir}"\n'
                      f'[hooks]\ndevices = "/nonexistent"\n')
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4


def test_no_config_file_is_driver_not_loaded(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEFF_CONFIG", str(node.root / "absent.toml"))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    if not os.path.exists("/etc/slurm-gpu-eff/gpueff.toml"):
        monkeypatch.delenv("GPUEFF_CONFIG")  # the default path, absent here
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()


def test_the_node_is_the_short_hostname_without_slurmd_nodename(
    node: Node, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURMD_NODENAME")
    node.write_devices({socket.gethostname().split(".")[0]: SIM_DEVICES[:2], "gpu1": SIM_DEVICES})
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2


def test_a_bare_list_is_this_nodes_devices(node: Node) -> None:
    node.write_devices(SIM_DEVICES[:3])
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 3


def test_spec_defaults_are_the_imitations(node: Node) -> None:
    node.write_devices({"gpu1": [{"minor": 7, "uuid": "GPU-7"}]})
    pynvml.nvmlInit()
    h = handle(7)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA simulated GPU"
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 80 * GIB
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 32
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    assert pynvml.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    # 1/6 s windows, 120 of them buffered
    _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 120
    assert samples[-1].timeStamp - samples[-2].timeStamp in (166_666, 166_667)


@pytest.mark.parametrize("table", [
    "not json", '{"gpu1": [{"uuid": "GPU-x"}]}', '{"gpu1": [{"minor": 1}]}',
    '{"gpu1": [{"minor": -1, "uuid": "GPU-x"}]}', '{"gpu1": [{"minor": 1.5, "uuid": "GPU-x"}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "sample_period_s": 0}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "name": null}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "quirks": ["sample_reversed"]}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "mig": [{"gi_id": 1}]}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "mig": [{"uuid": "MIG-1"}, {"uuid": "MIG-2"}, '
    '{"uuid": "MIG-3"}, {"uuid": "MIG-4"}, {"uuid": "MIG-5"}, {"uuid": "MIG-6"}, {"uuid": "MIG-7"}, '
    '{"uuid": "MIG-8"}]}]}',
    '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "name": "' + "N" * 65 + '"}]}',
    json.dumps({"gpu1": [{"minor": i, "uuid": f"GPU-{i}"} for i in range(65)]}),
    '{"gpu1": {"minor": 1}}', '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[',
    "[" * 100_000, '{"gpu1": [{"minor": 1, "uuid": "GPU-x", "memory_total_gib": 1e999}]}',
])
def test_an_invalid_devices_file_is_driver_not_loaded(node: Node, table: str) -> None:
    node.devices_file.write_text(table, encoding="utf-8")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


# --- the clock ------------------------------------------------------------------------------------

def test_the_real_clock_runs_time_scale_times_faster_since_boot(node: Node) -> None:
    boot = time.time() - 10.0
    node.write_devices({"gpu1": SIM_DEVICES})
    os.utime(node.devices_file, (boot, boot))
    node.write_config(toml({"sim": {"devices": str(node.devices_file), "state_dir": str(node.state_dir),
                                    "time_scale": 1000}}))
    standin.set_clock(node.lib, None)
    pynvml.nvmlInit()
    # 60 W idle since boot: the counter tells the simulated time since boot
    since_boot = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) / 60_000
    assert 10_000 <= since_boot <= 10_000 + 1000 * 5
    standin.set_clock(node.lib, boot + 50.0)  # a fixed clock is simulated time itself
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == pytest.approx(50 * 60_000, abs=1)
    standin.set_clock(node.lib, 0)  # <= 0: the real clock again
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) / 60_000 >= 10_000


def test_time_scale_one_is_the_wall_clock(node: Node) -> None:
    standin.set_clock(node.lib, None)
    pynvml.nvmlInit()
    since_boot = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) / 60_000
    assert abs(since_boot - (time.time() - BOOT)) < 5


# --- memory: v1 counts the driver's reservation as used, v2 keeps it apart ---------------------------

def test_memory_v1_counts_reserved_as_used_and_v2_keeps_it_apart(node: Node) -> None:
    with_specs(node, m0={"reserved_mem_gib": 2})
    h = handle(0)
    idle1, idle2 = pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
    assert (idle1.total, idle1.used, idle1.free) == (80 * GIB, 2 * GIB, 78 * GIB)  # idle, yet "used"
    assert (idle2.total, idle2.reserved, idle2.used, idle2.free) == (80 * GIB, 2 * GIB, 0, 78 * GIB)
    node.write_state(0, BUSY, started_at=BOOT + 950.0)
    v1, v2 = pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
    assert (v1.total, v1.used, v1.free) == (80 * GIB, 12 * GIB, 68 * GIB)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (80 * GIB, 2 * GIB, 10 * GIB, 68 * GIB)
    assert pynvml.nvmlDeviceGetMemoryInfo(handle(1), pynvml.nvmlMemory_v2).reserved == 0


def test_memory_used_stops_at_what_the_reservation_leaves(node: Node) -> None:
    with_specs(node, m0={"reserved_mem_gib": 2})
    node.write_state(0, {"phases": [{"seconds": 100, "gpus": {"*": {"mem_used_gib": 79}}}]}, BOOT + 990.0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle(0))
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle(0), pynvml.nvmlMemory_v2)
    assert (v1.used, v1.free) == (80 * GIB, 0)
    assert (v2.reserved, v2.used, v2.free) == (2 * GIB, 78 * GIB, 0)


def test_memory_v2_checks_the_struct_version(node: Node) -> None:
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle(0), version=pynvml.nvmlMemory_v2 - 1)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle(0), version=1 << 24 | 40)


# --- per-process utilisation: the last complete driver window --------------------------------------

WAVE = {"phases": [{"seconds": 100, "gpus": {"*": {
    "util": {"low": 0, "high": 100, "period_s": 1, "duty": 0.5}, "mem_used_gib": 4}}}]}


def stamp(t: float) -> int:
    return round(t * 1e6)


def test_process_utilization_is_the_last_window_not_a_mean_since(node: Node) -> None:
    node.write_state(0, WAVE, started_at=BOOT + 950.0, pid=os.getpid())  # 0.5 s windows
    pynvml.nvmlInit()
    h = handle(0)
    node.now = BOOT + 959.75  # last complete window [959.0, 959.5]: high
    found = pynvml.nvmlDeviceGetProcessUtilization(h, 0)  # a mean since 0 would be ~50
    assert [(s.pid, s.smUtil, s.memUtil, s.timeStamp) for s in found] == [
        (os.getpid(), 100, 0, stamp(BOOT + 959.5))]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than that window
        pynvml.nvmlDeviceGetProcessUtilization(h, found[0].timeStamp)
    with pytest.raises(pynvml.NVMLError_NotFound):  # a window ending after lastSeen only counts
        pynvml.nvmlDeviceGetProcessUtilization(h, found[0].timeStamp + 1)
    assert len(pynvml.nvmlDeviceGetProcessUtilization(h, found[0].timeStamp - 1)) == 1
    node.now = BOOT + 960.25  # window [959.5, 960.0]: low, so no process was busy
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, found[0].timeStamp)
    node.now = BOOT + 960.75
    again = pynvml.nvmlDeviceGetProcessUtilization(h, found[0].timeStamp)
    assert [(s.smUtil, s.timeStamp) for s in again] == [(100, stamp(BOOT + 960.5))]


def test_process_utilization_lists_a_sharing_job_apart(node: Node) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 30, "shared_util": 20}}}]}
    node.write_state(0, profile, started_at=BOOT + 950.0, pid=os.getpid())
    pynvml.nvmlInit()
    found = pynvml.nvmlDeviceGetProcessUtilization(handle(0), 0)
    assert [(s.pid, s.smUtil) for s in found] == [(os.getpid(), 30), (1, 20)]
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 50


def test_process_utilization_of_an_idle_gpu_is_not_found(node: Node) -> None:
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(handle(0), 0)


# --- GPM ------------------------------------------------------------------------------------------

GPM_PROFILE = {"phases": [{"seconds": 100, "gpus": {"*": {
    "sm_active": 40, "sm_occupancy": 25, "tensor_active": {"low": 0, "high": 60, "period_s": 1, "duty": 0.5},
    "dram_active": 50, "fp16_active": 11, "fp32_active": 12, "fp64_active": 13, "pcie_tx_mbps": 100,
    "pcie_rx_mbps": 200, "nvlink_rx_mbps": 300, "nvlink_tx_mbps": 400}}}]}
GPM_EXPECTED = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 25.0,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 30.0, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 50.0,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 11.0, pynvml.NVML_GPM_METRIC_FP32_UTIL: 12.0,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 13.0, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 200.0, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 300.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 400.0,
}


def gpm_request(first: Any, second: Any, ids: list[int]) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    return request


def take_two(node: Node, take: Callable[[Any], Any], t1: float, t2: float) -> tuple[Any, Any]:
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    node.now = t1
    take(first)
    node.now = t2
    take(second)
    return first, second


def test_gpm_gives_exact_means_between_two_samples(node: Node) -> None:
    node.write_state(0, GPM_PROFILE, started_at=BOOT + 950.0)
    pynvml.nvmlInit()
    h = handle(0)
    support = pynvml.nvmlGpmQueryDeviceSupport(h)
    assert (support.version, support.isSupportedDevice) == (pynvml.NVML_GPM_SUPPORT_VERSION, 1)
    first, second = take_two(node, lambda s: pynvml.nvmlGpmSampleGet(h, s), BOOT + 1000.0, BOOT + 1002.0)
    ids = [*GPM_EXPECTED, pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 476]
    request = pynvml.nvmlGpmMetricsGet(gpm_request(first, second, ids))
    got = {request.metrics[i].metricId: (request.metrics[i].nvmlReturn, request.metrics[i].value)
           for i in range(len(ids))}
    assert got == {**{m: (0, v) for m, v in GPM_EXPECTED.items()},
                   pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0),
                   476: (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)}
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed: no longer a sample
        pynvml.nvmlGpmSampleFree(first)


def test_gpm_samples_must_be_more_than_100_ms_apart(node: Node) -> None:
    node.write_state(0, GPM_PROFILE, started_at=BOOT + 950.0)
    pynvml.nvmlInit()
    h = handle(0)

    def take(sample: Any) -> Any:
        return pynvml.nvmlGpmSampleGet(h, sample)

    assert 0.225 - 0.125 == 0.1  # exactly 100 ms on the simulated clock: refused
    for t1, t2 in [(0.125, 0.225), (BOOT + 1000.0, BOOT + 1000.05), (BOOT + 1000.0, BOOT + 1000.0),
                   (BOOT + 1000.5, BOOT + 1000.0)]:
        first, second = take_two(node, take, t1, t2)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmMetricsGet(gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL]))
    first, second = take_two(node, take, BOOT + 1000.0, BOOT + 1000.11)
    request = pynvml.nvmlGpmMetricsGet(gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL]))
    assert request.metrics[0].value == 40.0
    untaken = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(gpm_request(first, untaken, [pynvml.NVML_GPM_METRIC_SM_UTIL]))


def test_gpm_samples_must_be_of_one_target(node: Node) -> None:
    with_specs(node, MIG_GPU)
    h = handle(4)
    mig_uuid = MIG_GPU["mig"][0]["uuid"]
    node.write_state(mig_uuid, GPM_PROFILE, started_at=BOOT + 950.0)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, first)
    node.now = BOOT + 1001.0
    pynvml.nvmlGpmMigSampleGet(h, 3, second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL]))
    # per GPU instance: the instance's own state file
    pynvml.nvmlGpmMigSampleGet(h, 3, first)
    node.now = BOOT + 1002.0
    pynvml.nvmlGpmMigSampleGet(h, 3, second)
    request = pynvml.nvmlGpmMetricsGet(gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL]))
    assert request.metrics[0].value == 40.0
    pynvml.nvmlGpmSampleGet(h, first)  # the whole GPU: no workload of its own
    node.now = BOOT + 1003.0
    pynvml.nvmlGpmSampleGet(h, second)
    request = pynvml.nvmlGpmMetricsGet(gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL]))
    assert request.metrics[0].value == 0.0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(h, 4, first)


def test_gpm_where_there_is_none(node: Node) -> None:
    with_specs(node, MIG_GPU, m1={"gpm": False})
    h = handle(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, sample)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # GPM of a MIG instance: via its GPU
        pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(4), 0), sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not a sample of ours
        pynvml.nvmlGpmSampleGet(handle(0), ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlGpmSample_t))


def test_gpm_structs_are_versioned(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    first, second = take_two(node, lambda s: pynvml.nvmlGpmSampleGet(h, s), BOOT + 1000.0, BOOT + 1001.0)
    request = gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL])
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION + 1
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)
    support = pynvml.c_nvmlGpmSupport_t()
    support.version = pynvml.NVML_GPM_SUPPORT_VERSION + 1
    assert node.lib.nvmlGpmQueryDeviceSupport(h, ctypes.byref(support)) == \
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    request = gpm_request(first, second, [])
    request.numMetrics = pynvml.NVML_GPM_METRIC_MAX + 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(request)


# --- XID events -----------------------------------------------------------------------------------

XIDS = {"phases": [{"seconds": 10, "gpus": {"*": {"util": 50}}},
                   {"seconds": 10, "gpus": {"*": {"util": 50, "xid": [79, 48]}}},
                   {"seconds": 10, "gpus": {"*": {"util": 50, "xid": [13]}}}]}


def drain(events: Any) -> list[tuple[str, int, int, int]]:
    found = []
    while True:
        try:
            event = pynvml.nvmlEventSetWait_v2(events, 0)
        except pynvml.NVMLError_Timeout:
            return found
        found.append((pynvml.nvmlDeviceGetUUID(event.device), event.eventType, event.eventData,
                      event.gpuInstanceId))


def test_xid_events_arrive_through_an_event_set(node: Node) -> None:
    node.write_state(0, XIDS, started_at=BOOT + 990.0)
    node.now = BOOT + 995.0
    pynvml.nvmlInit()
    h = handle(0)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):  # nothing yet, and no waiting for it
        pynvml.nvmlEventSetWait_v2(events, 5000)
    assert time.monotonic() - started < 1
    assert pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    node.now = BOOT + 1000.0  # the second phase starts: its XIDs
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert drain(events) == [(uuid, xid, 79, 0xFFFFFFFF), (uuid, xid, 48, 0xFFFFFFFF)]
    assert pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 1  # XID 48
    assert pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    node.now = BOOT + 1030.0
    assert drain(events) == [(uuid, xid, 13, 0xFFFFFFFF)]
    pynvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(events, 0)


def test_a_gpu_registered_twice_delivers_each_event_twice(node: Node) -> None:
    node.write_state(0, XIDS, started_at=BOOT + 990.0)
    node.now = BOOT + 995.0
    pynvml.nvmlInit()
    h = handle(0)
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    pynvml.nvmlDeviceRegisterEvents(handle(1), pynvml.nvmlEventTypeXidCriticalError, events)
    node.now = BOOT + 1000.0
    assert [code for _, _, code, _ in drain(events)] == [79, 48, 79, 48]
    pynvml.nvmlEventSetFree(events)


def test_events_before_registration_or_of_other_types_are_not_delivered(node: Node) -> None:
    node.write_state(0, XIDS, started_at=BOOT + 990.0)
    pynvml.nvmlInit()
    node.now = BOOT + 1005.0  # after the first XIDs
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, events)
    other = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeSingleBitEccError, other)
    node.now = BOOT + 1030.0
    assert [code for _, _, code, _ in drain(events)] == [13]
    assert drain(other) == []
    for event_set in (events, other):
        pynvml.nvmlEventSetFree(event_set)


# --- the drivers' quirks ----------------------------------------------------------------------------

def samples(h: Any, kind: int = pynvml.NVML_GPU_UTILIZATION_SAMPLES, since: int = 0) -> list[tuple[int, int]]:
    _, found = pynvml.nvmlDeviceGetSamples(h, kind, since)
    return [(s.timeStamp, s.sampleValue.uiVal) for s in found]


def test_samples_are_the_buffered_windows_newer_than_the_timestamp(node: Node) -> None:
    node.write_state(0, WAVE, started_at=BOOT + 950.0)
    pynvml.nvmlInit()
    h = handle(0)  # 0.5 s windows, 120 buffered
    found = samples(h)
    assert len(found) == 120
    assert found[-1] == (stamp(BOOT + 1000.0), 0)  # [999.5, 1000]: rel [49.5, 50]: low
    assert found[-2] == (stamp(BOOT + 999.5), 100)
    assert found[0][0] == stamp(BOOT + 1000.0 - 119 * 0.5)
    assert samples(h, since=found[-3][0]) == found[-2:]
    with pytest.raises(pynvml.NVMLError_NotFound):
        samples(h, since=found[-1][0])
    power = samples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, found[-2][0])
    assert power == [(stamp(BOOT + 1000.0), 60_000)]  # mW, idle power: the wave sets none
    with pytest.raises(pynvml.NVMLError_NotSupported):
        samples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES)


def test_quirk_samples_reversed_gives_newest_first(node: Node) -> None:
    node.write_state(0, WAVE, started_at=BOOT + 950.0)
    with_specs(node, m2={"quirks": ["samples_reversed"]})
    node.write_state(2, WAVE, started_at=BOOT + 950.0)
    plain = samples(handle(0))
    reversed_ = samples(handle(2))
    assert [s for s, _ in reversed_] == sorted((s for s, _ in reversed_), reverse=True)
    assert len(reversed_) == 120
    assert reversed_[0][0] == plain[-1][0]


def test_quirk_samples_jitter_moves_each_timestamp_the_same_way_every_call(node: Node) -> None:
    with_specs(node, m0={"quirks": ["samples_jitter"]})
    node.write_state(0, BUSY, started_at=BOOT + 900.0)
    h = handle(0)
    first = samples(h)
    assert first == samples(h)  # same windows, same offsets
    stamps = [s for s, _ in first]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps) and len(stamps) == 120
    assert stamps[-1] <= stamp(node.now)  # only windows that have ended
    offsets = [s / 1e6 / 0.5 - round(s / 1e6 / 0.5) for s in stamps]
    assert all(abs(o) <= 0.2 + 1e-6 for o in offsets)
    assert max(offsets) > 0.1 and min(offsets) < -0.1  # really moved, both ways
    assert {v for _, v in first} == {80}
    node.now += 1.0
    newer = samples(h, since=stamps[-1])
    assert 1 <= len(newer) <= 4 and newer[0][0] > stamps[-1]
    assert samples(h, since=stamps[-5])[:4] == first[-4:]


def test_quirk_boot_clock_counts_microseconds_since_boot(node: Node) -> None:
    with_specs(node, m0={"quirks": ["boot_clock"]})
    node.write_state(0, WAVE, started_at=BOOT + 950.0, pid=os.getpid())
    h = handle(0)
    found = samples(h)
    assert found[-1][0] == 1_000_000_000  # 1000 s after the driver's load
    assert samples(h, since=999_000_000) == found[-2:]
    node.now = BOOT + 959.75
    busy = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.smUtil, s.timeStamp) for s in busy] == [(100, 959_500_000)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 959_500_000)


def test_quirk_empty_success_answers_success_with_nothing(node: Node) -> None:
    with_specs(node, m0={"quirks": ["empty_success"]})
    h = handle(0)
    newest = samples(h)[-1][0]
    assert samples(h, since=newest) == []  # pynvml returns an empty list
    with pytest.raises(pynvml.NVMLError) as raised:  # pynvml raises NVMLError(SUCCESS)
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert type(raised.value) is pynvml.NVMLError and raised.value.value == pynvml.NVML_SUCCESS
    with pytest.raises(pynvml.NVMLError_NotFound):  # other GPUs: the usual answer
        samples(handle(1), since=stamp(node.now))


def test_quirk_process_util_over_100_adds_a_second_sample(node: Node) -> None:
    with_specs(node, m0={"quirks": ["process_util_over_100"]})
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 30, "shared_util": 20}}}]}
    node.write_state(0, profile, started_at=BOOT + 950.0, pid=os.getpid())
    found = pynvml.nvmlDeviceGetProcessUtilization(handle(0), 0)
    assert [(s.pid, s.smUtil) for s in found] == [(os.getpid(), 30), (os.getpid(), 130), (1, 20), (1, 120)]


# --- two-call conventions: time passes between the sizing call and the real one ----------------------

def test_get_samples_second_call_fills_at_most_the_count(node: Node) -> None:
    node.write_state(0, WAVE, started_at=BOOT + 950.0)
    pynvml.nvmlInit()
    h = handle(0)
    fn = node.lib.nvmlDeviceGetSamples
    kind, since = pynvml.NVML_GPU_UTILIZATION_SAMPLES, ctypes.c_ulonglong(stamp(BOOT + 995.0))
    value_type, count = ctypes.c_uint(), ctypes.c_uint(0)
    assert fn(h, kind, since, ctypes.byref(value_type), ctypes.byref(count), None) == 0
    assert (count.value, value_type.value) == (10, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
    node.now += 1.0  # two more windows meanwhile
    buffer = (pynvml.c_nvmlSample_t * 10)()
    assert fn(h, kind, since, ctypes.byref(value_type), ctypes.byref(count), buffer) == 0
    assert count.value == 10  # the oldest ten: nothing lost, the next call gets the rest
    assert [b.timeStamp for b in buffer] == [stamp(BOOT + 995.5 + 0.5 * i) for i in range(10)]
    rest = samples(h, since=buffer[9].timeStamp)
    assert [s for s, _ in rest] == [stamp(BOOT + 1000.5), stamp(BOOT + 1001.0)]
    count.value = 0
    assert fn(h, kind, since, ctypes.byref(value_type), ctypes.byref(count), buffer) == \
        pynvml.NVML_ERROR_INVALID_ARGUMENT  # a buffer said to hold nothing
    assert fn(h, kind, since, ctypes.byref(value_type), None, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_process_utilization_second_call_fills_at_most_the_count(node: Node) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 30, "shared_util": 20}}}]}
    node.write_state(0, profile, started_at=BOOT + 950.0, pid=os.getpid())
    pynvml.nvmlInit()
    h = handle(0)
    fn = node.lib.nvmlDeviceGetProcessUtilization
    count = ctypes.c_uint(0)
    assert fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    buffer = (pynvml.c_nvmlProcessUtilizationSample_t * 1)()
    count.value = 1
    assert fn(h, buffer, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_SUCCESS
    assert (count.value, buffer[0].pid, buffer[0].smUtil) == (1, os.getpid(), 30)


def test_processes_sizing_call_and_a_short_buffer(node: Node) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 30, "shared_util": 20}}}]}
    node.write_state(0, profile, started_at=BOOT + 950.0, pid=os.getpid())
    pynvml.nvmlInit()
    h = handle(0)
    fn = node.lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    buffer = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    count.value = 1  # as nvml.h says: too small, and how many it takes
    assert fn(h, ctypes.byref(count), buffer) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    count.value = 3
    assert fn(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert fn(h, None, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT


# --- processes -----------------------------------------------------------------------------------------

def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def procs(h: Any) -> list[tuple[int, int]]:
    return [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]


def test_processes_are_listed_while_the_workload_lives(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    assert procs(h) == []
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=os.getpid())
    assert procs(h) == [(os.getpid(), 10 * GIB)]
    info = pynvml.nvmlDeviceGetComputeRunningProcesses(h)[0]
    assert (info.gpuInstanceId, info.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)] == procs(h)
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=dead_pid())  # SIGKILLed: no end written
    assert procs(h) == []
    node.write_state(0, BUSY, started_at=BOOT + 950.0)  # no pid: the imitation's stand-in pid
    assert procs(h) == [(100000, 10 * GIB)]
    node.write_state(0, BUSY, started_at=BOOT + 950.0, ended_at=BOOT + 990.0, pid=os.getpid())
    assert procs(h) == []


def test_a_killed_workloads_pid_taken_by_another_process_is_not_listed(node: Node) -> None:
    """A workload killed without writing its end leaves its pid; on a busy node another
    process takes that pid (CI saw an idle GPU 'opened' so): its start time tells them apart."""
    pynvml.nvmlInit()
    h = handle(0)
    started = process_start(os.getpid())
    assert started is not None and started > 0
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=os.getpid(), pid_start=started)
    assert procs(h) == [(os.getpid(), 10 * GIB)]
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=os.getpid(), pid_start=started - 1)
    assert procs(h) == []
    node.write_state(0, BUSY, started_at=BOOT + 950.0, pid=dead_pid(), pid_start=started)
    assert procs(h) == []


def test_past_its_phases_before_its_end_is_written_a_workload_keeps_its_last_phases_processes(
    node: Node,
) -> None:
    """The workload writes its end a moment after its profile's time is up (CI saw a poll in
    that moment list a process on a GPU whose profile runs none: 'opened')."""
    profile = {"phases": [{"seconds": 10, "gpus": {"0": {"util": 90}, "1": {"util": 0, "processes": 0}}}]}
    started = process_start(os.getpid())
    for minor in (0, 1):
        node.write_state(minor, profile, started_at=BOOT + 990.0, position=minor, pid=os.getpid(),
                         pid_start=started)
    pynvml.nvmlInit()
    for now in (BOOT + 995.0, BOOT + 1000.1, BOOT + 1030.0):
        node.now = now
        assert procs(handle(0)) == [(os.getpid(), 0)] and procs(handle(1)) == [], now


def test_process_start_reads_a_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    link = tmp_path / "a) b (c"
    link.symlink_to(shutil.which("sleep") or "/bin/sleep")
    child = subprocess.Popen([str(link), "30"])
    try:
        text = Path(f"/proc/{child.pid}/stat").read_text()
        assert "(a) b (c)" in text
        assert process_start(child.pid) == int(text.rsplit(")", 1)[1].split()[19])
        assert process_start(dead_pid()) is None
    finally:
        child.kill()
        child.wait()


def test_processes_follow_the_phase(node: Node) -> None:
    profile = {"phases": [{"seconds": 10, "gpus": {"*": {"processes": 3, "mem_used_gib": 9}}},
                          {"seconds": 10, "gpus": {"*": {"processes": 0, "mem_used_gib": 9}}},
                          {"seconds": 10, "gpus": {"*": {"mem_used_gib": 9, "shared_util": 10}}},
                          {"seconds": 10, "gpus": {"*": {"lost": False}}},
                          {"seconds": 10, "gpus": {"*": {"processes": 100000}}}]}
    node.write_state(0, profile, started_at=BOOT + 995.0, pid=os.getpid())
    pynvml.nvmlInit()
    h = handle(0)
    assert procs(h) == [(os.getpid(), 3 * GIB)] * 3
    node.now = BOOT + 1005.0
    assert procs(h) == []
    node.now = BOOT + 1015.0
    assert procs(h) == [(os.getpid(), 9 * GIB), (1, GIB)]  # pid 1: a job sharing the GPU
    node.now = BOOT + 1025.0
    assert procs(h) == []  # a phase that names `lost` lists none (as the imitation)
    node.now = BOOT + 1035.0
    assert len(procs(h)) == 64  # bounded


# --- lost GPUs, unsupported functions -------------------------------------------------------------------

LOSES = {"phases": [{"seconds": 10, "gpus": {"*": {"util": 50}}},
                    {"seconds": 100, "gpus": {"*": {"lost": True}}}]}


def test_a_gpu_is_lost_from_the_lost_phase_while_the_workload_runs(node: Node) -> None:
    with_specs(node, MIG_GPU)
    node.write_state(0, LOSES, started_at=BOOT + 991.0)
    node.write_state(4, LOSES, started_at=BOOT + 991.0)
    h, mig = handle(0), pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(4), 0)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000  # 9 s in: not yet
    node.now = BOOT + 1001.0
    for call in (pynvml.nvmlDeviceGetUtilizationRates, pynvml.nvmlDeviceGetPowerUsage,
                 pynvml.nvmlDeviceGetTotalEnergyConsumption, pynvml.nvmlDeviceGetMemoryInfo,
                 pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetCurrentClocksEventReasons,
                 pynvml.nvmlDeviceGetEnforcedPowerLimit, pynvml.nvmlGpmQueryDeviceSupport,
                 lambda x: pynvml.nvmlDeviceGetSamples(x, 1, 0),
                 lambda x: pynvml.nvmlDeviceGetProcessUtilization(x, 0),
                 lambda x: pynvml.nvmlDeviceGetTemperatureV(x, 0),
                 lambda x: pynvml.nvmlDeviceGetClockInfo(x, 1),
                 lambda x: pynvml.nvmlDeviceGetTotalEccErrors(x, 1, 0)):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # a MIG instance of a lost GPU
        pynvml.nvmlDeviceGetMemoryInfo(mig)
    # identity still answers, as the imitation's
    assert pynvml.nvmlDeviceGetMinorNumber(h) == 0
    assert pynvml.nvmlDeviceGetUUID(h) == "GPU-00000000-0000-0000-0000-000000000000"
    node.write_state(0, LOSES, started_at=BOOT + 991.0, ended_at=BOOT + 1002.0)
    node.now = BOOT + 1003.0  # the workload ended: the GPU answers again
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000


FAILS = {"phases": [{"seconds": 10, "gpus": {"*": {"util": 50}}},
                    {"seconds": 20, "gpus": {"*": {"util": 50, "nvml_error": True}}},
                    {"seconds": 100, "gpus": {"*": {"util": 50}}}]}


def test_an_nvml_error_phase_fails_every_query_but_identity_while_it_runs(node: Node) -> None:
    """A passing fault (issue 20's soak: NVML errors for minutes on a GPU): NVML_ERROR_UNKNOWN
    from every call on the GPU and its MIG instances, not GPU_IS_LOST nor NOT_SUPPORTED;
    the node's GPUs still enumerate (minor, UUID), the other GPUs answer, and the GPU
    answers again when the phase ends, its workload still running."""
    with_specs(node, MIG_GPU)
    node.write_state(0, FAILS, started_at=BOOT + 991.0)
    node.write_state(4, FAILS, started_at=BOOT + 991.0)
    h, gpu4 = handle(0), handle(4)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, 0)
    sample = pynvml.nvmlGpmSampleAlloc()
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000  # 9 s in: not yet
    node.now = BOOT + 1001.0
    calls = (pynvml.nvmlDeviceGetUtilizationRates, pynvml.nvmlDeviceGetPowerUsage,
             pynvml.nvmlDeviceGetTotalEnergyConsumption, pynvml.nvmlDeviceGetMemoryInfo,
             pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses,
             pynvml.nvmlDeviceGetCurrentClocksEventReasons, pynvml.nvmlDeviceGetEnforcedPowerLimit,
             pynvml.nvmlGpmQueryDeviceSupport, pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetMigMode,
             lambda x: pynvml.nvmlGpmSampleGet(x, sample),
             lambda x: pynvml.nvmlDeviceGetMemoryInfo(x, pynvml.nvmlMemory_v2),
             lambda x: pynvml.nvmlDeviceGetSamples(x, 1, 0),
             lambda x: pynvml.nvmlDeviceGetProcessUtilization(x, 0),
             lambda x: pynvml.nvmlDeviceGetTemperatureV(x, 0),
             lambda x: pynvml.nvmlDeviceGetClockInfo(x, 1),
             lambda x: pynvml.nvmlDeviceGetTotalEccErrors(x, 1, 0),
             lambda x: pynvml.nvmlDeviceRegisterEvents(x, 8, pynvml.nvmlEventSetCreate()))
    for call in calls:
        with pytest.raises(pynvml.NVMLError_Unknown):
            call(h)
    for call in (pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetComputeRunningProcesses,
                 pynvml.nvmlDeviceGetGpuInstanceId):  # a MIG instance of a failing GPU
        with pytest.raises(pynvml.NVMLError_Unknown):
            call(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # what a MIG handle never has stays so
        pynvml.nvmlDeviceGetPowerUsage(mig)
    # the node still enumerates: every sampler of the node binds its own GPUs
    assert pynvml.nvmlDeviceGetCount() == 5  # handle(0): by minor number
    assert pynvml.nvmlDeviceGetUUID(handle(0)) == "GPU-00000000-0000-0000-0000-000000000000"
    assert pynvml.nvmlDeviceGetUUID(mig) == MIG_GPU["mig"][0]["uuid"]
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) == 60_000  # the other GPUs answer
    node.now = BOOT + 1021.0  # the phase ended, the workload runs on: the GPU answers again
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 50
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 10 * GIB
    pynvml.nvmlGpmSampleFree(sample)


def test_an_nvml_error_phase_of_a_mig_instance_fails_that_instance_only(node: Node) -> None:
    with_specs(node, MIG_GPU)
    failing, other = MIG_GPU["mig"][0]["uuid"], MIG_GPU["mig"][1]["uuid"]
    node.write_state(failing, FAILS, started_at=BOOT + 991.0)
    gpu4 = handle(4)
    mig, mig2 = (pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, i) for i in (0, 1))
    sample = pynvml.nvmlGpmSampleAlloc()
    node.now = BOOT + 1001.0
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetMemoryInfo(mig)
    with pytest.raises(pynvml.NVMLError_Unknown):  # its GPM sample, taken through its GPU
        pynvml.nvmlGpmMigSampleGet(gpu4, MIG_GPU["mig"][0]["gi_id"], sample)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, 1)) == other
    assert pynvml.nvmlDeviceGetMemoryInfo(mig2).total == 20 * GIB
    pynvml.nvmlGpmMigSampleGet(gpu4, MIG_GPU["mig"][1]["gi_id"], sample)
    assert pynvml.nvmlDeviceGetPowerUsage(gpu4) == 60_000  # its GPU answers
    pynvml.nvmlGpmSampleFree(sample)


def test_unsupported_is_checked_first_and_matches_any_version_suffix(node: Node) -> None:
    with_specs(node, m0={"unsupported": ["nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo",
                                         "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetSamples"]})
    node.write_state(0, LOSES, started_at=BOOT + 900.0)  # lost too
    h = handle(0)
    for call in (lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
                 lambda: pynvml.nvmlDeviceGetTemperatureV(h, 0),
                 lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
                 lambda: pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
                 lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
                 lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h),
                 lambda: pynvml.nvmlDeviceGetSamples(h, 1, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(h)


# --- links: PCIe and NVLink, from the device's spec ----------------------------------------------------

H100_SXM_LINKS = {"pcie_gen": 5, "pcie_width": 16, "nvlinks": 18, "nvlink_version": 6}  # NVLink 4.0


def test_the_pcie_link_runs_at_its_most_while_busy_and_drops_when_idle(node: Node) -> None:
    with_specs(node, m0=H100_SXM_LINKS)
    gpu = handle(0)
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(gpu) == 5
    assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(gpu) == 5
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(gpu) == 16
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(gpu) == 1  # idle: downshifted
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(gpu) == 16
    node.write_state(0, BUSY, started_at=BOOT + 950.0)
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(gpu) == 5
    node.now = BOOT + 1051.0  # the workload's profile is over: idle again
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(gpu) == 1


def test_pcie_defaults_and_a_slot_slower_than_the_gpu(node: Node) -> None:
    with_specs(node, m1={"pcie_gen": 3, "pcie_width": 8, "pcie_gpu_max_gen": 5, "pcie_idle_gen": 2})
    assert [pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle(0)),
            pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle(0))] == [4, 16]  # not in the spec: Gen4 x16
    slow = handle(1)
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(slow) == 3  # what device and slot allow
    assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(slow) == 5  # the device alone
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(slow) == 8
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(slow) == 2


def test_nvlink_state_and_version_per_link(node: Node) -> None:
    with_specs(node, m0=H100_SXM_LINKS, m2={**H100_SXM_LINKS, "nvlinks_active": 16})
    gpu = handle(0)
    assert [pynvml.nvmlDeviceGetNvLinkState(gpu, link) for link in range(18)] == [1] * 18
    assert pynvml.nvmlDeviceGetNvLinkVersion(gpu, 17) == pynvml.NVML_NVLINK_VERSION_4_0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the GPU's links, as drivers say
        pynvml.nvmlDeviceGetNvLinkState(gpu, 18)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkVersion(gpu, pynvml.NVML_NVLINK_MAX_LINKS)
    assert [pynvml.nvmlDeviceGetNvLinkState(handle(2), link) for link in (15, 16, 17)] == [1, 0, 0]


def test_a_gpu_without_nvlink_says_not_supported(node: Node) -> None:
    pynvml.nvmlInit()  # SIM_DEVICES name no NVLink
    for call in (pynvml.nvmlDeviceGetNvLinkState, pynvml.nvmlDeviceGetNvLinkVersion):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(handle(0), 0)


def test_link_calls_follow_the_spec_unsupported_list_lost_gpus_and_mig(node: Node) -> None:
    with_specs(node, MIG_GPU, m0={**H100_SXM_LINKS, "unsupported": ["nvmlDeviceGetCurrPcieLinkGeneration",
                                                                    "nvmlDeviceGetNvLinkState"]})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle(0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle(0), 0)
    assert pynvml.nvmlDeviceGetNvLinkVersion(handle(0), 0) == 6
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(4), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # the link is the whole GPU's
        pynvml.nvmlDeviceGetMaxPcieLinkGeneration(mig)
    node.write_state(1, LOSES, started_at=BOOT + 980.0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle(1))


@pytest.mark.parametrize("change", [
    {"pcie_gen": 0}, {"pcie_width": 1.5}, {"pcie_idle_gen": 5}, {"nvlinks": 37},
    {"nvlinks": 4, "nvlinks_active": 5}, {"nvlink_version": "4.0"},
])
def test_a_bad_link_spec_is_driver_not_loaded(node: Node, change: dict[str, Any]) -> None:
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        with_specs(node, m0=change)


# --- MIG ------------------------------------------------------------------------------------------------

def test_mig_instances_have_their_own_handles_memory_and_processes(node: Node) -> None:
    with_specs(node, MIG_GPU)
    gpu = handle(4)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 0
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu).value == 0
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 5
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(gpu)
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetUUID(parent) == MIG_GPU["uuid"]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu)
    assert pynvml.nvmlDeviceGetUUID(mig) == MIG_GPU["mig"][1]["uuid"]
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H100 (sim) MIG 20g"
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
    assert (memory.total, memory.used) == (20 * GIB, 0)
    node.write_state(MIG_GPU["mig"][1]["uuid"], BUSY, started_at=BOOT + 950.0, pid=os.getpid())
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig, pynvml.nvmlMemory_v2)
    assert (memory.total, memory.used, memory.free) == (20 * GIB, 10 * GIB, 10 * GIB)
    assert procs(mig) == [(os.getpid(), 10 * GIB)]
    assert procs(gpu) == []  # the whole GPU's own state file: none
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)).used == 0


def test_mig_handles_have_no_utilisation_power_or_clocks(node: Node) -> None:
    with_specs(node, MIG_GPU)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(4), 0)
    for call in (pynvml.nvmlDeviceGetUtilizationRates, pynvml.nvmlDeviceGetPowerUsage,
                 pynvml.nvmlDeviceGetTotalEnergyConsumption, pynvml.nvmlDeviceGetMinorNumber,
                 pynvml.nvmlDeviceGetEnforcedPowerLimit, pynvml.nvmlDeviceGetCurrentClocksEventReasons,
                 pynvml.nvmlDeviceGetMigMode, pynvml.nvmlGpmQueryDeviceSupport,
                 lambda x: pynvml.nvmlDeviceGetSamples(x, 1, 0),
                 lambda x: pynvml.nvmlDeviceGetProcessUtilization(x, 0),
                 lambda x: pynvml.nvmlDeviceGetTemperature(x, 0),
                 lambda x: pynvml.nvmlDeviceGetTemperatureV(x, 0),
                 lambda x: pynvml.nvmlDeviceGetClockInfo(x, 1),
                 lambda x: pynvml.nvmlDeviceRegisterEvents(x, 8, pynvml.nvmlEventSetCreate())):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(mig)


# --- temperature, clocks, clock-event reasons, energy resets -----------------------------------------

def test_temperature_clock_and_clock_event_reasons(node: Node) -> None:
    profile = {"phases": [
        {"seconds": 10, "gpus": {"*": {"util": 90, "temp_c": 71.5, "sm_clock_mhz": 1980}}},
        {"seconds": 10, "gpus": {"*": {"util": 90, "throttle": ["power_cap", "hw_thermal", "hw_slowdown",
                                                                  "sw_thermal", "power_brake"]}}}]}
    node.write_state(0, profile, started_at=BOOT + 995.0)
    pynvml.nvmlInit()
    h = handle(0)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 72  # half to even
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 72
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0  # busy, unthrottled
    node.now = BOOT + 1006.0
    every = (pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
             | pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonSwThermalSlowdown
             | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == every
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == every
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(1)) == pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 32  # idle values outside the phase naming them
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_COUNT)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_COUNT)


def test_temperature_v_checks_the_struct_version(node: Node) -> None:
    pynvml.nvmlInit()
    reading = pynvml.c_nvmlTemperature_v1_t()
    reading.version = pynvml.nvmlTemperature_v1 + 1
    assert node.lib.nvmlDeviceGetTemperatureV(handle(0), ctypes.byref(reading)) == \
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    reading.version = pynvml.nvmlTemperature_v1
    assert node.lib.nvmlDeviceGetTemperatureV(handle(0), ctypes.byref(reading)) == 0
    assert reading.temperature == 32


def test_the_energy_counter_restarts_at_a_reset(node: Node) -> None:
    profile = {"phases": [{"seconds": 10, "gpus": {"*": {"power_w": 300}}},
                          {"seconds": 10, "gpus": {"*": {"power_w": 300, "energy_reset": True}}}]}
    node.write_state(0, profile, started_at=BOOT + 900.0)
    pynvml.nvmlInit()
    # from the reset at BOOT + 910: 90 s at 60 W + 10 s at 240 W more
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == (90 * 60 + 10 * 240) * 1000


def test_the_energy_counter_truncates_to_whole_millijoules(node: Node) -> None:
    pynvml.nvmlInit()
    node.now = BOOT + 1000.0 + 1 / 128  # 60 W for 1000.0078125 s: 60000468.75 mJ
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == 60_000_468


def test_square_waves_are_exact_over_any_window_and_in_any_phase(node: Node) -> None:
    profile = {"phases": [
        {"seconds": 0.5, "gpus": {"*": {"temp_c": 40}}},
        {"seconds": 100, "gpus": {"*": {"temp_c": {"low": 50, "high": 90, "period_s": 2, "duty": 0.5},
                                        "sm_active": {"low": 0, "high": 60, "period_s": 1, "duty": 0.5}}}}]}
    node.write_state(0, profile, started_at=BOOT + 949.5)  # the waves' phase starts at BOOT + 950
    pynvml.nvmlInit()
    h = handle(0)
    node.now = BOOT + 951.5  # 1.5 s into the phase: past the 2 s period's high first half
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 50
    node.now = BOOT + 952.25
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 90

    def sm_active(t1: float, t2: float) -> float:
        first, second = take_two(node, lambda s: pynvml.nvmlGpmSampleGet(h, s), t1, t2)
        request = gpm_request(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL])
        return pynvml.nvmlGpmMetricsGet(request).metrics[0].value

    assert sm_active(BOOT + 950.25, BOOT + 950.75) == 30.0  # high for its first half only
    assert sm_active(BOOT + 950.25, BOOT + 952.0) == pytest.approx(60 * 0.75 / 1.75)
    assert sm_active(BOOT + 949.0, BOOT + 950.5) == pytest.approx(60 * 0.5 / 1.5)  # idle before


# --- the calling conventions: init, handles, pointers, buffers -------------------------------------------

def test_every_call_before_init_is_uninitialized(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    pynvml.nvmlShutdown()
    calls: list[Callable[[], Any]] = [
        pynvml.nvmlSystemGetDriverVersion, pynvml.nvmlEventSetCreate,
        lambda: pynvml.nvmlDeviceGetName(h), lambda: pynvml.nvmlDeviceGetUUID(h),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
        lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h), lambda: pynvml.nvmlDeviceGetSamples(h, 1, 0),
        lambda: pynvml.nvmlDeviceGetPowerUsage(h), lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        lambda: pynvml.nvmlDeviceGetTemperature(h, 0), lambda: pynvml.nvmlDeviceGetTemperatureV(h, 0),
        lambda: pynvml.nvmlDeviceGetClockInfo(h, 1), lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h),
        lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0), lambda: pynvml.nvmlDeviceGetMigMode(h),
        lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(h),
        lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0),
        lambda: pynvml.nvmlDeviceIsMigDeviceHandle(h), lambda: pynvml.nvmlDeviceGetGpuInstanceId(h),
        lambda: pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h),
        lambda: pynvml.nvmlGpmQueryDeviceSupport(h),
        lambda: pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc()),
        lambda: pynvml.nvmlGpmMigSampleGet(h, 1, pynvml.nvmlGpmSampleAlloc()),
        lambda: pynvml.nvmlGpmMetricsGet(gpm_request(None, None, [])),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()


def test_null_pointers_are_invalid_arguments(node: Node) -> None:
    pynvml.nvmlInit()
    lib, h = node.lib, handle(0)
    for name, args in [
        ("nvmlDeviceGetCount_v2", [None]), ("nvmlDeviceGetHandleByIndex_v2", [0, None]),
        ("nvmlDeviceGetMinorNumber", [h, None]), ("nvmlDeviceGetUUID", [h, None, 96]),
        ("nvmlDeviceGetName", [h, None, 96]), ("nvmlDeviceGetMemoryInfo", [h, None]),
        ("nvmlDeviceGetMemoryInfo_v2", [h, None]), ("nvmlDeviceGetEnforcedPowerLimit", [h, None]),
        ("nvmlDeviceGetUtilizationRates", [h, None]), ("nvmlDeviceGetPowerUsage", [h, None]),
        ("nvmlDeviceGetTotalEnergyConsumption", [h, None]), ("nvmlDeviceGetTemperature", [h, 0, None]),
        ("nvmlDeviceGetTemperatureV", [h, None]), ("nvmlDeviceGetClockInfo", [h, 1, None]),
        ("nvmlDeviceGetCurrentClocksEventReasons", [h, None]),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", [h, None]),
        ("nvmlDeviceGetTotalEccErrors", [h, 1, 0, None]),
        ("nvmlDeviceGetProcessUtilization", [h, None, None, ctypes.c_ulonglong(0)]),
        ("nvmlDeviceGetMigMode", [h, None, None]), ("nvmlDeviceGetMaxMigDeviceCount", [h, None]),
        ("nvmlDeviceGetMigDeviceHandleByIndex", [h, 0, None]), ("nvmlDeviceIsMigDeviceHandle", [h, None]),
        ("nvmlDeviceGetGpuInstanceId", [h, None]), ("nvmlGpmQueryDeviceSupport", [h, None]),
        ("nvmlGpmSampleAlloc", [None]), ("nvmlGpmSampleFree", [None]), ("nvmlGpmSampleGet", [h, None]),
        ("nvmlGpmMetricsGet", [None]), ("nvmlEventSetCreate", [None]), ("nvmlEventSetFree", [None]),
        ("nvmlEventSetWait_v2", [None, None, 0]),
        ("nvmlDeviceRegisterEvents", [h, ctypes.c_ulonglong(8), None]),
        ("nvmlSystemGetDriverVersion", [None, 80]),
    ]:
        assert getattr(lib, name)(*args) == pynvml.NVML_ERROR_INVALID_ARGUMENT, name


def test_short_text_buffers_are_insufficient_size(node: Node) -> None:
    pynvml.nvmlInit()
    lib, h = node.lib, handle(3)
    for name, args, text in [("nvmlDeviceGetName", [h], "NVIDIA A100 (sim)"),
                             ("nvmlDeviceGetUUID", [h], "GPU-33333333-3333-3333-3333-333333333333"),
                             ("nvmlSystemGetDriverVersion", [], "simulated")]:
        buffer = ctypes.create_string_buffer(len(text) + 1)
        assert getattr(lib, name)(*args, buffer, len(text)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE, name
        assert getattr(lib, name)(*args, buffer, len(text) + 1) == pynvml.NVML_SUCCESS, name
        assert buffer.value.decode() == text


def test_library_errors_read_as_pynvml_writes_them(node: Node) -> None:
    for code, text in pynvml.NVMLError._errcode_to_string.items():
        assert error_text(node.lib, code) == text, code
    assert error_text(node.lib, pynvml.NVML_SUCCESS) == "Success"
    assert error_text(node.lib, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH) == "Argument Version Mismatch"


# --- the old driver: the newer symbols are missing ----------------------------------------------------

def test_an_old_driver_lacks_the_newer_functions(old_node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    for call in (lambda: pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
                 lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h),
                 lambda: pynvml.nvmlDeviceGetTemperatureV(h, 0),
                 lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                 lambda: pynvml.nvmlGpmQueryDeviceSupport(h), pynvml.nvmlGpmSampleAlloc,
                 lambda: pynvml.nvmlGpmSampleGet(h, pynvml.c_nvmlGpmSample_t()),
                 lambda: pynvml.nvmlGpmMigSampleGet(h, 1, pynvml.c_nvmlGpmSample_t()),
                 lambda: pynvml.nvmlGpmSampleFree(pynvml.c_nvmlGpmSample_t()),
                 lambda: pynvml.nvmlGpmMetricsGet(gpm_request(None, None, []))):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            call()
    # the unversioned processes call wraps the missing _v3 in its own exception
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    # the older functions are there
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 80 * GIB
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h) == []
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 32
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle


# --- robustness -----------------------------------------------------------------------------------------

def junk_states() -> list[str]:
    rng = random.Random(0)
    good = {"started_at": BOOT + 950.0, "phases": phases(BUSY)}
    return [
        "", "null", "[]", "{}", "[" * 100_000, '{"phases": ' + "[" * 70 + "]" * 70 + "}",
        rng.randbytes(4096).decode("latin-1"), json.dumps({**good, "started_at": "soon"}),
        json.dumps({**good, "phases": {}}), json.dumps({**good, "ended_at": "later"}),
        json.dumps({**good, "pid": 1.5}), json.dumps({**good, "pid_start": -1}),
        json.dumps({**good, "phases": [{"seconds": 1}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "levels": {"util": [1, 2]}}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "levels": {"util": [0, 100, 1, 2]}}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "xid": [-1]}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "lost": "yes"}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "nvml_error": 1}]}),
        json.dumps({**good, "phases": [{**good["phases"][0], "throttle": "power_cap"}]}),
        json.dumps({**good, "phases": [good["phases"][0]] * 10_001}),
        '{"started_at": 1e999, "phases": []}', '{"started_at": NaN, "phases": []}',
        '{"started_at": 1, "phases": [], "x": "\\ud800"}', '{"started_at": 1, "phases": [] ',
    ]


def test_junk_state_files_read_idle(node: Node) -> None:
    pynvml.nvmlInit()
    h = handle(0)
    for text in junk_states():
        node.state_path(0).write_text(text, encoding="latin-1")
        assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0, text[:80]
        assert pynvml.nvmlDeviceGetPowerUsage(h) == 60_000
        assert procs(h) == []


def test_odd_but_valid_state_files(node: Node) -> None:
    base = {"started_at": BOOT + 950.0, "unknown": {"nested": [1, 2, {"a": None}]}}
    pynvml.nvmlInit()
    h = handle(0)
    phase = {"start_s": 0, "seconds": 100, "levels": {"util": 80, "made_up_metric": [1, 2, 3, 4]},
             "xid": list(range(1, 1000)), "throttle": ["warp_drive"]}
    node.state_path(0).write_text(json.dumps({**base, "phases": [phase]}))
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 80  # a plain number is a constant level
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0  # unknown reasons set no bit
    node.state_path(0).write_text(json.dumps({**base, "phases": []}))
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert procs(h) == [(100000, 0)]  # running, with no phase: one process


def test_concurrent_calls_from_threads(node: Node) -> None:
    node.write_state(0, WAVE, started_at=BOOT + 950.0, pid=os.getpid())
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    failures: list[str] = []

    def poll() -> None:
        try:
            for _ in range(100):
                for h in handles:
                    pynvml.nvmlDeviceGetMemoryInfo(h)
                    pynvml.nvmlDeviceGetPowerUsage(h)
                    pynvml.nvmlDeviceGetUtilizationRates(h)
                    pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                    try:
                        pynvml.nvmlDeviceGetSamples(h, 1, 0)
                    except pynvml.NVMLError_NotFound:
                        pass
                node.write_state(0, WAVE, started_at=BOOT + 950.0, pid=os.getpid())
        except Exception as exc:  # reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=poll) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert pynvml.nvmlDeviceGetPowerUsage(handles[2]) == 60_000


def test_pools_are_bounded(node: Node) -> None:
    pynvml.nvmlInit()
    samples_ = []
    with pytest.raises(pynvml.NVMLError_Memory):
        for _ in range(10_000):
            samples_.append(pynvml.nvmlGpmSampleAlloc())
    assert len(samples_) == 256  # the last shutdown freed what earlier tests left
    for sample in samples_:
        pynvml.nvmlGpmSampleFree(sample)
    sets = []
    with pytest.raises(pynvml.NVMLError_Memory):
        for _ in range(10_000):
            sets.append(pynvml.nvmlEventSetCreate())
    for event_set in sets:
        pynvml.nvmlEventSetFree(event_set)
    events = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        for _ in range(10_000):
            pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeXidCriticalError, events)
    pynvml.nvmlEventSetFree(events)


# --- the build --------------------------------------------------------------------------------------------

def test_build_fails_clearly_without_header_or_compiler(tmp_path: Path) -> None:
    script = str(standin.SOURCES / "build.sh")
    no_header = subprocess.run(["bash", script, "/bin/true", str(tmp_path / "a")], capture_output=True,
                               text=True)
    assert no_header.returncode != 0 and "nvml.h not found" in no_header.stderr
    no_cc = subprocess.run(["/bin/bash", script, sys.executable, str(tmp_path / "b")], capture_output=True,
                           text=True, env={"PATH": str(tmp_path)})
    assert no_cc.returncode != 0 and "no C compiler" in no_cc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_build_skips_what_is_fresh(tmp_path: Path) -> None:
    script = str(standin.SOURCES / "build.sh")
    subprocess.run(["bash", script, sys.executable, str(tmp_path)], check=True)
    lib = tmp_path / "current" / "libnvidia-ml.so.1"
    built = lib.stat().st_mtime_ns
    subprocess.run(["bash", script, sys.executable, str(tmp_path)], check=True)
    assert lib.stat().st_mtime_ns == built
    assert exported(str(tmp_path / "old" / "libnvidia-ml.so.1")) == CURRENT_EXPORTS - OLD_DRIVER_LACKS
