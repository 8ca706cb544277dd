"""What Slurm answers, whichever backend asked: the records, and the conversions of
Slurm's own units (sizes, TRES lists, durations) that both backends need."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..mirror import parse_admin_comment

_SIZE = re.compile(r"^([\d.]+)([KMGTP]?)[nc]?$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class SlurmJob:
    """One job run as Slurm's accounting holds it: what seff reads, and our figures' line."""

    job_id: str
    job_id_raw: str
    name: str
    cluster: str
    user: str
    account: str
    partition: str
    state: str
    exit_code: str
    elapsed_s: int
    timelimit_s: int | None
    start: str
    end: str
    ncpus: int
    nnodes: int
    nodelist: str
    total_cpu_s: float
    alloc_mem_bytes: int | None
    max_rss_bytes: int | None
    gpus: int
    admin_comment: str = ""  # where mirror.py keeps the job's GPU figures
    alloc_tres: str = ""  # when asked for (usage reports: the GPU model)
    # An interactive allocation (salloc, srun alone): steps but no batch step. None where
    # no step was asked for or recorded (the usage report's sync asks for none).
    interactive: bool | None = None

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING", "SUSPENDED", "PENDING")

    @property
    def cpu_efficiency(self) -> float | None:
        """Percent, as seff: CPU time used over core-walltime allocated."""
        if self.running or self.elapsed_s <= 0 or self.ncpus <= 0:
            return None
        return 100.0 * self.total_cpu_s / (self.elapsed_s * self.ncpus)

    @property
    def mem_efficiency(self) -> float | None:
        """Percent, as seff 22.05: the peak memory (the largest step's MaxRSS, one task's
        peak, times that step's tasks) over the memory allocated."""
        if self.running or not self.alloc_mem_bytes or self.max_rss_bytes is None:
            return None
        return 100.0 * self.max_rss_bytes / self.alloc_mem_bytes


@dataclass(frozen=True)
class RunningJob:
    """A job as slurmctld holds it now: what the idle-GPU policy needs, with what tells
    this run and this task apart."""

    job_id: str  # its own (raw) id: one per array task and heterogeneous component
    name: str
    user: str
    account: str
    partition: str
    state: str
    batch: bool  # False: an interactive allocation (salloc, srun alone)
    comment: str
    time_limit: str
    run_time: str
    nodes: str
    tres: str  # what it holds, as Slurm writes it: cpu=4,mem=8G,node=1,gres/gpu=2
    task_id: str = ""  # the id naming this array task or component alone (1234_7, 1234+1)
    start_at: float | None = None  # when slurmctld started this run (epoch seconds)


class Comment(NamedTuple):
    """A job's comment field as the database holds it, with what writing it needs."""

    text: str
    tres: str  # AllocTRES: the GPUs Slurm allocated
    task: str  # the id to write it with (an array task's or heterogeneous component's own)
    user: str = ""  # whose job has this id now, and under which account: a figure of
    account: str = ""  # another job that had the id before must not go into it


COMMENT_FIELDS = ("AdminComment", "SystemComment")  # where a site may have us keep our part


def mirrored_gpus(admin_comment: str) -> int | None:
    """The GPUs Slurm allocated, as our AdminComment line says; None without one."""
    words = parse_admin_comment(admin_comment)
    if words is None:
        return None
    for key in ("alloc_gpus", "gpus"):
        if words.get(key, "").isdigit():
            return int(words[key])
    return None


def mirrored_memory(admin_comment: str) -> int | None:
    """The memory Slurm allocated (bytes), as our AdminComment line says; None without."""
    words = parse_admin_comment(admin_comment)
    value = (words or {}).get("alloc_mem", "")
    return int(value) if value.isdigit() else None


def allocated_memory(req_mem: str, alloc_tres: str, admin_comment: str, nnodes: int,
                     ncpus: int) -> int | None:
    """The job's memory as Slurm allocated it: our line's copy of AllocTRES, else AllocTRES,
    else ReqMem. ReqMem alone is the request: a job of `-n 4 --mem=1000M` that Slurm spread
    over two nodes shows 1000M there and holds 2000M (seen on 22.05; seff counts 2000M)."""
    mirrored = mirrored_memory(admin_comment)
    if mirrored is not None:
        return mirrored
    held = parse_tres(alloc_tres).get("mem")
    return held if held else requested_memory(req_mem, nnodes, ncpus)


def allocated_gpus(alloc_tres: str) -> int:
    """The GPUs in an AllocTRES ('gres/gpu=2', or per type 'gres/gpu:h100=2')."""
    tres = parse_tres(alloc_tres)
    return tres.get("gres/gpu", sum(v for k, v in tres.items() if k.startswith("gres/gpu:")))


def interactive(step_ids: list[str]) -> bool | None:
    """From a job's step ids (1234.batch, 1234.0, 1234.extern, 1234.interactive): a batch
    job has a batch step, an interactive one has steps and none; no steps, unknown."""
    if not step_ids:
        return None
    return not any(step.endswith(".batch") for step in step_ids)


def node_share(cfg_tres: str, cpus: int | None) -> dict[str, int] | None:
    """A node's share as its config gives it: {"cpus": usable CPUs (CPUEfctv, cores held for
    the system left out), "mem_mb": RealMemory, "gpus"}; None where a part is missing."""
    tres = parse_tres(cfg_tres)
    gpus = allocated_gpus(cfg_tres)
    cpus = cpus or tres.get("cpu")
    mem = tres.get("mem")
    if not cpus or not mem or not gpus:
        return None
    return {"cpus": cpus, "mem_mb": mem // 2**20, "gpus": gpus}


def parse_tres(text: str) -> dict[str, int]:
    """'cpu=4,mem=4000M,node=1,gres/gpu=2' -> {'cpu': 4, 'mem': bytes, 'gres/gpu': 2}."""
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            continue
        size = parse_size(value) if key == "mem" else (int(value) if value.isdigit() else None)
        if size is not None:
            out[key] = size
    return out


def parse_size(text: str) -> int | None:
    """Slurm sizes ('4000M', '1.5G', '1234K', '0') -> bytes; None when unreadable."""
    match = _SIZE.match(text.strip())
    if not match:
        return None
    try:
        return int(float(match[1]) * _UNITS[match[2]])
    except ValueError:
        return None


def parse_duration(text: str) -> float:
    """sacct times ('[D-][HH:]MM:SS[.mmm]') -> seconds; 0 for an empty field."""
    text = text.strip()
    if not text:
        return 0.0
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    if len(parts) == 2 and "." not in rest and days:
        seconds *= 60  # 'D-HH:MM': the two parts are hours and minutes
    return seconds + (int(days) * 86400 if days else 0)


def local_epoch(text: str) -> float | None:
    """Slurm's standard local time (2026-11-20T10:00:00, as sacct and squeue print it) as
    epoch seconds; None for Unknown, None, N/A or anything else. Read by hand, not with
    time.strptime, which loads _strptime and builds the locale's patterns at its first
    call (~3 ms of `gpueff JOBID`)."""
    digits = text[0:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:19]
    if (len(text) != 19 or text[4] != "-" or text[7] != "-" or text[10] != "T" or text[13] != ":"
            or text[16] != ":" or not (digits.isascii() and digits.isdigit())):
        return None
    year, month, day, hour, minute, second = (int(digits[i:i + 2]) for i in range(2, 14, 2))
    year += int(digits[0:2]) * 100
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 61):
        return None
    try:
        epoch = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    return epoch if time.localtime(epoch)[1:3] == (month, day) else None  # no 30 February


def sacct_time(epoch: float) -> str:
    """Epoch seconds as sacct reads (-S, -E) and writes them: local time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def requested_memory(text: str, nnodes: int, ncpus: int) -> int | None:
    """ReqMem in bytes, for the whole job: Slurm 21.08 and later give the total ('1400M'
    for 2 nodes x 700M, checked on 22.05); older ones per node ('700Mn') or per CPU
    ('300Mc')."""
    size = parse_size(text)
    if size is None:
        return None
    suffix = text.strip()[-1:]
    return size * (nnodes or 1) if suffix == "n" else size * (ncpus or 1) if suffix == "c" else size


def members(job_id: str, shown_ids: list[str]) -> list[str]:
    """The tasks of an array (1234_1, 1234_2...) or components of a heterogeneous job
    (1234+0, 1234+1) that `job_id` names as a whole, among the allocations' shown ids
    (sacct's JobID: steps and pending tasks like 1234_[5-9] are skipped: no GPUs yet);
    [] when it names one job."""
    if "_" in job_id or "+" in job_id:
        return []
    found = [
        shown for shown in shown_ids
        if "." not in shown and "[" not in shown
        and (shown.startswith(f"{job_id}_") or shown.startswith(f"{job_id}+"))
    ]
    return found if len(found) > 1 or (found and found[0] != job_id) else []
