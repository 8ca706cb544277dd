"""What gpueff reaches beyond the host: the store (as the hooks write it), Slurm's accounting
(sacct), and the way gpueff asks Slurm here ([slurm] backend)."""

from __future__ import annotations

import os

from ..config import Config, find_command
from ..errors import GpuEffError
from .base import Check, existing_parent, run


def store(config: Config) -> Check:
    """Reachable with the writers' URL, and its schema, read without changing it (the
    next delivery migrates a store that is behind)."""
    from ..store import open_store
    from ..store.base import SCHEMA, shown_url

    url = config.store_url
    fix = ("make [store] name a store the hooks (root) can write: a SQLite path on storage every "
           "GPU node reaches, or a PostgreSQL URL whose server answers (see docs/install.md)")
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else None
    if path is not None and not os.path.exists(path):
        parent = existing_parent(path)
        if parent is None or not os.access(parent, os.W_OK):
            return Check("store", False, f"{path} does not exist and {parent} is not writable", fix)
        return Check("store", True, f"{path} will be made by the first delivery")
    try:
        with open_store(url, readonly=True) as opened:
            applied = opened.schema()
    except GpuEffError as exc:
        return Check("store", False, f"{shown_url(url)}: {exc}", fix)
    except Exception as exc:  # a driver's own error: said, not raised
        return Check("store", False, f"{shown_url(url)}: {type(exc).__name__}: {exc}", fix)
    behind = [name for name in SCHEMA if name not in applied]
    if path is not None:
        info = os.stat(path)
        if info.st_uid != 0 or info.st_mode & 0o137:
            return Check("store", False, f"{path} is owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}: "
                                         "users could read it or stall the writers",
                         f"chown root:{config.store_admin_group or 'root'} {path}; chmod 0640 {path}")
    return Check("store", True, f"{shown_url(url)}: reachable, " + (
        f"schema behind by {', '.join(behind)} (the next delivery upgrades it)" if behind
        else f"schema current ({SCHEMA[-1]})"))


def accounting(config: Config) -> Check:
    done = run([find_command(config.sacct), "-n", "-X", "-j", "1", "--format=JobID"])
    if done is None or done.returncode != 0:
        said = "no answer" if done is None else (done.stderr.strip().splitlines() or ["exit status"])[-1]
        return Check("accounting", False, f"sacct: {said}",
                     "slurmdbd must run and slurm.conf name it (AccountingStorageType="
                     "accounting_storage/slurmdbd): reports and users' figures come from sacct")
    return Check("accounting", True, "sacct answers")


def backend(config: Config) -> Check:
    """Which way gpueff asks Slurm here, and why ([slurm] backend)."""
    from ..slurm.access import connect

    try:
        slurm = connect(config)
    except GpuEffError as exc:
        return Check("slurm backend", False, str(exc),
                     "build pyslurm for this Slurm's release (docs/install.md), or set [slurm] backend "
                     "= \"auto\" (pyslurm where it matches, else Slurm's commands)")
    return Check("slurm backend", True, f"{slurm.name}: {slurm.why}")
