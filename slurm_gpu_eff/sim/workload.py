"""The in-job side of the simulation: `gpueff-sim run PROFILE.json` drives the job's GPUs.

It runs inside the job, so it sees exactly what a CUDA program would: SLURM_JOB_GPUS
(node-level indexes, which our gres.conf maps to device minors) and SLURMD_NODENAME.
It publishes, for each of those GPUs, what the GPU does (the profile's phases as that GPU
plays them) and when it started, waits out the profile's duration, and marks the end.
The stand-in libnvidia-ml.so.1 (sim/standin/) reads these files and answers NVML's
calls the way a driver measures: this module says what happens, the library how it is
seen.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Config, driver_clock
from ..errors import GpuEffError
from ..node.binding import gpu_minors
from ..node.jobenv import parse_job_gpus
from .profile import Profile, ProfileError, parse_profile

# How long the workload (the job's user) waits for root's sampler, started by the prolog
# as the job starts, to write the node's GPU map before it asks slurmd itself.
MAP_WAIT_S = 10.0


def _say(message: str) -> None:
    print(f"gpueff-sim: {message}", file=sys.stderr)


def load_profile(path: str) -> Profile:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ProfileError(f"profile {path} is not valid JSON: {exc}") from exc
    return parse_profile(data)


def job_minors(
    env: Mapping[str, str], minors: dict[int, int | tuple[int, int]] | None = None,
    devices: dict[int, dict[str, Any]] | None = None,
) -> list[int | str]:
    """The job's GPUs as the workload publishes them: device minors (Slurm's indexes mapped,
    as the sampler does), or MIG instance UUIDs (named by Slurm, or found in the devices
    file for a (GPU minor, GPU instance) that Slurm's index maps to)."""
    # An srun step on a job's other node inherits the batch node's SLURM_JOB_GPUS; its own
    # node's GPUs are SLURM_STEP_GPUS (what a CUDA program there is confined to). Seen in
    # the soak: a two-node job played its second node's part on the first node's index.
    gpus = parse_job_gpus(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    if not gpus:
        raise GpuEffError("this job has no GPUs (SLURM_JOB_GPUS is empty): request --gres=gpu:N")
    minors = minors or {}
    found: list[int | str] = []
    for gpu in gpus:
        if isinstance(gpu, int) and minors and gpu not in minors:
            raise GpuEffError(f"Slurm's GPU index {gpu} is not in slurmd's GPU list")
        target = minors.get(gpu, gpu) if isinstance(gpu, int) else gpu
        if isinstance(target, tuple):
            target = _mig_uuid(devices or {}, *target)
        found.append(target)
    return found


def _mig_uuid(devices: dict[int, dict[str, Any]], minor: int, gi_id: int) -> str:
    for mig in devices.get(minor, {}).get("mig", []):
        if int(mig.get("gi_id", 1)) == gi_id:
            return str(mig["uuid"])
    raise GpuEffError(f"the simulated GPU with minor {minor} has no MIG instance {gi_id}")


def state_path(state_dir: str, node: str, key: int | str) -> str:
    """Where the workload publishes what a GPU (minor number) or MIG instance (UUID) does."""
    name = f"gpu{key}.json" if isinstance(key, int) else f"{key}.json"
    return os.path.join(state_dir, node, name)


def state_record(
    profile: Profile, position: int, started: float, ended: float | None = None,
    prior_extra_j: float = 0.0, pid: int | None = None, job_id: str = "",
    pid_start: int | None = None,
) -> dict[str, Any]:
    """One GPU's state file: `phases` (resolved for this GPU) and the times are what the
    stand-in library reads; `profile` and `position` let a later workload work out the
    energy this one added. `pid_start` (process_start()) tells the stand-in the workload's
    process from a later one given the same pid."""
    return {
        "job_id": job_id, "position": position, "profile": profile.raw,
        "phases": profile.resolve(position), "started_at": started, "ended_at": ended,
        "prior_extra_j": prior_extra_j, "pid": pid, "pid_start": pid_start,
    }


def process_start(pid: int) -> int | None:
    """When a process started (clock ticks since boot: /proc/PID/stat's 22nd field). A pid
    alone names a process only while it lives: a workload killed without writing its end
    leaves its pid in the state file, and on a busy node (pid_max 32768) a later process
    takes it, which the stand-in would list on the GPU as the killed workload's."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read()
        return int(text[text.rindex(b")") + 2:].split()[19])  # fields after the name: 3..
    except (OSError, ValueError, IndexError):
        return None


def extra_energy_j(profile: Profile, position: int, idle_w: float, started: float,
                   ended: float | None, now: float) -> float:
    """Energy a workload drew above the GPU's idle power, from its start until `now` (or
    its end): the truth, from the profile."""
    stop = now if ended is None else min(now, ended)
    span = max(0.0, stop - started)
    return profile.integral(position, "power_w", 0.0, span, idle_w) - idle_w * span


class Publisher:
    """Writes the per-GPU state files that the stand-in NVML library reads."""

    def __init__(self, config: Config, node: str, job_id: str) -> None:
        self.state_dir = config.sim_state_dir
        self.node = node
        self.job_id = job_id
        self.devices = _device_specs(config.sim_devices, node)

    def start(self, profile: Profile, minors: list[int | str], now: float) -> None:
        for position, minor in enumerate(minors):
            prior = self._prior_extra_j(minor, now)
            self._write(minor, profile, position, now, None, prior)

    def end(self, profile: Profile, minors: list[int | str], started: float, now: float) -> None:
        for position, minor in enumerate(minors):
            state = self._read(minor)
            prior = float(state.get("prior_extra_j", 0.0)) if state else 0.0
            self._write(minor, profile, position, started, now, prior)

    def _prior_extra_j(self, minor: int | str, now: float) -> float:
        """Energy earlier workloads added on this GPU, so its counter never runs backwards."""
        state = self._read(minor)
        spec = self.devices.get(minor) if isinstance(minor, int) else {"idle_power_w": 0}
        if not state or spec is None:
            return 0.0
        try:
            ended = state.get("ended_at")
            added = extra_energy_j(
                parse_profile(state["profile"]), int(state["position"]),
                float(spec.get("idle_power_w", 60)), float(state["started_at"]),
                None if ended is None else float(ended), now,
            )
            return float(state.get("prior_extra_j", 0.0)) + added
        except (KeyError, TypeError, ValueError, ProfileError):
            return 0.0

    def _read(self, minor: int | str) -> dict[str, Any] | None:
        try:
            with open(state_path(self.state_dir, self.node, minor), encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def _write(
        self, minor: int | str, profile: Profile, position: int, started: float,
        ended: float | None, prior: float,
    ) -> None:
        path = state_path(self.state_dir, self.node, minor)
        # The workload's pid: NVML lists it as the GPU's process, and it is in the job's cgroup.
        pid = os.getpid()
        state = state_record(profile, position, started, ended, prior, pid, self.job_id, process_start(pid))
        tmp = f"{path}.{pid}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(state, handle)
            os.replace(tmp, path)  # readers never see half a file
        except OSError as exc:
            raise GpuEffError(
                f"cannot publish the simulated GPU's state in {os.path.dirname(path)}: "
                f"{exc.strerror} (it must exist and be writable by every user, not sticky)"
            ) from exc


# The libraries each framework's process maps, as a site's installations name them (paths
# under a pip environment's site-packages): what the sampler reads in /proc/PID/maps.
RUNTIME = "nvidia/cuda_runtime/lib/libcudart.so.12"
FRAMEWORK_LIBRARIES = {
    "pytorch": ("torch/lib/libc10_cuda.so", "torch/lib/libtorch_cuda.so", RUNTIME),
    "tensorflow": ("tensorflow/libtensorflow_framework.so.2",
                   "tensorflow/python/_pywrap_tensorflow_internal.so", RUNTIME),
    "jax": ("jaxlib/xla_extension.so", RUNTIME),
    "cuda": (RUNTIME,),
    "none": (),
}


class FrameworkLibraries:
    """Maps, read-only, small files named as a framework's libraries into this process for
    as long as it is open, so that its /proc/PID/maps reads as that framework's would. The
    files live in a directory of their own under TMPDIR (the job's), removed on close."""

    def __init__(self, framework: str) -> None:
        self.maps: list[mmap.mmap] = []
        self.directory = ""
        names = FRAMEWORK_LIBRARIES[framework]
        if not names:
            return
        self.directory = tempfile.mkdtemp(prefix="gpueff-sim-libs-")
        try:
            for name in names:
                self.maps.append(_map_file(os.path.join(self.directory, "site-packages", name)))
        except OSError as exc:
            self.close()
            raise GpuEffError(f"cannot present the job as {framework}: {exc}") from exc

    def close(self) -> None:
        for mapped in self.maps:
            mapped.close()
        self.maps = []
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = ""


def _map_file(path: str) -> mmap.mmap:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"\x7fELF gpueff-sim stand-in\n")  # not loadable: only its name counts
    with open(path, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)  # the mapping outlives the fd


def _device_specs(path: str, node: str) -> dict[int, dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
        specs = table.get(node, []) if isinstance(table, dict) else table
        return {int(s["minor"]): s for s in specs}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def run(
    profile_path: str, config: Config, env: Mapping[str, str],
    clock: Callable[[], float] | None = None, sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Play the profile on the job's GPUs; returns when it started and ended (simulated
    time). SIGTERM ends it early."""
    if not (config.sim_devices and config.sim_state_dir):
        raise GpuEffError("gpueff-sim needs a config with [sim] devices and state_dir (set GPUEFF_CONFIG)")
    clock = clock or driver_clock(config)
    scale = config.sim_time_scale
    profile = load_profile(profile_path)
    node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    publisher = Publisher(config, node, env.get("SLURM_JOB_ID", ""))
    slurm_map = gpu_minors(node, config, MAP_WAIT_S, _say)
    minors = job_minors(env, slurm_map, publisher.devices)
    stop = {"now": False}

    def on_term(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, on_term)
    # Mapped before the process shows on a GPU, as a framework's are by the time it has a
    # CUDA context, and kept until it leaves them.
    libraries = FrameworkLibraries(profile.framework)
    started = clock()
    ended = started
    try:
        publisher.start(profile, minors, started)
        try:
            while not stop["now"] and clock() - started < profile.duration_s:
                sleep(min(0.5, max(0.0, (profile.duration_s - (clock() - started)) / scale)))
        finally:
            ended = clock()
            publisher.end(profile, minors, started, ended)
    finally:
        signal.signal(signal.SIGTERM, previous)
        libraries.close()
    return started, ended
