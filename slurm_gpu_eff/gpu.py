"""GPU access: the one module that knows pynvml (or the simulated NVML in its place).

Everything NVML-specific stops here: binding Slurm's node-level GPU indexes to NVML
devices by minor number (never by NVML index or CUDA_VISIBLE_DEVICES), turning "not
supported" into None (not measured, never zero), and GPU_IS_LOST into GpuLost.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .config import Config
from .errors import BindingError, GpuAccessError, GpuLost


def load_nvml(config: Config, node: str) -> ModuleType:
    """The NVML module the config asks for: real pynvml, or the simulation for `node`."""
    if config.gpu_backend == "sim":
        from .sim import nvml as simulated

        simulated.configure(config.sim_devices, config.sim_state_dir, node)
        return simulated
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise GpuAccessError("pynvml is not installed (pip install nvidia-ml-py)") from exc


@dataclass
class Reading:
    """One poll of one GPU; None means not measured."""

    util: float | None
    mem_util: float | None
    mem_used_bytes: float | None
    power_w: float | None
    energy_mj: int | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gpu:
    """One NVML device bound to a job, read through a cache of what it cannot do."""

    def __init__(self, nvml: ModuleType, handle: Any, index: int, minor: int, uuid: str) -> None:
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.minor = minor
        self.uuid = uuid
        self.unsupported: set[str] = set()
        self.errors: list[str] = []
        self.name = self._call("nvmlDeviceGetName")
        memory = self._call("nvmlDeviceGetMemoryInfo")
        self.memory_total_bytes = None if memory is None else int(memory.total)
        limit = self._call("nvmlDeviceGetEnforcedPowerLimit")
        self.power_limit_w = None if limit is None else limit / 1000.0
        if self.name is not None:
            self.name = _text(self.name)

    def _call(self, function: str, *args: Any) -> Any:
        """Call an NVML function; None when this GPU does not support it."""
        if function in self.unsupported:
            return None
        nvml = self.nvml
        try:
            return getattr(nvml, function)(self.handle, *args)
        except nvml.NVMLError_GpuIsLost as exc:
            raise GpuLost(f"GPU minor {self.minor} ({self.uuid}) is lost") from exc
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, AttributeError):
            self.unsupported.add(function)
            return None
        except nvml.NVMLError as exc:
            # A passing error (timeout, unknown) costs one reading, not the metric.
            if len(self.errors) < 20:
                self.errors.append(f"{function}: {exc}")
            return None

    def read(self) -> Reading:
        rates = self._call("nvmlDeviceGetUtilizationRates")
        memory = self._call("nvmlDeviceGetMemoryInfo")
        power = self._call("nvmlDeviceGetPowerUsage")
        return Reading(
            util=None if rates is None else float(rates.gpu),
            mem_util=None if rates is None else float(rates.memory),
            mem_used_bytes=None if memory is None else float(memory.used),
            power_w=None if power is None else power / 1000.0,
            energy_mj=self._call("nvmlDeviceGetTotalEnergyConsumption"),
        )


class GpuSession:
    """NVML, opened for the lifetime of one job's sampler, closed at its end."""

    def __init__(self, config: Config, node: str) -> None:
        self.nvml = load_nvml(config, node)
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise GpuAccessError(f"NVML cannot start: {exc}") from exc

    def bind(self, wanted: list[int | str]) -> list[Gpu]:
        """Resolve Slurm's node-level indexes (= device minors) or UUIDs to devices."""
        nvml = self.nvml
        by_minor: dict[int, tuple[Any, str]] = {}
        by_uuid: dict[str, tuple[Any, int]] = {}
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                by_minor[minor] = (handle, uuid)
                by_uuid[uuid] = (handle, minor)
        except nvml.NVMLError as exc:
            raise GpuAccessError(f"NVML cannot list GPUs: {exc}") from exc
        gpus = []
        for item in wanted:
            if isinstance(item, int):
                if item not in by_minor:
                    raise BindingError(f"no GPU with minor number {item} on this node")
                handle, uuid = by_minor[item]
                gpus.append(Gpu(nvml, handle, item, item, uuid))
            else:
                if item not in by_uuid:
                    raise BindingError(f"no GPU with UUID {item} on this node")
                handle, minor = by_uuid[item]
                gpus.append(Gpu(nvml, handle, minor, minor, item))
        return gpus

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
