"""Which backend asks Slurm: `[slurm] backend = "auto" | "commands" | "pyslurm"`.

auto takes pyslurm where it is installed and built for the running Slurm's release, else
the commands, and says why (`Slurm.why`: doctor shows it, the idle watch logs it once).
"""

from __future__ import annotations

from ..config import Config
from ..errors import SlurmError
from .base import Slurm
from .commands import Commands
from .sacct import SacctRun

BACKENDS = ("auto", "commands", "pyslurm")


def connect(config: Config, early: SacctRun | None = None, want: str | None = None) -> Slurm:
    """The backend `want` (default: the config's) names. `early`: the report's sacct,
    already running (the commands use it; pyslurm does not need it)."""
    want = want or config.slurm_backend
    if want not in BACKENDS:
        raise SlurmError(f"[slurm] backend = {want!r}: one of {', '.join(BACKENDS)}")
    if want == "commands":
        return Commands(config, "[slurm] backend = \"commands\"", early)
    from .inproc import usable

    ok, why = usable()
    if ok:
        from .inproc import Pyslurm  # type: ignore[attr-defined]  # the helper's, merging

        return Pyslurm(config, f"{why} ([slurm] backend = \"{want}\")")
    if want == "pyslurm":
        raise SlurmError(f"[slurm] backend = \"pyslurm\", but {why}")
    return Commands(config, f"{why}: Slurm's commands instead ([slurm] backend = \"auto\")", early)
