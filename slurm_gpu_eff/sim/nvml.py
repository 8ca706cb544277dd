"""A simulated NVML with the pynvml API surface: same function names, return shapes, errors.

Only slurm_gpu_eff.node.gpu loads it (in place of pynvml, when the config says backend = sim).
Devices come from a JSON file ({node: [device, ...]}); what each device does comes from
the workload running inside the job (`gpueff-sim run`), which writes one state file per
GPU: the profile and when it started. Readings are computed from that profile at the
time of the call, the way the driver would have measured them:
- utilisation is the mean over the latest complete driver sample window (1/6 s by default);
- power is a 1 s average; the energy counter is the integral of power since "driver load"
  (the devices file's mtime), in mJ;
- nvmlDeviceGetSamples returns the buffered driver windows newer than the caller's
  timestamp (at most `sample_buffer` of them), NotFound when there are none;
- GPM (Hopper and newer: `"gpm": true` in the device spec) gives exact means of the
  profile's sm_active, tensor_active, ... between two GPM samples;
- MIG instances (`"mig": [...]`) have their own handles and memory, and the NVML quirks:
  no utilization rates, samples or power on a MIG handle; GPM per GPU instance only;
- profile events: clock-event reasons, XID events (through an event set), a GPU that
  is lost (every call raises GPU_IS_LOST), an energy counter that resets.
Time may run faster than the wall clock (`time_scale`), so a 7-day job plays in minutes:
simulated time = boot + (wall - boot) * time_scale, for the sampler and workload alike.
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
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
nvmlMemory_v2 = 0x02000028
NVML_TOTAL_POWER_SAMPLES = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1

# Which profile metric each GPM metric reads, and the reasons behind each event bit.
GPM_PROFILE_METRIC = {
    NVML_GPM_METRIC_SM_UTIL: "sm_active", NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active", NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    NVML_GPM_METRIC_FP64_UTIL: "fp64_active", NVML_GPM_METRIC_FP32_UTIL: "fp32_active",
    NVML_GPM_METRIC_FP16_UTIL: "fp16_active", NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_mbps",
    NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_mbps",
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_mbps",
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_mbps",
}
THROTTLE_BITS = {
    "power_cap": nvmlClocksEventReasonSwPowerCap, "hw_slowdown": nvmlClocksEventReasonHwSlowdown,
    "sw_thermal": nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": nvmlClocksEventReasonHwThermalSlowdown,
    "power_brake": nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


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
    NVML_ERROR_TIMEOUT: "Timeout",
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
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
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


class c_nvmlValue_t:
    def __init__(self, value: int) -> None:
        self.uiVal = value
        self.ullVal = value
        self.dVal = float(value)


class c_nvmlSample_t:
    def __init__(self, time_stamp_us: int, value: int) -> None:
        self.timeStamp = time_stamp_us
        self.sampleValue = c_nvmlValue_t(value)


class c_nvmlGpmSupport_t:
    def __init__(self, supported: bool) -> None:
        self.version = 1
        self.isSupportedDevice = int(supported)


class c_nvmlGpmMetric_t:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: GpmSample | None = None
        self.sample2: GpmSample | None = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)]


class GpmSample:
    """What nvmlGpmSampleAlloc hands out: filled with the time and device it was taken on."""

    def __init__(self) -> None:
        self.time: float | None = None
        self.target: Device | MigDevice | None = None


class c_nvmlProcessInfo_t:
    def __init__(self, pid: int, used: int) -> None:
        self.pid = pid
        self.usedGpuMemory = used
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class c_nvmlEventData_t:
    def __init__(self, device: Any, event_type: int, data: int) -> None:
        self.device = device
        self.eventType = event_type
        self.eventData = data
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


# --- configuration (the seam in slurm_gpu_eff.node.gpu calls this before nvmlInit) ---------

_settings: dict[str, Any] = {}
_devices: list[Device] | None = None


def configure(devices_file: str, state_dir: str, node: str, time_scale: float = 1.0) -> None:
    """Point the simulation at its device list and state directory, as this node."""
    global _devices
    _settings.update(devices_file=devices_file, state_dir=state_dir, node=node,
                     time_scale=time_scale)
    _devices = None


def state_path(state_dir: str, node: str, key: int | str) -> str:
    """Where the workload publishes what a GPU (minor number) or MIG instance (UUID) does."""
    name = f"gpu{key}.json" if isinstance(key, int) else f"{key}.json"
    return os.path.join(state_dir, node, name)


def sim_time(boot: float, scale: float) -> float:
    """Simulated now: time runs `scale` times faster than the wall clock since boot."""
    wall = time.time()
    return wall if scale == 1 else boot + (wall - boot) * scale


def now() -> float:
    """The simulated clock of this node (the sampler reads its time from here)."""
    boot = _devices[0].boot_time if _devices else 0.0
    return sim_time(boot, float(_settings.get("time_scale", 1.0)))


@dataclass
class Workload:
    profile: Profile
    position: int
    started_at: float
    ended_at: float | None
    prior_extra_j: float
    pid: int | None = None  # the workload's process: the job's process on this GPU


class Target:
    """What a profile drives: a whole GPU or a MIG instance, with its workload state file."""

    def __init__(self, path: str, idle: dict[str, float]) -> None:
        self.path = path
        self.idle = idle
        self._cache_key: tuple[int, int] | None = None
        self._workload: Workload | None = None

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

    def _span(self, load: Workload) -> float:
        return math.inf if load.ended_at is None else load.ended_at - load.started_at

    def mean(self, metric: str, t0: float, t1: float) -> float:
        """Mean of a metric over [t0, t1] (instant value when t1 == t0)."""
        idle = self.idle.get(metric, 0.0)
        load = self.workload()
        if load is None:
            return idle
        rel0, rel1 = t0 - load.started_at, t1 - load.started_at
        stop = self._span(load)
        if rel1 <= rel0:
            return load.profile.value_at(load.position, metric, rel0, idle) if 0 <= rel0 < stop else idle
        inside = load.profile.integral(load.position, metric, rel0, min(rel1, stop), idle)
        after = idle * max(0.0, rel1 - max(rel0, stop))
        return (inside + after) / (rel1 - rel0)

    def event(self, name: str, t: float) -> Any:
        load = self.workload()
        if load is None or not 0 <= t - load.started_at < self._span(load):
            return None
        return load.profile.event_at(load.position, name, t - load.started_at)

    def events_between(self, name: str, t0: float, t1: float) -> list[tuple[float, Any]]:
        """Phase-start events (xid, lost, energy_reset) in (t0, t1], in simulated time."""
        load = self.workload()
        if load is None:
            return []
        end = min(t1, load.started_at + self._span(load))
        return [
            (load.started_at + start, value)
            for start, value in load.profile.event_starts(
                load.position, name, t0 - load.started_at, end - load.started_at
            )
        ]

    def lost(self, t: float) -> bool:
        load = self.workload()
        if load is None or t - load.started_at >= self._span(load):
            return False
        return bool(self.events_between("lost", load.started_at - 1e-9, t))


class MigDevice(Target):
    """A MIG instance: its own handle, UUID and memory; no utilization, samples or power."""

    def __init__(self, parent: Device, spec: dict[str, Any], state_dir: str, node: str) -> None:
        self.parent = parent
        self.uuid = str(spec["uuid"])
        self.gi_id = int(spec.get("gi_id", 1))
        self.memory_total = int(float(spec.get("memory_total_gib", 10)) * GIB)
        super().__init__(state_path(state_dir, node, self.uuid), {"mem_used_gib": 0.0})


class Device(Target):
    def __init__(self, spec: dict[str, Any], node: str, state_dir: str, boot_time: float) -> None:
        self.spec = spec
        self.minor = int(spec["minor"])
        self.uuid = str(spec["uuid"])
        self.name = str(spec.get("name", "NVIDIA simulated GPU"))
        self.memory_total = int(float(spec.get("memory_total_gib", 80)) * GIB)
        self.power_limit_w = float(spec.get("power_limit_w", 700))
        self.sample_period_s = float(spec.get("sample_period_s", 1 / 6))
        self.sample_buffer = int(spec.get("sample_buffer", 120))
        self.gpm = bool(spec.get("gpm", True))
        self.unsupported = set(spec.get("unsupported", []))
        self.boot_time = boot_time
        super().__init__(state_path(state_dir, node, self.minor), {
            "power_w": float(spec.get("idle_power_w", 60)),
            "mem_used_gib": float(spec.get("idle_mem_used_gib", 0)),
            "temp_c": float(spec.get("idle_temp_c", 32)),
            "sm_clock_mhz": float(spec.get("idle_sm_clock_mhz", 345)),
        })
        self.migs = [MigDevice(self, m, state_dir, node) for m in spec.get("mig", [])]

    def check(self, function: str) -> None:
        if function in self.unsupported:
            raise NVMLError_NotSupported()
        if self.lost(now()):
            raise NVMLError_GpuIsLost()

    def energy_j(self, t: float) -> float:
        """The counter: idle power since driver load plus what workloads added, from the
        latest reset on."""
        idle = self.idle["power_w"]
        total = idle * max(0.0, t - self.boot_time) + self._extra(t)
        resets = self.events_between("energy_reset", -math.inf, t)
        if resets:
            at = resets[-1][0]
            total -= idle * max(0.0, at - self.boot_time) + self._extra(at)
        return total

    def _extra(self, t: float) -> float:
        load = self.workload()
        if load is None:
            return 0.0
        return load.prior_extra_j + extra_energy_j(load, self.idle["power_w"], t)

    def busy(self, t0: float, t1: float) -> float:
        """The GPU's utilisation: its job's work plus what a job sharing it adds (capped)."""
        return min(100.0, self.mean("util", t0, t1) + self.mean("shared_util", t0, t1))

    def samples(self, metric: str, after_us: int, t: float) -> list[tuple[int, int]]:
        """The driver's buffered sample windows that ended after `after_us`, oldest first."""
        period = self.sample_period_s
        last = math.floor(t / period)
        first = max(last - self.sample_buffer + 1, math.floor(after_us / 1e6 / period) + 1)
        out = []
        for k in range(first, last + 1):
            end = k * period
            stamp = int(round(end * 1e6))
            if stamp > after_us:
                t0 = end - period
                value = self.busy(t0, end) if metric == "util" else self.mean(metric, t0, end)
                out.append((stamp, int(round(value * 1000 if metric == "power_w" else value))))
        return out


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
            pid=None if data.get("pid") is None else int(data["pid"]),
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
    """A whole GPU's handle, checked; MIG handles are refused (NotSupported), as NVML does
    for most per-GPU queries."""
    target = _target(handle)
    if isinstance(target, MigDevice):
        raise NVMLError_NotSupported()
    return target


