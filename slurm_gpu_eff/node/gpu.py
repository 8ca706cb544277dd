"""GPU access: the one module that knows pynvml.

Everything NVML-specific stops here: loading the library (the driver's, or the one
`[gpu] library` names), binding Slurm's node-level GPU indexes to NVML devices by minor
number (never by NVML index or CUDA_VISIBLE_DEVICES), turning "not supported" into None
(not measured, never zero), and GPU_IS_LOST into GpuLost. The code is the same on a site
and in the tests: there, a stand-in libnvidia-ml.so.1 sits below the same pynvml.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import methodcaller
from types import ModuleType
from typing import Any

from ..config import Config, sampler_clock
from ..errors import BindingError, GpuAccessError, GpuLost
from .samples import CLOCK_BACK_US, SampleSeries


def load_nvml(config: Config) -> ModuleType:
    """pynvml, over the driver's libnvidia-ml.so.1 or the library the config names."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuAccessError("pynvml is not installed (pip install nvidia-ml-py)") from exc
    if config.gpu_library:
        _use_library(pynvml, config.gpu_library)
    return pynvml


def _use_library(pynvml: ModuleType, path: str) -> None:
    """Make pynvml use the library at `path` (it loads "libnvidia-ml.so.1" by name
    otherwise, and skips loading when nvmlLib is already set)."""
    with pynvml.libLoadLock:
        loaded = pynvml.nvmlLib
        if loaded is not None and getattr(loaded, "_name", None) == path:
            return
        try:
            pynvml.nvmlLib = ctypes.CDLL(path)  # type: ignore[attr-defined]
        except OSError as exc:
            raise GpuAccessError(f"cannot load the NVML library {path}: {exc}") from exc
        pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers into the library it replaced


# GPM metric ids (nvml.h) -> our names; PCIe/NVLink in MiB/s, the rest in percent.
GPM_METRICS = {
    2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 10: "dram_active",
    11: "fp64_active", 12: "fp32_active", 13: "fp16_active", 20: "pcie_tx_mbps",
    21: "pcie_rx_mbps", 60: "nvlink_rx_mbps", 61: "nvlink_tx_mbps",
}
GPM_NAMES = tuple(GPM_METRICS.values())  # in the order the request asks for them
# A ctypes field read past pynvml's per-access hook, which only turns bytes into str: the
# sampler reads ~30 numbers a GPU a poll.
_field = object.__getattribute__
# Clock-event reason bits (nvmlClocksEventReason*) a user or admin needs to know about.
THROTTLE_REASONS = {
    "power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40,
    "power_brake": 0x80,
}
# What a poll reads of a GPU, call by call: figure -> the NVML calls that give it, best
# first, each (function, its arguments after the handle (a str names a pynvml constant),
# and the name it is remembered by once a GPU lacks it, if not the function's). Where a
# driver lacks one the next stands in: v1 memory counts the driver's reserved part as used,
# TemperatureV is NVML 13's (the other is gone in 14), ClocksThrottleReasons the name
# before driver 535.
POLL_READS: dict[str, tuple[tuple[Any, ...], ...]] = {
    "memory": (("nvmlDeviceGetMemoryInfo", ("nvmlMemory_v2",), "memory_v2"), ("nvmlDeviceGetMemoryInfo", ())),
    "processes": (("nvmlDeviceGetComputeRunningProcesses", ()),),
    "power": (("nvmlDeviceGetPowerUsage", ()),),
    "temp": (("nvmlDeviceGetTemperatureV", ("NVML_TEMPERATURE_GPU",)), ("nvmlDeviceGetTemperature", (0,))),
    "clock": (("nvmlDeviceGetClockInfo", (1,)),),  # NVML_CLOCK_SM
    "energy": (("nvmlDeviceGetTotalEnergyConsumption", ()),),
    "throttle": (("nvmlDeviceGetCurrentClocksEventReasons", ()),
                 ("nvmlDeviceGetCurrentClocksThrottleReasons", ())),
    "ecc": (("nvmlDeviceGetTotalEccErrors", (1, 0)),),  # uncorrected, volatile
}
MIG_READS = ("memory", "processes")  # NVML has no utilisation, power or clocks for a MIG instance
# A poll's answers come back in a list, a slot a figure in POLL_READS' order (None where
# NVML gave none): read() takes them all in one unpacking
SLOT = {figure: slot for slot, figure in enumerate(POLL_READS)}
# One planned read: (its slot, the call: methodcaller(function's name, its arguments with
# the GPU's handle first), made once; (the figure, which of its calls, the function's name))
PlannedRead = tuple[int, Callable[[ModuleType], Any], tuple[str, int, str]]


def _unsupported_key(call: tuple[Any, ...]) -> str:
    return call[2] if len(call) > 2 else call[0]


