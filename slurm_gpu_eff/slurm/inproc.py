"""Slurm in-process, through pyslurm (Slurm's own library): where it is installed and
built for the running Slurm's release."""

from __future__ import annotations

import os

# Where libslurm reads its configuration when SLURM_CONF names none: the usual file, and
# the copy slurmd keeps on a node of a configless cluster.
CONF_PATHS = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")


def slurm_conf() -> str | None:
    """The slurm.conf libslurm will read, if one is readable here. Without one, libslurm
    looks for a configless controller in DNS and, not finding one, ends the process
    (fatal(): exit status 1) as `import pyslurm` loads it: no exception to catch."""
    named = os.environ.get("SLURM_CONF")
    for path in (named,) if named else CONF_PATHS:
        if os.access(path, os.R_OK):
            return path
    return None


def usable() -> tuple[bool, str]:
    """(True, what runs) or (False, why not, in one line)."""
    if slurm_conf() is None:
        return False, "no slurm.conf readable here (SLURM_CONF, /etc/slurm/slurm.conf): pyslurm not loaded"
    try:
        import pyslurm  # noqa: F401
    except ImportError as exc:
        return False, f"pyslurm is not installed ({exc})"
    return False, "pyslurm's backend is not built yet"
