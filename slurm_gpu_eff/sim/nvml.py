"""A simulated NVML with the pynvml API surface: same function names, return shapes, errors.

Only slurm_gpu_eff.gpu loads it (in place of pynvml, when the config says backend = sim).
Devices come from a JSON file ({node: [device, ...]}); what each device does comes from
the workload running inside the job (`gpueff-sim run`), which writes one state file per
GPU: the profile and when it started. Readings are computed from that profile at the
time of the call, the way the driver would have measured them:
- utilisation is the mean over the latest complete driver sample window (1/6 s by default);
- power is a 1 s average; the energy counter is the integral of power since "driver load"
  (the devices file's mtime), in mJ.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from .profile import Profile, ProfileError, parse_profile

GIB = 1024**3

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    """Same shape as pynvml's: NVMLError(code) builds the subclass for that code."""

    _classes: dict[int, type[NVMLError]] = {}
    value: int = NVML_ERROR_UNKNOWN

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN, *args: Any) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._classes.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int = NVML_ERROR_UNKNOWN, *args: Any) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type, *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    klass = type(name, (NVMLError,), {"__new__": new, "value": code})
    NVMLError._classes[code] = klass
    return klass


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory


class c_nvmlMemory_t:
    def __init__(self, total: int, used: int, reserved: int = 0) -> None:
        self.total = total
        self.reserved = reserved
        self.used = used
        self.free = total - used - reserved


# --- configuration (the seam in slurm_gpu_eff.gpu calls this before nvmlInit) ---------

_settings: dict[str, str] = {}
_devices: list[Device] | None = None


def configure(devices_file: str, state_dir: str, node: str) -> None:
    """Point the simulation at its device list and state directory, as this node."""
    global _devices
    _settings.update(devices_file=devices_file, state_dir=state_dir, node=node)
    _devices = None


def state_path(state_dir: str, node: str, minor: int) -> str:
    """Where the workload publishes what GPU `minor` of `node` is doing."""
    return os.path.join(state_dir, node, f"gpu{minor}.json")


@dataclass
class Workload:
    profile: Profile
    position: int
    started_at: float
    ended_at: float | None
    prior_extra_j: float


class Device:
    def __init__(self, spec: dict[str, Any], node: str, state_dir: str, boot_time: float) -> None:
        self.spec = spec
        self.minor = int(spec["minor"])
        self.uuid = str(spec["uuid"])
        self.name = str(spec.get("name", "NVIDIA simulated GPU"))
        self.memory_total = int(float(spec.get("memory_total_gib", 80)) * GIB)
        self.power_limit_w = float(spec.get("power_limit_w", 700))
        self.sample_period_s = float(spec.get("sample_period_s", 1 / 6))
        self.unsupported = set(spec.get("unsupported", []))
        self.idle = {
            "power_w": float(spec.get("idle_power_w", 60)),
            "mem_used_gib": float(spec.get("idle_mem_used_gib", 0)),
        }
        self.boot_time = boot_time
        self.path = state_path(state_dir, node, self.minor)
        self._cache_key: tuple[int, int] | None = None
        self._workload: Workload | None = None

    def check(self, function: str) -> None:
        if function in self.unsupported:
            raise NVMLError_NotSupported()

    def workload(self) -> Workload | None:
        """The workload's state file, re-read only when it changed."""
        try:
            info = os.stat(self.path)
        except OSError:
            self._cache_key, self._workload = None, None
            return None
        key = (info.st_mtime_ns, info.st_size)
        if key != self._cache_key:
            self._cache_key, self._workload = key, _read_workload(self.path)
        return self._workload

    def mean(self, metric: str, t0: float, t1: float) -> float:
        """Mean of a metric over wall-clock [t0, t1] (instant value when t1 == t0)."""
        idle = self.idle.get(metric, 0.0)
        load = self.workload()
        if load is None:
            return idle
        rel0, rel1 = t0 - load.started_at, t1 - load.started_at
        stop = math.inf if load.ended_at is None else load.ended_at - load.started_at
        if rel1 <= rel0:
            return load.profile.value_at(load.position, metric, rel0, idle) if rel0 < stop else idle
        inside = load.profile.integral(load.position, metric, rel0, min(rel1, stop), idle)
        after = idle * max(0.0, rel1 - max(rel0, stop))
        return (inside + after) / (rel1 - rel0)

    def energy_j(self, now: float) -> float:
        """Energy since driver load: idle power all along plus what workloads added."""
        idle = self.idle["power_w"]
        total = idle * max(0.0, now - self.boot_time)
        load = self.workload()
        if load is not None:
            total += load.prior_extra_j + extra_energy_j(load, idle, now)
        return total


