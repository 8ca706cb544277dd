"""Site configuration: one INI file (standard library only: the hooks read it).

The file is found through $GPUEFF_CONFIG, else /etc/slurm-gpu-eff/gpueff.conf; a
missing file means defaults (real NVML, spool and store under /var). Paths may hold
`%n`, replaced by the Slurm node name, so nodes that share a host or a filesystem
keep apart.
"""

from __future__ import annotations

import configparser
import os
import sys
from dataclasses import dataclass

from .model import ConfigError

DEFAULT_PATH = "/etc/slurm-gpu-eff/gpueff.conf"


@dataclass(frozen=True)
class Config:
    path: str | None = None
    gpu_backend: str = "nvml"  # "nvml" (pynvml) or "sim" (simulated GPUs)
    sim_devices: str = ""
    sim_state_dir: str = ""
    interval_s: float = 1.0
    checkpoint_s: float = 60.0
    live_s: float = 300.0  # how often a running job's figures reach the store
    spool_dir: str = "/var/spool/slurm-gpu-eff/%n"
    store_path: str = "/var/lib/slurm-gpu-eff/gpueff.db"
    log_file: str = "/var/log/slurm-gpu-eff/%n.log"
    hook_timeout_s: float = 10.0  # hard bound for a prolog or epilog
    stop_wait_s: float = 3.0  # how long the epilog waits for the sampler to flush
    python: str = sys.executable  # interpreter for the processes the hooks start
    sacct: str = "sacct"

    def spool_for(self, node: str) -> str:
        return expand(self.spool_dir, node)

    def log_for(self, node: str) -> str:
        return expand(self.log_file, node)


def expand(template: str, node: str) -> str:
    return template.replace("%n", node or "unknown")


# (section, key, Config field, type)
_KEYS = [
    ("gpu", "backend", "gpu_backend", str),
    ("sim", "devices", "sim_devices", str),
    ("sim", "state_dir", "sim_state_dir", str),
    ("sampler", "interval_s", "interval_s", float),
    ("sampler", "checkpoint_s", "checkpoint_s", float),
    ("sampler", "live_s", "live_s", float),
    ("sampler", "stop_wait_s", "stop_wait_s", float),
    ("hooks", "timeout_s", "hook_timeout_s", float),
    ("hooks", "python", "python", str),
    ("spool", "dir", "spool_dir", str),
    ("store", "path", "store_path", str),
    ("log", "file", "log_file", str),
    ("slurm", "sacct", "sacct", str),
]


def config_path(path: str | None = None) -> str:
    return path or os.environ.get("GPUEFF_CONFIG") or DEFAULT_PATH


def load_config(path: str | None = None) -> Config:
    """Read the config file; raises ConfigError with the file and key at fault."""
    path = config_path(path)
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except FileNotFoundError:
        return Config(path=None)
    except (OSError, configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    values: dict[str, object] = {"path": path}
    for section, key, name, kind in _KEYS:
        raw = parser.get(section, key, fallback=None)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = kind(raw.strip())
        except ValueError as exc:
            raise ConfigError(f"{path}: [{section}] {key} = {raw!r} is not a number") from exc
        if kind is float and not value > 0:  # type: ignore[operator]
            raise ConfigError(f"{path}: [{section}] {key} must be greater than 0")
        values[name] = value
    config = Config(**values)  # type: ignore[arg-type]
    if config.gpu_backend not in ("nvml", "sim"):
        raise ConfigError(f"{path}: [gpu] backend must be 'nvml' or 'sim'")
    if config.gpu_backend == "sim" and not (config.sim_devices and config.sim_state_dir):
        raise ConfigError(f"{path}: [gpu] backend = sim needs [sim] devices and state_dir")
    return config
