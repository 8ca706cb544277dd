"""A running job's live figures for Prometheus, through node_exporter's textfile
collector (`[export] textfile_dir`, off when empty): one file a job, written whole and
renamed every sampler interval, removed when the job ends. The Prometheus text format,
which is what the collector parses (OpenMetrics' `# UNIT`, `# EOF` and counters named
without `_total` reach Prometheus untyped, with a HELP of node_exporter's own).
Standard library only: the sampler runs it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

from .spool import open_folder, safe_part

# (metric, help, type): what each GPU's line says; a counter is exposed as metric_total
METRICS = (
    ("gpueff_gpu_utilization_ratio", "GPU utilisation at the last poll, 0 to 1", "gauge"),
    ("gpueff_gpu_sm_active_ratio", "SM activity at the last poll (GPM, Hopper and newer), 0 to 1",
     "gauge"),
    ("gpueff_gpu_memory_used_bytes", "GPU memory used at the last poll", "gauge"),
    ("gpueff_gpu_power_watts", "GPU power draw at the last poll", "gauge"),
    ("gpueff_gpu_energy_joules", "GPU energy since the job's sampler started", "counter"),
    ("gpueff_gpu_idle_seconds", "How long the GPU has been under 5% utilisation without a break "
     "(0: busy)", "gauge"),
)

# `[export] labels`: "job" names the job by its id alone; "user" adds its user and account,
# which Slurm's PrivateData cannot hide here (docs/security.md).
LABELS = {
    "job": ("job_id", "node", "minor", "uuid"),
    "user": ("job_id", "user", "account", "node", "minor", "uuid"),
}


class Figures(Protocol):
    """One GPU's live figures (node/live.LiveFigures gives them, from a GpuStats)."""

    def live(self) -> dict[str, float | None]: ...

    def labels(self) -> dict[str, str]: ...


def path_for(directory: str, job_id: str) -> str:
    return os.path.join(directory, file_name(job_id))


def file_name(job_id: str) -> str:
    return f"gpueff-job-{safe_part(job_id)}.prom"


def exposed(name: str, kind: str) -> str:
    """The name Prometheus stores: a counter's ends in _total."""
    return f"{name}_total" if kind == "counter" else name


def text(gpus: Iterable[Figures], labels: str = "job") -> str:
    gpus, keep = list(gpus), LABELS[labels]
    lines = []
    for name, help_text, kind in METRICS:
        sample = exposed(name, kind)
        lines += [f"# HELP {sample} {_escape_help(help_text)}", f"# TYPE {sample} {kind}"]
        for gpu in gpus:
            value = gpu.live().get(name)
            if value is not None:
                lines.append(f"{sample}{{{_labels(gpu.labels(), keep)}}} {float(value)!r}")
    return "\n".join(lines) + "\n"


def write(directory: str, job_id: str, gpus: Iterable[Figures], labels: str = "job") -> None:
    """The job's file, whole: written under another name, then renamed over the last."""
    content = text(gpus, labels).encode("utf-8")
    folder = open_folder(directory)  # the directory may be node_exporter's user's
    try:
        _write_in(folder, file_name(job_id), content)
    finally:
        os.close(folder)


def remove(directory: str, job_id: str) -> None:
    folder = open_folder(directory)
    try:
        os.unlink(file_name(job_id), dir_fd=folder)  # a link there goes, never what it names
    except FileNotFoundError:
        pass
    finally:
        os.close(folder)


def _write_in(folder: int, name: str, content: bytes) -> None:
    part = f".{name}.{os.getpid()}"
    try:  # one a crash left; O_EXCL|O_NOFOLLOW: never through a link someone planted
        os.unlink(part, dir_fd=folder)
    except FileNotFoundError:
        pass
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,  # the collector reads it
                 dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(part, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(part, dir_fd=folder)
        except OSError:
            pass
        raise


def _labels(labels: dict[str, str], keep: tuple[str, ...]) -> str:
    return ",".join(f'{k}="{_escape(labels[k])}"' for k in keep if k in labels)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")