def extra_energy_j(load: Workload, idle_w: float, now: float) -> float:
    """Energy a workload drew above idle, from its start until `now` (or its end)."""
    stop = now if load.ended_at is None else min(now, load.ended_at)
    span = max(0.0, stop - load.started_at)
    return load.profile.integral(load.position, "power_w", 0.0, span, idle_w) - idle_w * span


def _read_workload(path: str) -> Workload | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return Workload(
            profile=parse_profile(data["profile"]),
            position=int(data["position"]),
            started_at=float(data["started_at"]),
            ended_at=None if data.get("ended_at") is None else float(data["ended_at"]),
            prior_extra_j=float(data.get("prior_extra_j", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError, ProfileError):
        return None  # a half-written or foreign file reads as an idle GPU


def _load_devices() -> list[Device]:
    path = _settings.get("devices_file", "")
    node = _settings.get("node", "")
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
        boot_time = os.stat(path).st_mtime
        specs = table[node] if isinstance(table, dict) else table
        return [Device(spec, node, _settings.get("state_dir", ""), boot_time) for spec in specs]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NVMLError_DriverNotLoaded() from exc


def _device(handle: Any) -> Device:
    if _devices is None:
        raise NVMLError_Uninitialized()
    if not isinstance(handle, Device):
        raise NVMLError_InvalidArgument()
    return handle


# --- the pynvml API surface -------------------------------------------------------------


def nvmlInit() -> None:
    global _devices
    _devices = _load_devices()


nvmlInit_v2 = nvmlInit


def nvmlShutdown() -> None:
    global _devices
    if _devices is None:
        raise NVMLError_Uninitialized()
    _devices = None


def nvmlSystemGetDriverVersion() -> str:
    return "simulated"


def nvmlDeviceGetCount() -> int:
    if _devices is None:
        raise NVMLError_Uninitialized()
    return len(_devices)


def nvmlDeviceGetHandleByIndex(index: int) -> Device:
    if _devices is None:
        raise NVMLError_Uninitialized()
    if not 0 <= index < len(_devices):
        raise NVMLError_InvalidArgument()
    return _devices[index]


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    return _device(handle).minor


def nvmlDeviceGetUUID(handle: Any) -> str:
    return _device(handle).uuid


def nvmlDeviceGetName(handle: Any) -> str:
    return _device(handle).name


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> c_nvmlMemory_t:
    device = _device(handle)
    device.check("nvmlDeviceGetMemoryInfo")
    now = time.time()
    used = int(device.mean("mem_used_gib", now, now) * GIB)
    return c_nvmlMemory_t(device.memory_total, min(used, device.memory_total))


def nvmlDeviceGetUtilizationRates(handle: Any) -> c_nvmlUtilization_t:
    device = _device(handle)
    device.check("nvmlDeviceGetUtilizationRates")
    period = device.sample_period_s
    end = math.floor(time.time() / period) * period
    gpu = device.mean("util", end - period, end)
    memory = device.mean("mem_util", end - period, end)
    return c_nvmlUtilization_t(int(round(gpu)), int(round(memory)))


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetPowerUsage")
    now = time.time()
    return int(round(device.mean("power_w", now - 1.0, now) * 1000))


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetTotalEnergyConsumption")
    return int(device.energy_j(time.time()) * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetEnforcedPowerLimit")
    return int(device.power_limit_w * 1000)
