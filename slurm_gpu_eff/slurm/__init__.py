"""The one way in to Slurm.

Everything the package asks Slurm goes through an `access.Slurm`: a backend that runs
Slurm's commands and parses their text (`commands.py`, every release), or one that calls
Slurm's own library in-process through pyslurm (`inproc.py`, where pyslurm is installed
and built for the running Slurm's release). `access.connect` picks one as `[slurm]
backend` says. Both answer with the same records (`records.py`); differences between
Slurm releases are kept in these modules, not spread through the package.

`sacct.py` (the job report's query, started before anything else loads) and `run.py`
(the command runner, and the one question a node's sampler asks) import only the
standard library. This file imports nothing, so that importing them stays that cheap.
"""
