"""Helpers for tests that run the real pynvml over the stand-in libnvidia-ml.so.1
(slurm_gpu_eff/sim/standin/): build it, load it under pynvml, set its clock.

The library keeps its state in globals, and one path loaded with ctypes.CDLL is one
dlopen handle for the whole test process: a test resets what it changed (shut NVML
down, set_clock(lib, None)).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "slurm_gpu_eff" / "sim" / "standin"
BUILD_DIR = ROOT / "build" / "nvml"
VARIANTS = ("current", "old")


def _stale(lib: Path) -> bool:
    if not lib.exists():
        return True
    built = lib.stat().st_mtime_ns
    return any(source.stat().st_mtime_ns > built for source in SOURCES.iterdir() if source.is_file())


def library_path(variant: str = "current") -> str:
    """The stand-in library's path: "current" (today's driver) or "old" (a driver without
    the newer symbols); built with build.sh first when missing or older than its sources."""
    if variant not in VARIANTS:
        raise ValueError(f"no stand-in variant {variant!r} (known: {', '.join(VARIANTS)})")
    lib = BUILD_DIR / variant / "libnvidia-ml.so.1"
    if _stale(lib):
        result = subprocess.run(
            ["bash", str(SOURCES / "build.sh"), sys.executable, str(BUILD_DIR)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the stand-in NVML library failed:\n{result.stderr}")
    return os.fspath(lib)


def load(pynvml_module: ModuleType, path: str) -> ctypes.CDLL:
    """Make pynvml call the library at `path` (pynvml skips its own loading when nvmlLib
    is set) and forget the function pointers it cached from any other library."""
    lib = ctypes.CDLL(path)
    pynvml_module.nvmlLib = lib
    pynvml_module._nvmlGetFunctionPointer_cache.clear()
    return lib


def set_clock(lib: Any, t: float | None) -> None:
    """Fix the library's simulated "now" at `t` (epoch seconds); None: back to its clock."""
    hook = lib.gpueffSimSetClock
    hook.argtypes = [ctypes.c_double]
    hook.restype = None
    hook(0.0 if t is None else float(t))


def shut_down(lib: Any) -> None:
    """Undo every nvmlInit (NVML is refcounted) so the next test starts uninitialised."""
    shutdown = lib.nvmlShutdown
    for _ in range(1_000_000):  # other tests may leave it initialised many times over
        if shutdown() != 0:  # NVML_ERROR_UNINITIALIZED once the count is back to 0
            return