GPU_UTILIZATION_SAMPLES, MEMORY_UTILIZATION_SAMPLES = 1, 2
GPM_MIN_INTERVAL_S = 0.1  # NVML wants two GPM samples MORE than 100 ms apart
NVML_SUCCESS = 0
# The driver's sample period is 1/6 s to 1 s by product: until its timestamps tell, the
# longest. Per-process samples come once a period: a poll sooner after the last one that
# had some learns nothing, rather than "idle".
DRIVER_PERIOD_S = 1.0
XID_EVENT = 0x8
ALL_GI = 0xFFFFFFFF  # an event of the whole GPU, not of one MIG instance
# NVLink: NVML numbers versions by its nvmlNvlinkVersion_t (an A100 answers 5, "3.1", not
# 3): enum -> NVLink generation, and a link's bandwidth per direction in GB/s by generation,
# from NVIDIA's figures (docs/metrics.md): P100 160 GB/s over 4 links (both directions),
# V100 300 GB/s over 6, A100 600 GB/s over 12, H100 900 GB/s over 18, Blackwell 1.8 TB/s
# over 18. A generation not listed has no rate (None), rather than a guess.
NVLINK_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
NVLINK_GBPS_PER_DIR = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS (nvml.h 13): a ceiling; a GPU's own links are fewer
LINK_BUSY_UTIL = 50.0  # a poll this busy finds the PCIe link at its working speed
LINK_IDLE_TURNS = 6  # ... else every this many turns (sampler.LINK_EVERY_POLLS apart) anyway


