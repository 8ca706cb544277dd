"""A GPU node: the GPUs slurmd gives jobs (gres.conf's device files) and NVML's, the node
spool root's hooks write, and node_exporter's textfile directory where one is set."""

from __future__ import annotations

import os
import stat

from ..config import Config
from ..errors import BindingError, GpuEffError
from .base import Check, dir_fix, existing_parent, perms, unsafe_dirs

NVIDIA_MAJOR = 195  # /dev/nvidia[0-9]*: the driver's character devices


def gres(config: Config, node: str) -> tuple[list[list[str]] | None, str]:
    """The node's GPU positions and their device files, or why they cannot be read (GPU
    lines without File=: Slurm accepts gres.conf's `Name=gpu Count=N`, but the sampler then
    has no device to bind a job's GPUs to). From the node's GPU map, as the sampler reads
    it: on 24.11+ each run of `slurmd -G` disturbs the node's running steps, so slurmd is
    asked only where the map is missing or stale (and root then renews it)."""
    from ..node.binding import gpu_files

    try:
        return gpu_files(node, config.slurmd, config.gpu_map_for(node)), ""
    except BindingError as exc:
        return None, str(exc)


def nvml(config: Config, files: list[list[str]]) -> Check:
    from ..node.binding import char_minor
    from ..node.gpu import inventory

    try:
        driver, gpus = inventory(config)
    except GpuEffError as exc:
        return Check("nvml", False, str(exc),
                     "install the NVIDIA driver (its libnvidia-ml.so.1), or name the library in "
                     "[gpu] library; `nvidia-smi` must work on this node")
    described = "; ".join(
        f"minor {g['minor']} {g['name']}: persistence {_word(g['persistence'])}, GPM {_word(g['gpm'])}"
        for g in gpus)
    found = {int(g["minor"]) for g in gpus if g["minor"] is not None}
    wanted = {m for m in (char_minor(f[0]) for f in files if not any("nvidia-caps" in p for p in f))
              if m is not None}
    if not wanted <= found:
        return Check("nvml", False, f"driver {driver}: slurmd's GPUs (minors {sorted(wanted)}) are not all "
                                    f"among NVML's (minors {sorted(found)})",
                     "make gres.conf name this node's /dev/nvidiaN files (or AutoDetect=nvml)")
    return Check("nvml", True, f"driver {driver or 'unknown'}, {len(gpus)} GPU(s): {described}")


def _word(flag: bool | None) -> str:
    return "unknown" if flag is None else ("on" if flag else "off")


def devices(files: list[list[str]], unreadable: str = "", node: str = "") -> Check:
    if unreadable:
        return Check("gres", False, f"`slurmd -G -N {node}`: {unreadable}",
                     "name each GPU's device file in gres.conf (File=/dev/nvidia[0-3], MIG: the "
                     "/dev/nvidia-caps files) or use AutoDetect=nvml, then restart slurmd")
    bad = []
    for path in (p for position in files for p in position):
        try:
            info = os.stat(path)
        except OSError as exc:
            bad.append(f"{path}: {exc.strerror}")
            continue
        if not stat.S_ISCHR(info.st_mode):
            bad.append(f"{path} is not a character device")
        elif "nvidia-caps" not in path and os.major(info.st_rdev) != NVIDIA_MAJOR:
            bad.append(f"{path} is device {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}, "
                       f"not NVIDIA's (major {NVIDIA_MAJOR})")
    if bad:
        return Check("gres", False, "; ".join(bad),
                     "gres.conf's File= must name the GPUs' /dev/nvidiaN (MIG: /dev/nvidia-caps/...) "
                     "files; `slurmd -G` shows what slurmd reads")
    return Check("gres", True, f"{len(files)} GPU(s) in gres.conf, each an NVIDIA device")


def spool(config: Config, node: str) -> Check:
    path = config.spool_for(node)
    fix = f"install -d -m 0700 -o root {path} (node-local storage; the hooks run as root)"
    bad = unsafe_dirs(path)
    if bad:
        return Check("spool", False, (
            f"{bad[0][1]} is above {path}: a user who can change it can put a link in the spool's place, "
            "and root's hooks write through it"), dir_fix(bad[0][0]))
    if os.path.isdir(path):
        info = os.stat(path)
        if info.st_uid != 0 or info.st_mode & 0o077:
            return Check("spool", False, f"{path} is owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}: "
                                         "others could read or forge summaries", fix)
        if not os.access(path, os.W_OK):
            return Check("spool", False, f"{path} is not writable", fix)
        return Check("spool", True, f"{path}: root's, 0700")
    parent = existing_parent(path)
    if parent is None or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        return Check("spool", False, f"{path} does not exist and cannot be made ({parent} is not a "
                                     "writable directory)", fix)
    return Check("spool", True, f"{path} will be made by the first GPU job (under {parent})")


def export(config: Config) -> Check:
    """node_exporter's textfile directory: root's sampler writes each job's figures there,
    node_exporter serves what it finds. The sampler does not make it."""
    path = config.export_dir
    fix = (f"install -d -m 0755 -o root -g root {path} (node_exporter's --collector.textfile.directory: "
           "root writes, the exporter reads)")
    if not os.path.isdir(path):
        return Check("export", False, f"[export] textfile_dir {path} is not a directory: no job's figures "
                                      "are exported", fix)
    info = os.stat(path)
    if info.st_uid != 0 or info.st_mode & 0o022:
        return Check("export", False, (
            f"{path} is {perms(info)}: a user could put files there that node_exporter serves beside ours, "
            "or replace ours"), f"chown root:root {path}; chmod 0755 {path}")
    bad = unsafe_dirs(path)
    if bad:
        return Check("export", False, f"{bad[0][1]} is above {path}: a user could put another directory "
                                      "in its place", dir_fix(bad[0][0]))
    return Check("export", True, f"{path}: root's, mode {stat.S_IMODE(info.st_mode):o}")
