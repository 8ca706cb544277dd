"""The accounting query `gpueff JOBID` starts before anything else loads (standard library
only: it costs 13 ms to import, the rest of gpueff 150 ms, and slurmdbd answers meanwhile).

The delimiter is new for every call (random bytes between unit separators): a job's owner
cannot put it in the job's name ahead of time, so no name can cut a row where it likes
(forge JobIDRaw, hide a task). Parsing is commands.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from ..errors import SlurmError, UsageError

DELIMITER = "\x1f"  # ASCII unit separator: the captured fixtures' delimiter
# No TRES field: any of them costs a second round trip to slurmdbd (0.17 s, not 0.09 s,
# measured on Slurm 22.05). Memory comes from ReqMem, the GPU count from our line in the
# AdminComment (mirror.py); only a job without that line is asked for AllocTRES. Where a
# site keeps our line in the SystemComment ([slurm] comment_field), that is asked for in
# the AdminComment's place (and read under its name: the last column is our line's field).
FIELDS = (
    "JobID", "JobName", "JobIDRaw", "Cluster", "User", "Account", "Partition", "State",
    "ExitCode", "ElapsedRaw", "TimelimitRaw", "Start", "End", "NCPUS", "NNodes", "NodeList",
    "TotalCPU", "ReqMem", "MaxRSS", "NTasks", "AdminComment",
)
JOB_ID = re.compile(r"^\d+(_\d+)?(\+\d+)?$")


def check_job_id(job_id: str) -> str:
    job_id = job_id.strip()
    if not JOB_ID.match(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (like 1234, 1234_7 or 1234+1)")
    return job_id


def fresh_delimiter() -> str:
    """A delimiter no job name can hold: its middle is chosen now, at random."""
    return f"\x1f{os.urandom(8).hex()}\x1f"


class SacctRun:
    """`sacct -j JOBID` with FIELDS, running from the moment this is made."""

    TIMEOUT_S = 60

    def __init__(self, job_id: str, sacct: str = "sacct", comment_field: str = "AdminComment") -> None:
        self.job_id = check_job_id(job_id)
        self.sacct, self.comment_field = sacct, comment_field
        self.delimiter = fresh_delimiter()
        self.started = time.monotonic()
        fields = [comment_field if f == "AdminComment" else f for f in FIELDS]
        command = [
            sacct, "-j", self.job_id, "-P", "-n", f"--delimiter={self.delimiter}",
            "--format=" + ",".join(fields),
        ]
        try:
            # Bytes, decoded leniently: a job name is the user's and need not be UTF-8.
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError as exc:
            raise SlurmError(f"{sacct} not found: is Slurm's client installed and on PATH?") from exc

    def text(self) -> str:
        left = max(0.1, self.TIMEOUT_S - (time.monotonic() - self.started))
        try:
            out, err = self.process.communicate(timeout=left)
        except subprocess.TimeoutExpired as exc:
            self.process.kill()
            self.process.communicate()
            raise SlurmError(f"sacct did not answer within {self.TIMEOUT_S} s (is slurmdbd up?)") from exc
        if self.process.returncode != 0:
            first = (err.decode("utf-8", "replace").strip().splitlines() or ["no message"])[0]
            raise SlurmError(f"sacct failed: {first}")
        return out.decode("utf-8", "replace")