@dataclass(slots=True)  # one a GPU a poll: slots make it cheaper to build and read
class Reading:
    """One poll of one GPU; None means not measured (not supported), never zero."""

    time: float
    util: float | None
    mem_util: float | None
    mem_used_bytes: float | None
    power_w: float | None
    energy_mj: int | None
    # Driver samples since the last poll, (value, seconds each stands for): lossless.
    util_samples: list[tuple[float, float]] | None = None
    mem_util_samples: list[tuple[float, float]] | None = None
    gpm: dict[str, float] | None = None  # GPM means since its last sample (may be polls ago)
    gpm_s: float = 0.0  # the seconds those means cover
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    throttle_mask: int | None = None
    ecc_uncorrected: int | None = None
    pids: list[tuple[int, int]] | None = None  # (pid, GPU memory bytes) of its processes
    # pid -> SM utilisation of the driver's last sample period (about 1/6 s) before this
    # poll, for the processes busy in it: a sample per poll, not a mean since the last one.
    process_sm: dict[int, float] | None = None
    # The new GPU samples' mean, their windows weighed as before the rate's stretches (each
    # whole; a gap over 1.5 periods as one): the poll's figure for the idle line and the
    # timeline. A busy sample's evidence is never thinned by the time counted already.
    util_mean: float | None = None

    @property
    def processes(self) -> int | None:
        return None if self.pids is None else len(self.pids)

    @property
    def empty(self) -> bool:
        """Nothing read at all (every NVML call of the poll failed): no time measured."""
        return (self.util is None and self.mem_used_bytes is None and self.power_w is None
                and self.pids is None and not self.gpm and not self.util_samples
                and self.mem_util is None and self.energy_mj is None and self.temp_c is None
                and self.sm_clock_mhz is None and self.throttle_mask is None
                and self.ecc_uncorrected is None and self.process_sm is None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gpu:
    """One NVML device (or MIG instance) bound to a job, read through a cache of what it
    cannot do. Readings are dated by `clock` (the driver's: the wall clock, which may
    step) and the time between two of them measured on `steady` (the monotonic clock in
    the driver clock's seconds; by default `clock`)."""

    # Slots: read each poll straight from the object (see GpuStats)
    __slots__ = (
        "bound_at", "clock", "energy_at_bind_mj", "error_counts", "errors",
        "gi_id", "gpm", "gpm_request", "gpm_slots", "gpm_taken_at", "handle", "index", "is_mig",
        "gpu_samples", "light", "link_turns", "listed", "mem_samples", "memory_total_bytes", "minor",
        "mismatches", "read_steady",
        "name", "nvlink", "nvml", "parent", "parent_uuid", "pcie_done", "pcie_max", "pcie_seen", "plan",
        "power_limit_w", "process_seen_at", "process_since_us", "steady", "unsupported", "uuid",
    )

    def __init__(
        self, nvml: ModuleType, handle: Any, index: int, minor: int, uuid: str,
        clock: Callable[[], float] = time.time, parent: Any = None, gi_id: int | None = None,
        steady: Callable[[], float] | None = None,
    ) -> None:
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.minor = minor
        self.uuid = uuid
        self.clock = clock
        self.steady = steady or clock
        self.parent = parent  # the whole GPU's handle, for a MIG instance
        self.is_mig = parent is not None
        self.gi_id = gi_id
        self.parent_uuid: str | None = None
        self.mismatches = (
            nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, AttributeError,
            nvml.NVMLError_ArgumentVersionMismatch, nvml.NVMLLibraryMismatchError,
        )
        self.unsupported: set[str] = set()
        self.errors: list[str] = []  # each kind once, in the order they first came
        self.error_counts: dict[str, int] = {}  # how often each came
        self.name = self._call("nvmlDeviceGetName")
        self.plan: list[PlannedRead] = []
        # (the plan it was made from, that plan but the energy counter's read): read() on
        # the polls that leave the counter out (Sampler.sample_once)
        self.light: tuple[list[PlannedRead], list[PlannedRead]] | None = None
        for figure in (MIG_READS if self.is_mig else POLL_READS):
            planned = self._plan(figure, 0)
            if planned is not None:
                self.plan.append(planned)
        at_bind = self._poll_reads([p for p in self.plan if p[2][0] in ("memory", "energy")])
        memory = at_bind[SLOT["memory"]]
        # The energy counter's start, as the driver's other figures start here too
        self.energy_at_bind_mj: int | None = at_bind[SLOT["energy"]]
        self.memory_total_bytes = None if memory is None else int(memory.total)
        limit = self._call("nvmlDeviceGetEnforcedPowerLimit")
        self.power_limit_w = None if limit is None else limit / 1000.0
        if self.name is not None:
            self.name = _text(self.name)
        self.bound_at = self.clock()
        # The driver's own timestamps, passed back as NVML asks: 0 takes what it has.
        self.process_since_us = 0
        self.process_seen_at = self.steady()  # when the driver last gave per-process samples
        # The compute processes (pid, memory) the last read listed, until a look at the node's
        # GPUs takes them (GpuSession.node_processes): that poll's list, not asked again
        self.listed: list[tuple[int, int]] | None = None
        # The driver's samples from binding on (node/samples.py): the GPU samples read every
        # poll, the memory samples at the sampler's cadence (told from drops by the former)
        self.gpu_samples = SampleSeries(self.bound_at, self._newest_sample_us(GPU_UTILIZATION_SAMPLES))
        self.mem_samples = SampleSeries(
            self.bound_at, self._newest_sample_us(MEMORY_UTILIZATION_SAMPLES), drops_against=self.gpu_samples)
        self.gpm_taken_at = self.read_steady = self.steady()  # read_steady: the last read's
        self.gpm = self._gpm_start()
        self.gpm_request: Any = gpm_request(self.nvml) if self.gpm is not None else None
        # Each result slot of the request with its name, taken once: views of its buffer
        self.gpm_slots: list[tuple[str, Any]] = (
            [] if self.gpm_request is None else list(zip(GPM_NAMES, self.gpm_request.metrics, strict=False)))
        # The links, static but for the PCIe link's current speed (read_pcie)
        self.pcie_max = self._pcie_max()
        self.pcie_seen: list[int | None] = [None, None]  # the highest current gen, width seen
        self.pcie_done = False  # seen at its most (or NVML cannot say): no more reads
        self.link_turns = 0
        self.read_pcie()
        self.nvlink = self._nvlink()

    def _pcie_max(self) -> dict[str, int | None]:
        """What the PCIe link can do: the most device and slot allow, and the device alone
        (the link belongs to the whole GPU: a MIG slice reads its GPU's)."""
        whole = self.parent if self.is_mig else self.handle
        return {"max_gen": self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle=whole),
                "max_width": self._call("nvmlDeviceGetMaxPcieLinkWidth", handle=whole),
                "gpu_max_gen": self._call("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle=whole)}

    def read_pcie(self, util: float | None = None) -> None:
        """The PCIe link's current generation and width, the highest kept. An idle link
        drops to a lower generation, so it is read on busy polls (`util` at or above
        LINK_BUSY_UTIL, or unknown), else every LINK_IDLE_TURNS calls; no more once it was
        seen at its most. The sampler calls this every few polls, not every one."""
        if self.pcie_done:
            return
        self.link_turns += 1
        if util is not None and util < LINK_BUSY_UTIL and self.link_turns % LINK_IDLE_TURNS:
            return
        whole = self.parent if self.is_mig else self.handle
        gen = self._link_call("nvmlDeviceGetCurrPcieLinkGeneration", whole)
        width = self._link_call("nvmlDeviceGetCurrPcieLinkWidth", whole)
        seen = self.pcie_seen
        for i, value in enumerate((gen, width)):
            if value is not None and (seen[i] is None or value > seen[i]):
                seen[i] = int(value)
        top = self.pcie_max
        self.pcie_done = {"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth"} <= \
            self.unsupported or (seen[0] == top["max_gen"] and seen[1] == top["max_width"])

    def _link_call(self, function: str, whole: Any) -> Any:
        """A look at the link speed that failed (NVML busy, an unknown error) is tried again
        at a later look: quietly, as it costs no reading of the poll's; never raises (a GPU
        lost meanwhile is the next poll's to find, where the sampler expects it)."""
        try:
            return self._call(function, handle=whole, passing=False)
        except Exception:
            return None

    def pcie_link(self) -> dict[str, int | None] | None:
        """{"gen", "width"} the highest current seen, {"max_gen", "max_width"} what device
        and slot allow, "gpu_max_gen" the device alone; None where NVML said none of it."""
        link = {"gen": self.pcie_seen[0], "width": self.pcie_seen[1], **self.pcie_max}
        return None if all(v is None for v in link.values()) else link

    def _nvlink(self) -> dict[str, Any] | None:
        """The GPU's active NVLinks, their generation and bandwidth per direction, all
        together; None where NVML has no NVLink for it (NotSupported: most PCIe cards, not
        a refusal worth listing among the unsupported calls). Links are asked from 0 until
        one past the GPU's own (InvalidArgument). Once, at binding: links are static."""
        nvml = self.nvml
        whole = self.parent if self.is_mig else self.handle
        active, version = 0, None
        try:
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_NVLINKS)):
                try:
                    state = nvml.nvmlDeviceGetNvLinkState(whole, link)
                except nvml.NVMLError_InvalidArgument:
                    break  # past the GPU's links
                if state == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    active += 1
                    if version is None:
                        version = int(nvml.nvmlDeviceGetNvLinkVersion(whole, link))
        except nvml.NVMLError_GpuIsLost as exc:
            raise self._lost() from exc
        except self.mismatches:
            if active == 0:
                return None  # no NVLink here, or a driver without the calls
        except Exception as exc:  # a passing error: a partial count would mislead
            self._note("NVLink", exc)
            return None
        generation = None if version is None else NVLINK_GENERATION.get(version)
        rate = None if generation is None else NVLINK_GBPS_PER_DIR.get(generation)
        return {"links": active, "version": generation, "nvml_version": version,
                "gbps_per_dir": 0.0 if active == 0 else None if rate is None else rate * active}

    def _call(
        self, function: str, *args: Any, handle: Any = None, key: str = "", passing: bool = True,
    ) -> Any:
        """Call an NVML function: None when this GPU does not support it (remembered under
        `key`, by default the function's name), GpuLost when the GPU is gone. A passing
        error (timeout, unknown) costs one reading, not the metric: logged and read as None,
        or raised when not `passing`. (A poll's fixed reads go through _poll_reads.)"""
        key = key or function
        if key in self.unsupported:
            return None
        nvml = self.nvml
        try:
            return getattr(nvml, function)(self.handle if handle is None else handle, *args)
        except nvml.NVMLError_GpuIsLost as exc:
            raise self._lost() from exc
        except self.mismatches:
            # Not supported here, or the driver lacks the versioned symbol or struct pynvml
            # asks for (a _v3, say): it will lack it on the next poll too, so ask no more.
            self.unsupported.add(key)
            return None
        except Exception as exc:  # not only NVMLError: the binding raises plain ones too
            if not passing:
                raise
            self._note(function, exc)
            return None

    def _lost(self) -> GpuLost:
        return GpuLost(f"GPU minor {self.minor} ({self.uuid}) is lost")

    def _note(self, what: str, exc: Exception) -> None:
        """An error that cost a reading, not the figure: kept for the summary, each kind
        once with how often it came (NVML failing for minutes is a few lines, not the
        first polls' repeats)."""
        message = f"{what}: {exc}"
        counts = self.error_counts
        if message in counts:
            counts[message] += 1
        elif len(self.errors) < 20:
            self.errors.append(message)
            counts[message] = 1

    def error_lines(self) -> list[str]:
        """The errors as the summary tells them: with their count where they came again."""
        counts = self.error_counts
        return [f"{e} ({n} times)" if (n := counts.get(e, 1)) > 1 else e for e in self.errors]

    def _plan(self, figure: str, first: int) -> PlannedRead | None:
        """The first of a figure's calls, from `first` on, that this GPU is not known to lack."""
        for choice, call in enumerate(POLL_READS[figure][first:], first):
            function, args, key = call[0], call[1], _unsupported_key(call)
            if key in self.unsupported or not hasattr(self.nvml, function):  # a pynvml too old
                self.unsupported.add(key)
                continue
            constants = tuple(getattr(self.nvml, a) if isinstance(a, str) else a for a in args)
            # methodcaller: the function looked up on pynvml each call, in C (a test may put
            # another in its place), and called with the arguments made here
            return SLOT[figure], methodcaller(function, self.handle, *constants), (figure, choice, function)
        return None

    def _light_plan(self) -> list[PlannedRead]:
        """The plan but its energy counter's read, made again once a fallback has taken a
        read's place in the plan (_read_failed makes a new list)."""
        light, plan = self.light, self.plan
        if light is None or light[0] is not plan:
            light = self.light = (plan, [p for p in plan if p[0] != SLOT["energy"]])
        return light[1]

    def _poll_reads(self, plan: list[PlannedRead]) -> list[Any]:
        """A poll's planned reads: NVML's answers, a slot a figure (SLOT), None where it gave
        none. The calls in one loop, not a function each: this runs ~10 times a GPU a poll."""
        # A slot a figure of POLL_READS (read() unpacks all eight): a literal, as it is
        # cheaper to build than [None] * len(SLOT)
        values = [None, None, None, None, None, None, None, None]
        nvml = self.nvml
        for planned in plan:
            slot, call, _ = planned
            try:
                values[slot] = call(nvml)
            except Exception as exc:  # not only NVMLError: the binding raises plain ones too
                values[slot] = self._read_failed(planned, exc)
        return values

    def _read_failed(self, planned: PlannedRead, exc: Exception) -> Any:
        """GpuLost when the GPU is gone. A call the GPU does not support, or whose symbol or
        struct version the driver lacks (a _v3, say), it will lack on the next poll too: the
        figure's next call takes its place from now on, and answers for this poll. Any other
        error (timeout, unknown) costs one reading, not the figure: logged, None."""
        slot, _, (figure, choice, function) = planned
        if isinstance(exc, self.nvml.NVMLError_GpuIsLost):
            raise self._lost() from exc
        if not isinstance(exc, self.mismatches):
            self._note(function, exc)
            return None
        self.unsupported.add(_unsupported_key(POLL_READS[figure][choice]))
        instead = self._plan(figure, choice + 1)
        self.plan = [p for p in self.plan if p is not planned] if instead is None else [
            instead if p is planned else p for p in self.plan]
        return None if instead is None else self._poll_reads([instead])[slot]

    def _gpm_start(self) -> Any:
        """Two GPM sample buffers, the first one taken; None where GPM is not there."""
        whole = self.parent if self.is_mig else self.handle
        support = self._call("nvmlGpmQueryDeviceSupport", handle=whole)
        if support is None or not support.isSupportedDevice:
            return None
        samples: list[Any] = []
        try:
            samples.append(self.nvml.nvmlGpmSampleAlloc())
            samples.append(self.nvml.nvmlGpmSampleAlloc())
            self._gpm_take(samples[0])
        except self.nvml.NVMLError:
            self._gpm_free(samples)  # a GPM that cannot sample must not keep its buffers
            return None
        return samples

    def _gpm_free(self, samples: list[Any]) -> None:
        for sample in samples:
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except self.nvml.NVMLError:
                pass

    def _gpm_take(self, sample: Any) -> None:
        if self.is_mig:
            self.nvml.nvmlGpmMigSampleGet(self.parent, self.gi_id, sample)
        else:
            self.nvml.nvmlGpmSampleGet(self.handle, sample)

    def _gpm_read(self, now: float) -> tuple[dict[str, float] | None, float]:
        """GPM's means since its last sample, and the seconds they cover; `now` on the
        steady clock, more than GPM_MIN_INTERVAL_S after the pair's first sample (read())."""
        covers = now - self.gpm_taken_at  # since the first sample of the pair was taken
        nvml = self.nvml
        first, second = self.gpm
        request = self.gpm_request
        try:
            self._gpm_take(second)
            request.sample1, request.sample2 = first, second
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError_GpuIsLost as exc:
            raise self._lost() from exc
        except nvml.NVMLError as exc:
            self._note("GPM", exc)
            return None, 0.0  # the pair's first sample stands: the next read covers this poll too
        self.gpm_taken_at = now
        self.gpm = [second, first]  # the newest sample starts the next interval
        means = {}
        isfinite = math.isfinite
        for name, slot in self.gpm_slots:
            value = _field(slot, "value")
            if _field(slot, "nvmlReturn") == NVML_SUCCESS and isfinite(value):
                means[name] = value
        return means, covers

    def _samples(self, series: SampleSeries, kind: int, now: float) -> list[tuple[float, float]] | None:
        """Every driver sample of `kind` since the last call, each weighted by the time it
        covers (series.take); `now`: the poll's time on the driver's clock."""
        if self.is_mig or "nvmlDeviceGetSamples" in self.unsupported:
            return None
        last = series.last_us
        nvml = self.nvml
        try:
            _, samples = nvml.nvmlDeviceGetSamples(self.handle, kind, last or 0)
        except nvml.NVMLError_NotFound:  # none newer: most polls, _none_newer written out
            if last and now * 1e6 < last - CLOCK_BACK_US:  # _before(last), at the poll's time
                self._stepped_back(series, kind, last)
            return []
        except nvml.NVMLError_GpuIsLost as exc:
            raise self._lost() from exc
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            self.unsupported.add("nvmlDeviceGetSamples")
            return None
        except nvml.NVMLError as exc:
            if exc.value == NVML_SUCCESS:  # none new
                return self._none_newer(series, kind, last)
            self._note("nvmlDeviceGetSamples", exc)
            return []
        # The header promises no order: sort by the driver's timestamp.
        # Fields read past pynvml's per-access hook (_field): a dozen samples a second
        return series.take(
            sorted((int(_field(s, "timeStamp")), float(_field(s, "sampleValue").uiVal)) for s in samples))

    def _newest_sample_us(self, kind: int) -> int | None:
        """The driver's newest sample's timestamp (0: it has none, so every one to come is
        newer); None when it cannot say (not supported, an error)."""
        if self.is_mig or "nvmlDeviceGetSamples" in self.unsupported:
            return None
        nvml = self.nvml
        try:
            _, samples = nvml.nvmlDeviceGetSamples(self.handle, kind, 0)
        except nvml.NVMLError_NotFound:
            return 0
        except nvml.NVMLError as exc:
            return 0 if exc.value == NVML_SUCCESS else None
        return max((int(s.timeStamp) for s in samples), default=0)

    def _none_newer(self, series: SampleSeries, kind: int, last: int | None) -> list[tuple[float, float]]:
        """The driver has nothing newer than `last`. Where the clock now reads before that
        sample, it may have been stepped back (NTP), the driver's timestamps with it: if
        the driver's newest sample is older than `last` too, the samples go on from that
        one at the next poll (this poll's rate stands in), rather than none until the
        clock is back where it was."""
        if last and self._before(last):
            self._stepped_back(series, kind, last)
        return []

    def _stepped_back(self, series: SampleSeries, kind: int, last: int) -> None:
        """The clock reads before `last`: from the driver's newest sample on, if older."""
        newest = self._newest_sample_us(kind)
        if newest is not None and newest < last:
            series.last_us = newest

    def _before(self, stamp_us: int) -> bool:
        """The clock reads more than a second before the driver's timestamp `stamp_us`:
        an epoch timestamp from before a step back (a boot-clock driver's never is)."""
        return self.clock() * 1e6 < stamp_us - CLOCK_BACK_US

    def _process_sm(self) -> dict[int, float] | None:
        """SM utilisation per process in the driver's last sample period (NVML reports
        one sample per process that was busy then), to split a shared GPU by job."""
        found = self._call_quiet("nvmlDeviceGetProcessUtilization", self.process_since_us)
        if found == [] and self.process_since_us and self._before(self.process_since_us):
            # The clock was stepped back past the last sample: is the driver's newest older?
            again = self._call_quiet("nvmlDeviceGetProcessUtilization", 0)
            if again and max(int(s.timeStamp) for s in again) < self.process_since_us:
                self.process_since_us, found = 0, again  # from the driver's newest on
        if found is None:
            return None
        now = self.steady()
        if found:
            self.process_seen_at = now
        elif now - self.process_seen_at < 1.5 * self.driver_period_s():
            return None  # polled again within the driver's period: nothing new, not idle
        per_pid: dict[int, list[float]] = {}
        for sample in found:  # fields read past pynvml's per-access hook (_field)
            self.process_since_us = max(self.process_since_us, int(_field(sample, "timeStamp")))
            sm = _field(sample, "smUtil")
            if 0 <= sm <= 100:  # drivers are seen reporting more than 100%: noise
                per_pid.setdefault(int(_field(sample, "pid")), []).append(float(sm))
        return {pid: sum(v) / len(v) for pid, v in per_pid.items()}

    def _call_quiet(self, function: str, *args: Any) -> Any:
        """Like _call, but "no data yet" (NotFound) is an answer, not an error."""
        try:
            return self._call(function, *args, passing=False)
        except self.nvml.NVMLError_NotFound:
            return []
        except self.nvml.NVMLError as exc:
            # pynvml raises NVMLError(SUCCESS) when the driver has no sample to give
            return [] if exc.value == NVML_SUCCESS else None

    def read(self, per_process: bool = False, energy_counter: bool = True,
             mem_samples: bool = True) -> Reading:
        """One poll; `per_process` also reads each process's SM utilisation (a shared GPU);
        `energy_counter` False leaves the energy counter out (energy_mj None); `mem_samples`
        False leaves the memory-utilisation samples in the driver's buffer for a later poll
        (mem_util None), where the GPU samples came (the buffer is being filled) and the
        GPU has not dropped any at that cadence."""
        # Once a GPU a poll: the Reading is built from positional arguments (its fields'
        # order), cheaper than by keyword.
        now = self.clock()
        steady = self.steady()
        since_us = (steady - self.read_steady) * 1e6  # the time this reading stands for
        self.read_steady = steady
        plan = self.plan if energy_counter else self._light_plan()
        memory, processes, power, temp, clock, energy, throttle, ecc = self._poll_reads(plan)
        mem_used = None if memory is None else float(_field(memory, "used"))
        pids = None if processes is None else [(int(p.pid), int(p.usedGpuMemory or 0)) for p in processes]
        gpm: dict[str, float] | None = None
        gpm_s = 0.0
        if self.gpm is not None:
            steady = self.steady()  # again: GPM's samples must be 100 ms apart when taken
            if steady - self.gpm_taken_at > GPM_MIN_INTERVAL_S:
                gpm, gpm_s = self._gpm_read(steady)
            else:  # too close to the last GPM sample for NVML (> 100 ms apart): next poll
                gpm = {}
        if self.is_mig:
            return Reading(time=now, util=None, mem_util=None, power_w=None, energy_mj=None,
                           mem_used_bytes=mem_used, gpm=gpm, gpm_s=gpm_s, pids=pids)
        gpu_samples = self.gpu_samples
        util_samples = self._samples(gpu_samples, GPU_UTILIZATION_SAMPLES, now)
        util_mean = gpu_samples.mean if util_samples else None
        util: float | None
        mem_util: float | None
        if util_samples and not mem_samples and not self.mem_samples.every_poll:
            # Left in the buffer: the next read takes them, each for its own window. No rate
            # stands in for this poll (the samples will cover its time).
            util, mem_util, mem = util_samples[-1][0], None, None
        else:
            mem = self._samples(self.mem_samples, MEMORY_UTILIZATION_SAMPLES, now)
            util, mem_util = self._utilisation(util_samples, mem)
            if util_samples == [] and util is not None:  # the rate stands in for this poll
                gpu_samples.stood(now * 1e6, since_us)
                if mem == [] and mem_util is not None:
                    self.mem_samples.stood(now * 1e6, since_us)
        reading = Reading(
            now, util, mem_util, mem_used,
            None if power is None else power / 1000.0,  # power_w
            energy,  # energy_mj
            util_samples, mem, gpm, gpm_s,
            None if temp is None else float(temp),  # temp_c
            None if clock is None else float(clock),  # sm_clock_mhz
            throttle, ecc,  # throttle_mask, ecc_uncorrected
            pids,
            self._process_sm() if per_process else None,  # process_sm
            util_mean,
        )
        self.listed = pids  # a whole read: this poll's list, for the look at the node
        return reading

    def driver_period_s(self) -> float:
        """The driver's sample period as its timestamps told it (the longest by product
        until they do)."""
        return self.gpu_samples.period_s or self.mem_samples.period_s or DRIVER_PERIOD_S

    def _utilisation(self, util_samples: list[tuple[float, float]] | None,
                     mem_samples: list[tuple[float, float]] | None) -> tuple[float | None, float | None]:
        """The poll's GPU and memory utilisation: the newest samples' values. No new GPU
        samples at all (some drivers stop filling the buffer while the GPU idles): the rate
        stands for this poll, rather than a silent gap."""
        util: float | None
        mem_util: float | None
        if util_samples:
            util, mem_util = util_samples[-1][0], mem_samples[-1][0] if mem_samples else None
        else:
            rates = self._call("nvmlDeviceGetUtilizationRates")
            util = mem_util = None
            if rates is not None:
                util, mem_util = float(_field(rates, "gpu")), float(_field(rates, "memory"))
            if mem_samples:
                mem_util = mem_samples[-1][0]
        return util, mem_util

    def close(self) -> None:
        self._gpm_free(self.gpm or [])
        self.gpm = None


