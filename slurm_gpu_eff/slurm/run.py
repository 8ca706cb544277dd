"""Running a Slurm command (standard library only: the node's sampler uses it too)."""

from __future__ import annotations

import os
import subprocess

from ..errors import SlurmError


def run_slurm(command: list[str], timeout: float, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[bytes]:
    """A Slurm command, its failure to start or answer a SlurmError; `env` adds to ours."""
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout, check=False,
                              env=None if env is None else {**os.environ, **env})
    except FileNotFoundError as exc:
        raise SlurmError(f"{command[0]} not found: set it in [slurm]") from exc
    except OSError as exc:
        raise SlurmError(f"cannot run {command[0]}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{command[0]} did not answer within {timeout:g} s") from exc


def said(done: subprocess.CompletedProcess[bytes]) -> str:
    """What a failed Slurm command said: its last line."""
    lines = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def job_state(job_id: str, squeue: str = "squeue") -> str:
    """The job's state as slurmctld holds it (RUNNING, COMPLETING, ...); "" once slurmctld
    no longer lists it. A SlurmError when squeue cannot say: an unreachable controller is
    no proof the job ended."""
    done = run_slurm([squeue, "-h", "-j", job_id, "-o", "%T"], 30)
    if done.returncode != 0:
        if "Invalid job id" in said(done):
            return ""
        raise SlurmError(f"{squeue} failed: {said(done)}")
    return done.stdout.decode("utf-8", "replace").strip()
