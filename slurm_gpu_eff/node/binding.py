"""Binding Slurm's GPU indexes to devices: what `slurmd -G` says each index's device file is.

It runs on the node (the sampler and the in-job workload use it), so it lives here, not
with the accounting code.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from ..hostlist import expand_hostlist


def gres_gpu_minors(node: str, slurmd: str = "slurmd") -> dict[int, int]:
    """Slurm's numbering of a node's GPUs (the indexes in SLURM_JOB_GPUS) -> device minor
    numbers, from `slurmd -G` (gres.conf as slurmd reads it, AutoDetect included) and the
    device files themselves. Slurm's order need not be the minors' (with AutoDetect it can
    follow PCI order): binding by this map is right either way. {} when it cannot be had,
    and an index it does not map (a MIG capability file) is left out."""
    if "/" not in slurmd:  # a prolog's PATH often lacks the sbin directories
        search = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin"
        slurmd = shutil.which(slurmd, path=search) or slurmd
    try:
        done = subprocess.run([slurmd, "-G", "-N", node], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    minors: dict[int, int] = {}
    # slurmd prints the list through its logger, to stderr on 22.05
    for line in (done.stdout + done.stderr).decode("utf-8", "replace").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Name") != "gpu" or not fields.get("Index", "").isdigit() or "File" not in fields:
            continue
        for offset, path in enumerate(expand_hostlist(fields["File"])):
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(info.st_mode) and "nvidia-caps" not in path:
                minors[int(fields["Index"]) + offset] = os.minor(info.st_rdev)
    return minors
