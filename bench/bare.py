"""The sampler's NVML calls made bare: the baseline its CPU per GPU-sample is set against,
over the stand-in (bench/run.py, four GPUs) and on a real GPU (scripts/gpu_check.py, one).

One poll of one GPU makes the calls a poll of slurm_gpu_eff's sampler makes between
summaries (node/gpu.py, Gpu.read), on the same cadences, and nothing else: the GPU
samples every poll; the memory samples every MEM_SAMPLES_EVERY_S of the driver's clock
and at a poll that finds no new GPU sample, where the rate stands in too; the energy
counter every ENERGY_EVERY_S; GPM pairs more than GPM_MIN_INTERVAL_S apart; the rest each
poll. A change to what the sampler calls belongs here too, once for both baselines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slurm_gpu_eff.node.gpu import GPM_MIN_INTERVAL_S, gpm_request
from slurm_gpu_eff.node.sampler import ENERGY_EVERY_S, MEM_SAMPLES_EVERY_S

GPU_SAMPLES, MEMORY_SAMPLES = 1, 2  # NVML_GPU_UTILIZATION_SAMPLES, NVML_MEMORY_UTILIZATION_SAMPLES


class Cadence:
    """Which of the calls by cadence a poll makes, on the driver's clock (`scale` driver
    seconds a wall second: a simulation's time_scale), as the sampler's loop decides them."""

    def __init__(self, scale: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.scale, self.monotonic = scale, monotonic
        self.energy_at = self.mem_at = 0.0
        self.gpm_at = self.now()

    def now(self) -> float:
        return self.monotonic() * self.scale

    def poll(self) -> tuple[bool, bool, bool]:
        """(energy counter, memory samples, GPM) for this poll."""
        now = self.now()
        energy, mem, gpm = now >= self.energy_at, now >= self.mem_at, now - self.gpm_at > GPM_MIN_INTERVAL_S
        if energy:
            self.energy_at = now + ENERGY_EVERY_S
        if mem:
            self.mem_at = now + MEM_SAMPLES_EVERY_S
        if gpm:
            self.gpm_at = now
        return energy, mem, gpm


def gpm_pair(nvml: Any, handle: Any) -> list[Any] | None:
    """Two GPM samples, the first taken: None where the GPU has no GPM."""
    try:
        if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return None
        pair = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        nvml.nvmlGpmSampleGet(handle, pair[0])
    except (nvml.NVMLError, AttributeError):
        return None
    return pair


def gpm_metrics(nvml: Any, handle: Any, pair: list[Any], request: Any) -> None:
    first, second = pair
    nvml.nvmlGpmSampleGet(handle, second)
    request.sample1, request.sample2 = first, second
    nvml.nvmlGpmMetricsGet(request)
    pair.reverse()


def supported(nvml: Any, call: Callable[[], object]) -> bool:
    try:
        call()
    except (nvml.NVMLError, nvml.NVMLLibraryMismatchError, AttributeError):
        return False
    return True


class BareGpu:
    """One GPU's calls, those it refuses left out (as the sampler stops making them)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        calls: list[Callable[[], object]] = [
            lambda: nvml.nvmlDeviceGetMemoryInfo(handle, nvml.nvmlMemory_v2),
            lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle),
            lambda: nvml.nvmlDeviceGetPowerUsage(handle),
            lambda: nvml.nvmlDeviceGetTemperatureV(handle, 0),
            lambda: nvml.nvmlDeviceGetClockInfo(handle, 1),
            lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
            lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0),
        ]
        self.calls = [call for call in calls if supported(nvml, call)]
        self.energy = supported(nvml, lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        self.rates = supported(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        # the newest sample of each kind, as the sampler passes it
        self.last = {GPU_SAMPLES: 0, MEMORY_SAMPLES: 0}
        # from the driver's newest on, as the sampler binds
        self.samples = all(supported(nvml, lambda k=kind: self.read_samples(k))
                           for kind in (GPU_SAMPLES, MEMORY_SAMPLES))
        self.gpm = gpm_pair(nvml, handle)
        self.request = gpm_request(nvml) if self.gpm is not None else None

    def read_samples(self, kind: int) -> int:
        """The driver's samples of `kind` newer than the last read: how many."""
        nvml = self.nvml
        try:
            _, found = nvml.nvmlDeviceGetSamples(self.handle, kind, self.last[kind])
        except nvml.NVMLError_NotFound:
            return 0
        except nvml.NVMLError as exc:
            if exc.value != 0:  # pynvml raises NVMLError(SUCCESS) when there is none new
                raise
            return 0
        stamps = [int(sample.timeStamp) for sample in found]
        if stamps:
            self.last[kind] = max(self.last[kind], *stamps)
        return len(stamps)

    def per_poll(self) -> int:
        """Calls a poll makes, the rate's counted (made where no new GPU sample came), the
        energy counter and the memory samples (by cadence) aside."""
        return len(self.calls) + (1 if self.samples else 0) + (1 if self.rates else 0)

    def poll(self, energy: bool, mem: bool, gpm: bool) -> None:
        nvml, handle = self.nvml, self.handle
        new = self.samples and self.read_samples(GPU_SAMPLES)
        # no new GPU sample: the rate stands in, and the memory samples are read
        if self.samples and (mem or not new):
            self.read_samples(MEMORY_SAMPLES)
        if not new and self.rates:
            nvml.nvmlDeviceGetUtilizationRates(handle)
        for call in self.calls:
            call()
        if energy and self.energy:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        if gpm and self.gpm is not None:
            gpm_metrics(nvml, handle, self.gpm, self.request)
