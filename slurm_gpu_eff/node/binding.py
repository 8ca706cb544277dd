"""Binding Slurm's GPU indexes to devices: what `slurmd -G` says each index's device file is.

It runs on the node (the sampler and the in-job workload use it), so it lives here, not
with the accounting code.
"""

from __future__ import annotations

import os
import stat
import subprocess

from ..config import find_command
from ..hostlist import expand_hostlist

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


def gres_gpu_minors(
    node: str, slurmd: str = "slurmd", mig_minors: str = MIG_MINORS,
) -> dict[int, int | tuple[int, int]]:
    """Slurm's numbering of a node's GPUs (the indexes in SLURM_JOB_GPUS) -> device minor
    numbers, from `slurmd -G` (gres.conf as slurmd reads it, AutoDetect included) and the
    device files themselves. Slurm's order need not be the minors' (with AutoDetect it can
    follow PCI order): binding by this map is right either way. A position whose files hold
    a MIG capability (/dev/nvidia-caps/nvidia-capN) maps to (GPU minor, GPU instance id)
    through the driver's `mig_minors` table. {} when slurmd cannot answer; a position it
    cannot map is left out (and the binding refuses it, rather than guess)."""
    minors: dict[int, int | tuple[int, int]] = {}
    table: dict[int, tuple[int, int]] | None = None
    for position, files in enumerate(gres_gpu_files(node, slurmd) or []):
        caps = [path for path in files if "nvidia-caps" in path]
        if caps:  # one MIG slice: its parent's file and its capabilities, one position
            table = mig_table(mig_minors) if table is None else table
            slot = next((table[m] for m in map(char_minor, caps) if m in table), None)
            if slot is not None:
                minors[position] = slot
            continue
        minor = char_minor(files[0])
        if minor is not None:
            minors[position] = minor
    return minors


def gres_gpu_files(node: str, slurmd: str = "slurmd") -> list[list[str]] | None:
    """The device files of each of the node's GPU positions (one file, or a MIG slice's
    files), in Slurm's order, as `slurmd -G` lists them; None when slurmd cannot answer."""
    slurmd = find_command(slurmd)  # a prolog's PATH often lacks the sbin directories
    try:
        done = subprocess.run([slurmd, "-G", "-N", node], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    # slurmd prints the list through its logger, to stderr on 22.05, in Slurm's own order:
    # a job's SLURM_JOB_GPUS counts positions in it. (Its "Index=" is the device file's
    # number: nvidia-cap21 prints Index=21, yet the job on it gets SLURM_JOB_GPUS=1.)
    positions: list[list[str]] = []
    for line in (done.stdout + done.stderr).decode("utf-8", "replace").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Name") != "gpu" or "File" not in fields:
            continue
        files = expand_hostlist(fields["File"])
        if any("nvidia-caps" in path for path in files):
            positions.append(files)
        else:
            positions += [[path] for path in files]
    return positions


def char_minor(path: str) -> int | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return os.minor(info.st_rdev) if stat.S_ISCHR(info.st_mode) else None


def mig_table(path: str = MIG_MINORS) -> dict[int, tuple[int, int]]:
    """The driver's MIG capability minors: `gpu0/gi3/access 30` (and its compute
    instances' `gpu0/gi3/ci0/access 31`) -> {30: (0, 3), 31: (0, 3)}: which GPU (by minor)
    and GPU instance a capability file opens. {} when the driver has no such table."""
    table: dict[int, tuple[int, int]] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return table
    for line in lines:
        name, _, number = line.partition(" ")
        parts = name.split("/")
        if (len(parts) >= 3 and parts[0].startswith("gpu") and parts[1].startswith("gi")
                and parts[-1] == "access" and number.strip().isdigit()
                and parts[0][3:].isdigit() and parts[1][2:].isdigit()):
            table[int(number)] = (int(parts[0][3:]), int(parts[1][2:]))
    return table
