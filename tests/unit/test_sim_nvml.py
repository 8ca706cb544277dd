"""sim/nvml.py: the simulated NVML, driven by workload state files and a scripted clock.

The sim_node fixture boots the simulated driver at BOOT (the devices file's mtime) and
makes NVML read time from sim_node.now, so every reading below is exact.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.sim import nvml as sim
from slurm_gpu_eff.sim.profile import parse_profile
from slurm_gpu_eff.sim.workload import Publisher

GIB = 1024**3
BOOT = 1_700_000_000.0
BUSY = {"phases": [{"seconds": 100, "gpus": {"*": {
    "util": 80, "mem_util": 30, "mem_used_gib": 10, "power_w": 300,
}}}]}


def init(sim_node: Any) -> None:
    sim.configure(str(sim_node.devices_file), str(sim_node.state_dir), sim_node.node)
    sim.nvmlInit()


def handle(minor: int) -> sim.Device:
    for i in range(sim.nvmlDeviceGetCount()):
        h = sim.nvmlDeviceGetHandleByIndex(i)
        if sim.nvmlDeviceGetMinorNumber(h) == minor:
            return h
    raise AssertionError(f"no minor {minor}")


# --- the device list -----------------------------------------------------------------------

def test_devices_enumerate_in_file_order_with_their_identity(sim_node: Any) -> None:
    init(sim_node)
    assert sim.nvmlDeviceGetCount() == 4
    handles = [sim.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    assert [sim.nvmlDeviceGetMinorNumber(h) for h in handles] == [1, 2, 0, 3]
    assert sim.nvmlDeviceGetUUID(handles[2]) == "GPU-00000000-0000-0000-0000-000000000000"
    assert sim.nvmlDeviceGetName(handles[3]) == "NVIDIA A100 (sim)"
    assert sim.nvmlDeviceGetEnforcedPowerLimit(handles[0]) == 700_000  # mW
    assert sim.nvmlDeviceGetEnforcedPowerLimit(handles[3]) == 400_000


def test_index_out_of_range_is_invalid_argument(sim_node: Any) -> None:
    init(sim_node)
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(-1)


def test_a_handle_must_be_a_device(sim_node: Any) -> None:
    init(sim_node)
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetName(0)


def test_missing_devices_file_is_driver_not_loaded(sim_node: Any) -> None:
    sim.configure(str(sim_node.devices_file.with_name("absent.json")), "", "gpu1")
    with pytest.raises(sim.NVMLError_DriverNotLoaded):
        sim.nvmlInit()


def test_a_node_missing_from_the_devices_file_is_driver_not_loaded(sim_node: Any) -> None:
    sim.configure(str(sim_node.devices_file), str(sim_node.state_dir), "gpu9")
    with pytest.raises(sim.NVMLError_DriverNotLoaded):
        sim.nvmlInit()


# --- uninitialised use -------------------------------------------------------------------

def test_calls_before_init_raise_uninitialized(sim_node: Any) -> None:
    sim.configure(str(sim_node.devices_file), str(sim_node.state_dir), sim_node.node)
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlShutdown()


def test_a_handle_is_dead_after_shutdown(sim_node: Any) -> None:
    init(sim_node)
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlShutdown()
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetMinorNumber(h)


def test_configure_resets_an_initialised_library(sim_node: Any) -> None:
    init(sim_node)
    sim.configure(str(sim_node.devices_file), str(sim_node.state_dir), sim_node.node)
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


# --- errors, shaped like pynvml's ------------------------------------------------------------

def test_nvmlerror_code_builds_its_subclass() -> None:
    error = sim.NVMLError(sim.NVML_ERROR_NOT_SUPPORTED)
    assert type(error) is sim.NVMLError_NotSupported
    assert isinstance(error, sim.NVMLError)
    assert error.value == 3
    assert str(error) == "Not Supported"
    # the same as real pynvml does (no library needed to build an error)
    assert type(pynvml.NVMLError(3)).__name__ == type(error).__name__


def test_subclasses_carry_their_code_and_message() -> None:
    lost = sim.NVMLError_GpuIsLost()
    assert (lost.value, str(lost)) == (15, "GPU is lost")
    assert isinstance(lost, sim.NVMLError)
    with pytest.raises(sim.NVMLError_GpuIsLost):
        raise sim.NVMLError(sim.NVML_ERROR_GPU_IS_LOST)


def test_an_unknown_code_builds_the_base_class() -> None:
    error = sim.NVMLError(12345)
    assert type(error) is sim.NVMLError
    assert error.value == 12345
    assert str(error) == "NVML Error with code 12345"


def test_an_unsupported_function_raises_not_supported(sim_node: Any) -> None:
    init(sim_node)
    a100 = handle(3)  # its spec: "unsupported": ["nvmlDeviceGetTotalEnergyConsumption"]
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetTotalEnergyConsumption(a100)
    assert sim.nvmlDeviceGetPowerUsage(a100) == 50_000  # the rest still works


# --- readings: idle, busy, ended -------------------------------------------------------------

def test_an_idle_gpu_reads_idle_values(sim_node: Any) -> None:
    init(sim_node)
    h = handle(0)
    rates = sim.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (0, 0)
    memory = sim.nvmlDeviceGetMemoryInfo(h)
    assert (memory.total, memory.used, memory.free) == (80 * GIB, 0, 80 * GIB)
    assert sim.nvmlDeviceGetPowerUsage(h) == 60_000


def test_a_constant_workload_reads_its_constants(sim_node: Any) -> None:
    sim_node.write_state(0, BUSY, started_at=BOOT + 950.0)
    init(sim_node)  # now = BOOT + 1000: 50 s into a 100 s phase
    h = handle(0)
    rates = sim.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (80, 30)
    assert isinstance(rates.gpu, int)
    memory = sim.nvmlDeviceGetMemoryInfo(h)
    assert (memory.total, memory.used, memory.free) == (80 * GIB, 10 * GIB, 70 * GIB)
    assert sim.nvmlDeviceGetPowerUsage(h) == 300_000  # mW
    # other GPUs of the node have no workload: idle
    assert sim.nvmlDeviceGetUtilizationRates(handle(1)).gpu == 0


def test_energy_counter_is_the_integral_of_power_since_driver_load(sim_node: Any) -> None:
    sim_node.write_state(0, BUSY, started_at=BOOT + 950.0)
    init(sim_node)
    h = handle(0)
    # 1000 s at 60 W idle + 50 s at (300 - 60) W more = 60000 + 12000 J
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 72_000_000  # mJ
    sim_node.now = BOOT + 1010.0
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 75_000_000  # +10 s at 300 W
    sim_node.now = BOOT + 1100.0  # the 100 s phase ended at BOOT + 1050: idle after it
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == (1100 * 60 + 100 * 240) * 1000


def test_energy_counter_increases_between_calls(sim_node: Any) -> None:
    init(sim_node)
    h = handle(1)
    readings = []
    for step in range(5):
        sim_node.now = BOOT + 10.0 + step * 0.5
        readings.append(sim.nvmlDeviceGetTotalEnergyConsumption(h))
    assert readings == [600_000 + 30_000 * i for i in range(5)]  # 60 W idle: 30 J per 0.5 s


def test_a_workload_that_ended_reads_idle(sim_node: Any) -> None:
    sim_node.write_state(0, BUSY, started_at=BOOT + 950.0, ended_at=BOOT + 970.0)
    init(sim_node)  # now = BOOT + 1000: ended 30 s ago, though its profile runs 100 s
    h = handle(0)
    rates = sim.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (0, 0)
    assert sim.nvmlDeviceGetMemoryInfo(h).used == 0
    assert sim.nvmlDeviceGetPowerUsage(h) == 60_000
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == (1000 * 60 + 20 * 240) * 1000


def test_utilisation_is_the_mean_of_the_last_complete_sample_window(sim_node: Any) -> None:
    wave = {"phases": [{"seconds": 100, "gpus": {"*": {
        "util": {"low": 0, "high": 100, "period_s": 1, "duty": 0.5}}}}]}
    sim_node.write_state(0, wave, started_at=BOOT + 950.0)  # minor 0: 0.5 s windows
    sim_node.write_state(2, wave, started_at=BOOT + 950.0)  # minor 2: 1 s windows
    init(sim_node)
    sim_node.now = BOOT + 959.75  # last complete 0.5 s window: t in [9.0, 9.5): high
    assert sim.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 100
    sim_node.now = BOOT + 960.25  # window [9.5, 10.0): low
    assert sim.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    # 1 s windows span a whole period: the duty-weighted mean, whatever the instant
    assert sim.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 50


def test_power_is_a_one_second_average(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 0.5, "gpus": {"*": {"power_w": 500}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 999.25)
    init(sim_node)  # [now - 1, now]: 0.25 s idle, 0.5 s at 500 W, 0.25 s idle
    assert sim.nvmlDeviceGetPowerUsage(handle(0)) == 280_000  # (15 + 250 + 15) J / 1 s


def test_memory_used_is_capped_at_the_total(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"mem_used_gib": 60}}}]}
    sim_node.write_state(3, profile, started_at=BOOT + 990.0)  # a 40 GiB card
    init(sim_node)
    memory = sim.nvmlDeviceGetMemoryInfo(handle(3))
    assert (memory.total, memory.used, memory.free) == (40 * GIB, 40 * GIB, 0)


def test_a_corrupt_state_file_reads_idle(sim_node: Any) -> None:
    path = sim_node.write_state(0, BUSY, started_at=BOOT + 950.0)
    path.write_text('{"position": 0, "profile": ', encoding="utf-8")  # half-written
    init(sim_node)
    assert sim.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    assert sim.nvmlDeviceGetPowerUsage(handle(0)) == 60_000


def test_per_gpu_position_selects_the_override(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 20}, "1": {"util": 70}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 900.0, position=0)
    sim_node.write_state(2, profile, started_at=BOOT + 900.0, position=1)
    init(sim_node)
    assert sim.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 20
    assert sim.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 70


# --- driven by the in-job Publisher ------------------------------------------------------------

def publisher(sim_node: Any) -> Publisher:
    config = Config(gpu_backend="sim", sim_devices=str(sim_node.devices_file),
                    sim_state_dir=str(sim_node.state_dir))
    return Publisher(config, sim_node.node, "4242")


def test_publisher_state_files_drive_the_readings(sim_node: Any) -> None:
    profile = parse_profile(BUSY)
    publisher(sim_node).start(profile, [2, 0], now=BOOT + 900.0)
    state = json.loads((sim_node.state_dir / "gpu1" / "gpu0.json").read_text())
    assert state == {"job_id": "4242", "position": 1, "profile": BUSY,
                     "started_at": BOOT + 900.0, "ended_at": None, "prior_extra_j": 0.0,
                     "pid": os.getpid()}  # the workload's own process: NVML lists it
    init(sim_node)
    sim_node.now = BOOT + 1001.0  # its window [1000, 1001] is after the 100 s profile: idle
    assert sim.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 0
    sim_node.now = BOOT + 1000.0  # window [999, 1000]: the profile's last second
    assert sim.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 80
    sim_node.now = BOOT + 950.0
    assert sim.nvmlDeviceGetUtilizationRates(handle(2)).gpu == 80
    assert sim.nvmlDeviceGetUtilizationRates(handle(1)).gpu == 0  # not the job's


def test_publisher_end_makes_the_gpu_idle(sim_node: Any) -> None:
    profile = parse_profile(BUSY)
    pub = publisher(sim_node)
    pub.start(profile, [0], now=BOOT + 950.0)
    pub.end(profile, [0], started=BOOT + 950.0, now=BOOT + 960.0)
    init(sim_node)
    assert sim.nvmlDeviceGetUtilizationRates(handle(0)).gpu == 0
    assert sim.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == (1000 * 60 + 10 * 240) * 1000


def test_energy_counter_never_runs_backwards_across_workloads(sim_node: Any) -> None:
    profile = parse_profile(BUSY)
    pub = publisher(sim_node)
    init(sim_node)
    pub.start(profile, [0], now=BOOT + 100.0)
    pub.end(profile, [0], started=BOOT + 100.0, now=BOOT + 120.0)
    sim_node.now = BOOT + 500.0
    before = sim.nvmlDeviceGetTotalEnergyConsumption(handle(0))
    assert before == (500 * 60 + 20 * 240) * 1000
    pub.start(profile, [0], now=BOOT + 500.0)  # the next job on this GPU
    assert sim.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == before
    sim_node.now = BOOT + 501.0
    assert sim.nvmlDeviceGetTotalEnergyConsumption(handle(0)) == before + 300_000


# --- the sim must not invent API ----------------------------------------------------------------

def sim_api_names() -> list[str]:
    return sorted(n for n in vars(sim) if n.startswith(("nvml", "NVMLError")))


def test_sim_defines_the_api_the_package_uses() -> None:
    names = set(sim_api_names())
    used = {
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMinorNumber", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetEnforcedPowerLimit",
        "NVMLError", "NVMLError_NotSupported", "NVMLError_FunctionNotFound",
        "NVMLError_GpuIsLost",
    }
    assert used <= names


@pytest.mark.parametrize("name", sim_api_names())
def test_every_sim_api_name_exists_in_pynvml(name: str) -> None:
    assert hasattr(pynvml, name), f"sim.{name} is not in pynvml"


@pytest.mark.parametrize(
    "name", [n for n in sim_api_names() if n.startswith("nvml") and hasattr(pynvml, n)
             and inspect.isfunction(getattr(sim, n))],
)
def test_sim_functions_take_pynvml_parameters(name: str) -> None:
    ours = inspect.signature(getattr(sim, name)).parameters
    theirs = inspect.signature(getattr(pynvml, name)).parameters
    assert list(ours) == list(theirs)


def test_sim_error_classes_and_constants_match_pynvml() -> None:
    for name in [n for n in sim_api_names() if n.startswith("NVMLError_")]:
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError)
        assert getattr(sim, name).value == getattr(pynvml, name)(0).value, name
    constants = [n for n in vars(sim) if n.startswith("NVML_")] + ["nvmlMemory_v2"]
    assert len(constants) >= 12
    for name in constants:
        assert getattr(sim, name) == getattr(pynvml, name), name
    for name in ("c_nvmlMemory_t", "c_nvmlUtilization_t"):
        assert hasattr(pynvml, name)
