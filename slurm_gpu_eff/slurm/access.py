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
# The uses where auto keeps Slurm's commands though pyslurm matches: measured slower
# through pyslurm (`make bench`; the note of issue 21 has the figures). The idle watch
# ("watch") takes pyslurm: running_job 4 ms against squeue's 23 ms on 22.05.
COMMANDS_FASTER = {
    "report": "gpueff JOBID is a process a call: pyslurm's import alone (25-45 ms) costs more than "
              "sacct (4-7 ms on 24.11), and its load asks slurmdbd three times where sacct asks "
              "once (272 ms against 92 ms on 22.05)",
    "mirror": "a comment through pyslurm asks slurmdbd three times where sacct and sacctmgr ask "
              "twice (265 ms against 190 ms on 22.05)",
    # the pyslurm backend asks sacct for a period itself: its import would be paid for nothing
    "period": "only sacct -D gives every run of a requeued job, which the usage report counts",
}


def connect(config: Config, early: SacctRun | None = None, want: str | None = None,
            use: str = "") -> Slurm:
    """The backend `want` (default: the config's) names, for `use` ("report": `gpueff
    JOBID` and the end mail's report; "mirror": the AdminComment's writes; "watch": the
    idle watch; "period": `gpueff report`'s sync and --me). `early`: the
    report's sacct, already running (the commands use it; pyslurm does not need it)."""
    want = want or config.slurm_backend
    if want not in BACKENDS:
        raise SlurmError(f"[slurm] backend = {want!r}: one of {', '.join(BACKENDS)}")
    if want == "auto" and use in COMMANDS_FASTER:
        why = f"the commands: {COMMANDS_FASTER[use]} ([slurm] backend = \"auto\")"
        return Commands(config, why, early)
    if want == "commands":
        return Commands(config, "[slurm] backend = \"commands\"", early)
    from . import inproc

    ok, why = inproc.usable()
    if ok:
        return inproc.Pyslurm(config, f"{why} ([slurm] backend = \"{want}\")")
    if want == "pyslurm":
        raise SlurmError(f"[slurm] backend = \"pyslurm\", but {why}")
    return Commands(config, f"{why}: Slurm's commands instead ([slurm] backend = \"auto\")", early)