def _target(handle: Any) -> Device | MigDevice:
    if _devices is None:
        raise NVMLError_Uninitialized()
    if isinstance(handle, MigDevice):
        handle.parent.check("mig")
        return handle
    if not isinstance(handle, Device):
        raise NVMLError_InvalidArgument()
    return handle


# --- the pynvml API surface -------------------------------------------------------------


def nvmlInit() -> None:
    global _devices
    _devices = _load_devices()



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
    return _target(handle).uuid


def nvmlDeviceGetName(handle: Any) -> str:
    target = _target(handle)
    if isinstance(target, MigDevice):
        return f"{target.parent.name} MIG {target.memory_total // GIB}g"
    return target.name


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> c_nvmlMemory_t:
    target = _target(handle)
    if isinstance(target, Device):
        target.check("nvmlDeviceGetMemoryInfo")
    t = now()
    used = int(target.mean("mem_used_gib", t, t) * GIB)
    return c_nvmlMemory_t(target.memory_total, min(used, target.memory_total))


def nvmlDeviceGetUtilizationRates(handle: Any) -> c_nvmlUtilization_t:
    device = _device(handle)
    device.check("nvmlDeviceGetUtilizationRates")
    period = device.sample_period_s
    end = math.floor(now() / period) * period
    gpu = device.busy(end - period, end)
    memory = device.mean("mem_util", end - period, end)
    return c_nvmlUtilization_t(int(round(gpu)), int(round(memory)))


