"""The in-job side of the simulation: `gpueff-sim run PROFILE.json` drives the job's GPUs.

It runs inside the job, so it sees exactly what a CUDA program would: SLURM_JOB_GPUS
(node-level indexes, which our gres.conf maps to device minors) and SLURMD_NODENAME.
It publishes the profile and its start time for each of those GPUs, waits out the
profile's duration, and marks the end. The simulated NVML does the rest.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Config
from ..errors import GpuEffError
from ..node.binding import gres_gpu_minors
from ..node.jobenv import parse_job_gpus
from . import nvml as sim
from .profile import Profile, ProfileError, parse_profile


def load_profile(path: str) -> Profile:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ProfileError(f"profile {path} is not valid JSON: {exc}") from exc
    return parse_profile(data)


def job_minors(env: Mapping[str, str], minors: dict[int, int] | None = None) -> list[int | str]:
    """The job's GPUs: device minors (Slurm's indexes mapped, as the sampler does), or MIG
    instance UUIDs."""
    gpus = parse_job_gpus(env.get("SLURM_JOB_GPUS"))
    if not gpus:
        raise GpuEffError("this job has no GPUs (SLURM_JOB_GPUS is empty): request --gres=gpu:N")
    minors = minors or {}
    return [minors.get(g, g) if isinstance(g, int) else g for g in gpus]


class Publisher:
    """Writes the per-GPU state files that the simulated NVML reads."""

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
            previous = sim.Workload(
                parse_profile(state["profile"]), int(state["position"]),
                float(state["started_at"]),
                None if state.get("ended_at") is None else float(state["ended_at"]),
                float(state.get("prior_extra_j", 0.0)),
            )
        except (KeyError, TypeError, ValueError, ProfileError):
            return 0.0
        idle = float(spec.get("idle_power_w", 60))
        return previous.prior_extra_j + sim.extra_energy_j(previous, idle, now)

    def _read(self, minor: int | str) -> dict[str, Any] | None:
        try:
            with open(sim.state_path(self.state_dir, self.node, minor), encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def _write(
        self, minor: int | str, profile: Profile, position: int, started: float,
        ended: float | None, prior: float,
    ) -> None:
        path = sim.state_path(self.state_dir, self.node, minor)
        state = {
            "job_id": self.job_id, "position": position, "profile": profile.raw,
            "started_at": started, "ended_at": ended, "prior_extra_j": prior,
            "pid": os.getpid(),  # NVML lists it as the GPU's process: it is in the job's cgroup
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(state, handle)
            os.replace(tmp, path)  # readers never see half a file
        except OSError as exc:
            raise GpuEffError(
                f"cannot publish the simulated GPU's state in {os.path.dirname(path)}: "
                f"{exc.strerror} (it must exist and be writable by every user, not sticky)"
            ) from exc


def _device_specs(path: str, node: str) -> dict[int, dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
        specs = table.get(node, []) if isinstance(table, dict) else table
        return {int(s["minor"]): s for s in specs}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def sim_clock(config: Config) -> Callable[[], float]:
    """The simulated clock the NVML simulation uses: the same boot time and time scale."""
    try:
        boot = os.stat(config.sim_devices).st_mtime
    except OSError as exc:
        raise GpuEffError(f"cannot read the simulated devices {config.sim_devices}: {exc.strerror}") from exc
    return lambda: sim.sim_time(boot, config.sim_time_scale)


def run(
    profile_path: str, config: Config, env: Mapping[str, str],
    clock: Callable[[], float] | None = None, sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Play the profile on the job's GPUs; returns when it started and ended (simulated
    time). SIGTERM ends it early."""
    if config.gpu_backend != "sim":
        raise GpuEffError("gpueff-sim needs a config with [gpu] backend = sim (set GPUEFF_CONFIG)")
    clock = clock or sim_clock(config)
    scale = config.sim_time_scale
    profile = load_profile(profile_path)
    node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    minors = job_minors(env, gres_gpu_minors(node, config.slurmd))
    publisher = Publisher(config, node, env.get("SLURM_JOB_ID", ""))
    stop = {"now": False}

    def on_term(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, on_term)
    started = clock()
    publisher.start(profile, minors, started)
    ended = started
    try:
        while not stop["now"] and clock() - started < profile.duration_s:
            sleep(min(0.5, max(0.0, (profile.duration_s - (clock() - started)) / scale)))
    finally:
        ended = clock()
        publisher.end(profile, minors, started, ended)
        signal.signal(signal.SIGTERM, previous)
    return started, ended
