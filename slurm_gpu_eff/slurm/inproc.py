"""Slurm in-process, through pyslurm (Slurm's own library): where it is installed and
built for the running Slurm's release."""

from __future__ import annotations


def usable() -> tuple[bool, str]:
    """(True, what runs) or (False, why not, in one line)."""
    try:
        import pyslurm  # noqa: F401
    except ImportError as exc:
        return False, f"pyslurm is not installed ({exc})"
    return False, "pyslurm's backend is not built yet"