_SAMPLED = {
    NVML_GPU_UTILIZATION_SAMPLES: "util",
    NVML_MEMORY_UTILIZATION_SAMPLES: "mem_util",
    NVML_TOTAL_POWER_SAMPLES: "power_w",
}


def nvmlDeviceGetSamples(device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list[c_nvmlSample_t]]:
    target = _device(device)
    target.check("nvmlDeviceGetSamples")
    if sampling_type not in _SAMPLED:
        raise NVMLError_NotSupported()
    found = target.samples(_SAMPLED[sampling_type], int(timeStamp), now())
    if not found:
        raise NVMLError_NotFound()  # the driver's answer when nothing is newer than timeStamp
    return NVML_VALUE_TYPE_UNSIGNED_INT, [c_nvmlSample_t(ts, v) for ts, v in found]


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetPowerUsage")
    t = now()
    return int(round(device.mean("power_w", t - 1.0, t) * 1000))


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetTotalEnergyConsumption")
    return int(device.energy_j(now()) * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetEnforcedPowerLimit")
    return int(device.power_limit_w * 1000)


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetTemperature")
    t = now()
    return int(round(device.mean("temp_c", t, t)))


def nvmlDeviceGetClockInfo(handle: Any, type: int) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetClockInfo")
    t = now()
    return int(round(device.mean("sm_clock_mhz", t, t)))


def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    device = _device(handle)
    device.check("nvmlDeviceGetCurrentClocksEventReasons")
    t = now()
    reasons = device.event("throttle", t) or []
    mask = 0
    for reason in reasons:
        mask |= THROTTLE_BITS[reason]
    if not reasons and device.mean("util", t, t) == 0:
        mask |= nvmlClocksEventReasonGpuIdle
    return mask


def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    """Uncorrected ECC errors: one per XID 48 (double-bit ECC error) so far."""
    device = _device(handle)
    device.check("nvmlDeviceGetTotalEccErrors")
    events = device.events_between("xid", -math.inf, now())
    return sum(codes.count(48) for _, codes in events)


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[c_nvmlProcessInfo_t]:
    target = _target(handle)
    if isinstance(target, Device):
        target.check("nvmlDeviceGetComputeRunningProcesses")
    t = now()
    count = target.event("processes", t) if _running(target, t) else 0
    if count is None:  # not named by the profile: one process while a workload runs
        count = 1 if target.event("lost", t) is None else 0
    used = int(target.mean("mem_used_gib", t, t) * GIB)
    load = target.workload()
    pid = load.pid if load is not None and load.pid else 100000
    found = [c_nvmlProcessInfo_t(pid, used // max(1, count)) for _ in range(count)]
    if target.mean("shared_util", t, t) > 0:
        found.append(c_nvmlProcessInfo_t(SHARING_PID, GIB))  # another job's process
    return found


# A sharing job's process, as NVML would list it; pid 1 is in no Slurm job's cgroup.
SHARING_PID = 1


class c_nvmlProcessUtilizationSample_t:
    def __init__(self, pid: int, stamp_us: int, sm: int, mem: int) -> None:
        self.pid = pid
        self.timeStamp = stamp_us
        self.smUtil = sm
        self.memUtil = mem
        self.encUtil = 0
        self.decUtil = 0


def nvmlDeviceGetProcessUtilization(
    handle: Any, timeStamp: int,
) -> list[c_nvmlProcessUtilizationSample_t]:
    """Per process SM utilisation since timeStamp: the job's workload and a sharing job."""
    device = _device(handle)
    device.check("nvmlDeviceGetProcessUtilization")
    t = now()
    since = max(timeStamp / 1e6, t - device.sample_period_s * device.sample_buffer)
    processes = nvmlDeviceGetComputeRunningProcesses(handle)
    if not processes or since >= t:
        raise NVMLError_NotFound()
    stamp = int(t * 1e6)
    own = int(round(device.mean("util", since, t)))
    shared = int(round(device.mean("shared_util", since, t)))
    seen: dict[int, c_nvmlProcessUtilizationSample_t] = {}
    for process in processes:
        sm = shared if process.pid == SHARING_PID else own
        seen[process.pid] = c_nvmlProcessUtilizationSample_t(process.pid, stamp, sm, 0)
    return list(seen.values())


def _running(target: Target, t: float) -> bool:
    """The workload runs: started, not ended, and its process alive (NVML lists live
    processes only; a workload killed with SIGKILL never wrote its end)."""
    load = target.workload()
    if load is None or not load.started_at <= t or (load.ended_at is not None and t >= load.ended_at):
        return False
    return load.pid is None or os.path.exists(f"/proc/{load.pid}")


# --- MIG --------------------------------------------------------------------------------


def nvmlDeviceGetMigMode(device: Any) -> list[int]:
    dev = _device(device)
    mode = NVML_DEVICE_MIG_ENABLE if dev.migs else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(device: Any) -> int:
    return 7 if _device(device).migs else 0


def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> MigDevice:
    dev = _device(device)
    if not 0 <= index < len(dev.migs):
        raise NVMLError_NotFound()
    return dev.migs[index]


def nvmlDeviceIsMigDeviceHandle(device: Any) -> bool:
    return isinstance(_target(device), MigDevice)


def nvmlDeviceGetGpuInstanceId(device: Any) -> int:
    target = _target(device)
    if not isinstance(target, MigDevice):
        raise NVMLError_NotSupported()
    return target.gi_id


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: Any) -> Device:
    target = _target(migDevice)
    if not isinstance(target, MigDevice):
        raise NVMLError_InvalidArgument()
    return target.parent


# --- GPM (Hopper and newer) -------------------------------------------------------------


def nvmlGpmQueryDeviceSupport(device: Any) -> c_nvmlGpmSupport_t:
    dev = _device(device)
    dev.check("nvmlGpmQueryDeviceSupport")
    return c_nvmlGpmSupport_t(dev.gpm)


def nvmlGpmSampleAlloc() -> GpmSample:
    return GpmSample()


def nvmlGpmSampleFree(gpmSample: GpmSample) -> None:
    gpmSample.time = None


def nvmlGpmSampleGet(device: Any, gpmSample: GpmSample) -> GpmSample:
    dev = _device(device)
    dev.check("nvmlGpmSampleGet")
    if not dev.gpm:
        raise NVMLError_NotSupported()
    gpmSample.time, gpmSample.target = now(), dev
    return gpmSample


def nvmlGpmMigSampleGet(device: Any, gpuInstanceId: int, gpmSample: GpmSample) -> GpmSample:
    dev = _device(device)
    dev.check("nvmlGpmMigSampleGet")
    if not dev.gpm:
        raise NVMLError_NotSupported()
    for mig in dev.migs:
        if mig.gi_id == gpuInstanceId:
            gpmSample.time, gpmSample.target = now(), mig
            return gpmSample
    raise NVMLError_NotFound()


def nvmlGpmMetricsGet(metricsGet: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
    first, second = metricsGet.sample1, metricsGet.sample2
    if first is None or second is None or first.time is None or second.time is None:
        raise NVMLError_InvalidArgument()
    if first.target is not second.target or second.time <= first.time:
        raise NVMLError_InvalidArgument()
    target = first.target
    assert target is not None
    for metric in metricsGet.metrics[: metricsGet.numMetrics]:
        name = GPM_PROFILE_METRIC.get(metric.metricId)
        if name is None:
            metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        else:
            metric.nvmlReturn, metric.value = 0, target.mean(name, first.time, second.time)
    return metricsGet


# --- events (XID) -----------------------------------------------------------------------


class EventSet:
    def __init__(self) -> None:
        self.devices: dict[int, tuple[Device, float]] = {}  # id -> (device, checked up to)
        self.pending: list[c_nvmlEventData_t] = []


def nvmlEventSetCreate() -> EventSet:
    if _devices is None:
        raise NVMLError_Uninitialized()
    return EventSet()


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: EventSet) -> None:
    device = _device(handle)
    if eventTypes & nvmlEventTypeXidCriticalError:
        eventSet.devices[id(device)] = (device, now())


def nvmlEventSetWait_v2(eventSet: EventSet, timeoutms: int) -> c_nvmlEventData_t:
    """The next XID event; NVMLError_Timeout when none is pending (we never block)."""
    t = now()
    for key, (device, since) in list(eventSet.devices.items()):
        for _, codes in device.events_between("xid", since, t):
            eventSet.pending.extend(
                c_nvmlEventData_t(device, nvmlEventTypeXidCriticalError, code) for code in codes
            )
        eventSet.devices[key] = (device, t)
    if not eventSet.pending:
        raise NVMLError_Timeout()
    return eventSet.pending.pop(0)


nvmlEventSetWait = nvmlEventSetWait_v2


def nvmlEventSetFree(eventSet: EventSet) -> None:
    eventSet.devices.clear()