def gpm_request(nvml: ModuleType) -> Any:
    """The GPM metrics request, made once a GPU: NVML writes only each slot's result into
    it (bench/bare.py's baseline makes the same)."""
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    for slot, metric_id in zip(request.metrics, GPM_METRICS, strict=False):
        slot.metricId = metric_id
    return request


def steady_clock(time_scale: float) -> Callable[[], float]:
    """The monotonic clock in the driver clock's seconds: a simulation's run `time_scale`
    times the wall clock's."""
    if time_scale == 1:
        return time.monotonic
    return lambda: time.monotonic() * time_scale


class GpuSession:
    """NVML, opened for the lifetime of one job's sampler, closed at its end."""

    def __init__(self, config: Config, node: str = "") -> None:
        self.nvml = load_nvml(config)
        self.time_scale = config.sim_time_scale
        # Readings dated by the driver's clock (the wall clock: NTP may step it), the time
        # between them measured on the monotonic clock, in the same (simulated) seconds.
        self.clock: Callable[[], float] = sampler_clock(config, node)
        self.steady: Callable[[], float] = steady_clock(self.time_scale)
        self.gpus: list[Gpu] = []
        self.others: list[tuple[int, str, Any]] = []  # the node's GPUs not bound: (minor, uuid, handle)
        self.unlisted = 0  # the node's GPUs NVML could not name at binding (not in `others`)
        self.events: Any = None
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise GpuAccessError(f"NVML cannot start: {exc}") from exc

    def bind(
        self, wanted: list[int | str], minors: dict[int, int | tuple[int, int]] | None = None,
    ) -> list[Gpu]:
        """Resolve Slurm's node-level indexes or GPU/MIG UUIDs to devices. An index is a
        device minor through `minors` (Slurm's own map; a (GPU minor, GPU instance) pair for
        a MIG slice), else itself (gres.conf listing /dev/nvidia[0-N] in order)."""
        minors = minors or {}
        nvml = self.nvml
        by_minor: dict[int, tuple[Any, str]] = {}
        by_uuid: dict[str, tuple[Any, int, Any, int | None]] = {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise GpuAccessError(f"NVML cannot list GPUs: {exc}") from exc
        for item in wanted:
            if isinstance(item, int) and minors and item not in minors:
                raise BindingError(f"Slurm's GPU index {item} is not in slurmd's GPU list "
                                   f"({len(minors)} GPU(s) mapped): which device it is cannot be told")
        targets = [minors.get(w, w) if isinstance(w, int) else w for w in wanted]
        mig_wanted = any(isinstance(t, tuple) or str(t).startswith("MIG-") for t in targets)
        for i in range(count):
            try:  # one broken GPU of the node must not stop the job's GPUs being found
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                self.unlisted += 1
                continue
            by_minor[minor] = (handle, uuid)
            by_uuid[uuid] = (handle, minor, None, None)
            if mig_wanted:
                by_uuid.update(self._mig_instances(handle, minor))
        gpus = [self._bind_one(item, target, by_minor, by_uuid)
                for item, target in zip(wanted, targets, strict=True)]
        bound = {g.parent_uuid or g.uuid for g in gpus}
        self.others = [(m, u, h) for m, (h, u) in sorted(by_minor.items()) if u not in bound]
        self.gpus = gpus
        self.events = self._watch_xid(gpus)
        return gpus

    def _bind_one(
        self, item: int | str, target: int | str | tuple[int, int],
        by_minor: dict[int, tuple[Any, str]], by_uuid: dict[str, tuple[Any, int, Any, int | None]],
    ) -> Gpu:
        if isinstance(target, tuple):  # a MIG slice named by Slurm's index
            parent_minor, instance = target
            found = [u for u, (_, m, parent, gi) in by_uuid.items()
                     if parent is not None and m == parent_minor and gi == instance]
            if not found:
                raise BindingError(f"no MIG instance {instance} on the GPU with minor number "
                                   f"{parent_minor} (Slurm index {item}) here")
            target = found[0]
        if isinstance(target, int):
            if target not in by_minor:
                raise BindingError(f"no GPU with minor number {target} (Slurm index {item}) here")
            handle, uuid = by_minor[target]
            return Gpu(self.nvml, handle, int(item), target, uuid, self.clock, steady=self.steady)
        if target not in by_uuid:
            raise BindingError(f"no GPU or MIG instance with UUID {target} on this node")
        handle, minor, parent, gi_id = by_uuid[target]
        index = item if isinstance(item, int) else minor
        gpu = Gpu(self.nvml, handle, index, minor, target, self.clock, parent, gi_id, self.steady)
        gpu.parent_uuid = by_minor[minor][1] if parent is not None else None
        return gpu

    def _mig_instances(self, handle: Any, minor: int) -> dict[str, tuple[Any, int, Any, int | None]]:
        nvml = self.nvml
        found: dict[str, tuple[Any, int, Any, int | None]] = {}
        try:
            if nvml.nvmlDeviceGetMigMode(handle)[0] != 1:
                return found
            for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                    gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
                    found[_text(nvml.nvmlDeviceGetUUID(mig))] = (mig, minor, handle, gi_id)
                except nvml.NVMLError:
                    continue  # an empty slot, or one instance NVML cannot read
        except nvml.NVMLError:
            pass  # no MIG on this GPU (or a driver without it)
        return found

    def _watch_xid(self, gpus: list[Gpu]) -> Any:
        """An event set for XID errors on the job's GPUs (whole GPUs: XIDs are per board)."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError):
            return None
        registered: list[str] = []
        for gpu in gpus:
            board = gpu.parent_uuid or gpu.uuid  # XIDs are the board's: register it once,
            if board in registered:             # however many of its MIG slices the job has
                continue
            try:  # a GPU that cannot report events does not silence the others
                nvml.nvmlDeviceRegisterEvents(gpu.parent or gpu.handle, XID_EVENT, events)
                registered.append(board)
            except nvml.NVMLError as exc:
                gpu.errors.append(f"XID events not available: {exc}")
        return events

    def node_processes(self) -> list[tuple[int, list[int]]] | None:
        """Every process on every GPU of the node, compute and graphics: (minor, pids). None
        when any GPU could not be listed, or the job's are MIG slices (a GPU's list is not a
        slice's): "none of the job's processes on any GPU" is never said from a partial look."""
        if self.unlisted or any(g.is_mig for g in self.gpus):
            return None
        nvml = self.nvml
        found = []
        # A bound GPU's compute processes are those its read of this poll listed (Gpu.listed,
        # taken here, so never a later poll's), else asked for
        taken = [(gpu, gpu.listed) for gpu in self.gpus]
        for gpu in self.gpus:
            gpu.listed = None
        for gpu, listed in taken:
            try:
                pids = ([int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu.handle)]
                        if listed is None else [pid for pid, _ in listed])
                pids += [int(p.pid) for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(gpu.handle)]
            except Exception:  # NVMLError or a library mismatch: the look is partial
                return None
            found.append((gpu.minor, pids))
        for minor, _, handle in self.others:
            try:
                processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
                processes += nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
            except Exception:
                return None
            found.append((minor, [int(p.pid) for p in processes]))
        return found

    def other_processes(self) -> list[tuple[int, list[int]]]:
        """The compute processes on the node's GPUs that are not bound: (minor, pids)."""
        found = []
        for minor, _, handle in self.others:
            try:
                processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:  # NVMLError or a library mismatch: that GPU says nothing
                continue
            found.append((minor, [int(p.pid) for p in processes]))
        return found

    def xid_events(self) -> list[tuple[str, int, int]]:
        """(GPU UUID, XID code, GPU instance id) of every event since the last call; never
        blocks. The instance id is 0xFFFFFFFF when the event is not a MIG instance's."""
        if self.events is None:
            return []
        nvml = self.nvml
        found = []
        for _ in range(64):  # bounded: a storm of events must not stall the sampler
            try:
                event = nvml.nvmlEventSetWait_v2(self.events, 0)
            except nvml.NVMLError:
                break  # Timeout: nothing pending
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError:
                uuid = "?"
            found.append((uuid, int(event.eventData), int(getattr(event, "gpuInstanceId", ALL_GI))))
        return found

    def close(self) -> None:
        for gpu in self.gpus:
            gpu.close()
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def inventory(config: Config) -> tuple[str | None, list[dict[str, Any]]]:
    """What `gpueff doctor` says of this node's GPUs: the driver's version, and per GPU
    its minor, UUID, name, persistence mode and GPM support (None where NVML cannot say:
    an old driver, a call not there). Raises GpuAccessError when NVML cannot start."""
    nvml = load_nvml(config)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise GpuAccessError(f"NVML cannot start: {exc}") from exc
    try:
        driver = _maybe(nvml, nvml.nvmlSystemGetDriverVersion)
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            support = _maybe(nvml, nvml.nvmlGpmQueryDeviceSupport, handle)
            persistence = _maybe(nvml, nvml.nvmlDeviceGetPersistenceMode, handle)
            gpus.append({
                "minor": _maybe(nvml, nvml.nvmlDeviceGetMinorNumber, handle),
                "uuid": _text(_maybe(nvml, nvml.nvmlDeviceGetUUID, handle) or ""),
                "name": _text(_maybe(nvml, nvml.nvmlDeviceGetName, handle) or ""),
                "persistence": None if persistence is None else persistence == 1,
                "gpm": None if support is None else bool(support.isSupportedDevice),
            })
    except nvml.NVMLError as exc:
        raise GpuAccessError(f"NVML cannot list GPUs: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return (None if driver is None else _text(driver)), gpus


def _maybe(nvml: ModuleType, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLLibraryMismatchError,
            AttributeError):
        return None
