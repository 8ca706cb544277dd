"""Slurm's accounting, through `sacct -P` (stable across Slurm releases, unlike --json).

The sacct call lives in `SacctQuery`; everything else is pure parsing, tested
on captured sacct text. Rows are zipped strictly with the columns asked for, so a new
Slurm column never shifts values silently. The delimiter is new for every call (random
bytes between unit separators): a job's owner cannot put it in the job's name ahead of
time, so no name can cut a row where it likes (forge JobIDRaw, hide a task); a name
holding a newline is stitched back together by counting real delimiters.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .errors import JobNotFound, NotPermitted, SlurmError
from .mirror import parse_admin_comment
from .sacct import DELIMITER, FIELDS, JOB_ID, SacctRun, check_job_id, fresh_delimiter

__all__ = ["DELIMITER", "FIELDS", "SacctQuery", "SlurmJob", "check_job_id", "fresh_delimiter"]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class SlurmJob:
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
    alloc_tres: str = ""  # when sacct was asked for it (usage reports: the GPU model)

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


class SacctQuery:
    """sacct's rows for a job, asked for at once and read when needed: `gpueff` starts it
    (sacct.SacctRun) before it loads the rest of itself, while slurmdbd answers."""

    def __init__(self, job_id: str, sacct: str = "sacct", scontrol: str = "scontrol",
                 run: SacctRun | None = None, comment_field: str = "AdminComment") -> None:
        self.run = run if run is not None else SacctRun(job_id, sacct, comment_field)
        self.job_id, self.delimiter = self.run.job_id, self.run.delimiter
        self.sacct, self.scontrol = sacct, scontrol

    def text(self) -> str:
        return self.run.text()

    def rows(self) -> list[dict[str, str]]:
        """sacct's rows; each job's AllocTRES added where no line of ours gives its GPUs."""
        rows = parse_rows(self.text(), self.delimiter)
        if not rows and private_jobs(self.scontrol):
            raise NotPermitted(
                f"job {self.job_id} is not among the jobs Slurm lets you see: this cluster "
                "keeps jobs private (PrivateData=jobs), so it is another user's job, or none")
        if any("." not in r["JobID"] and mirrored_gpus(r["AdminComment"]) is None for r in rows):
            # Slurm's own count, at the cost of a second call (for the id asked: an array's
            # tasks all come with it, however many they are)
            tres = allocated_tres(self.job_id, self.sacct)
            for row in rows:
                row["AllocTRES"] = tres.get(row["JobIDRaw"], "")
        return rows

    def jobs(self) -> list[SlurmJob]:
        """One job, or every task of an array / component of a heterogeneous job."""
        return jobs_from_rows(self.job_id, self.rows())


@dataclass(frozen=True)
class RunningJob:
    """A job as slurmctld holds it now (squeue): what the idle-GPU alerts need."""

    job_id: str
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


# squeue's names for RunningJob's fields, in order.
_SQUEUE_FIELDS = (
    ("JobID", "job_id"), ("Name", "name"), ("UserName", "user"), ("Account", "account"),
    ("Partition", "partition"), ("State", "state"), ("BatchFlag", "batch"), ("Comment", "comment"),
    ("TimeLimit", "time_limit"), ("TimeUsed", "run_time"), ("NodeList", "nodes"), ("tres-alloc", "tres"),
)


def running_job(job_id: str, squeue: str = "squeue") -> RunningJob | None:
    """The job while slurmctld holds it; None once it is gone. Each field ends with a
    fresh delimiter, so no name or comment can forge another field (as with sacct)."""
    job_id = check_job_id(job_id)
    delimiter = fresh_delimiter()
    # ":0": no width, so nothing is cut or padded; the suffix ends each field
    form = ",".join(f"{name}:0{delimiter}" for name, _ in _SQUEUE_FIELDS)
    done = run_slurm([squeue, "-h", "-j", job_id, "-O", form], 30)
    if done.returncode != 0:
        if "Invalid job id" in said(done):
            return None
        raise SlurmError(f"squeue failed: {said(done)}")
    text = done.stdout.decode("utf-8", "replace")
    if not text.strip():
        return None
    values = text.split(delimiter)
    if len(values) != len(_SQUEUE_FIELDS) + 1 or values[-1].strip():
        raise SlurmError(f"squeue gave {len(values) - 1} fields for job {job_id}, not {len(_SQUEUE_FIELDS)}")
    fields = {key: value for (_, key), value in zip(_SQUEUE_FIELDS, values, strict=False)}
    fields = {key: (value if key in ("name", "comment") else value.strip()) for key, value in fields.items()}
    if fields["comment"] == "(null)":
        fields["comment"] = ""
    return RunningJob(**{**fields, "batch": fields["batch"] == "1"})  # type: ignore[arg-type]


def cancel_job(job_id: str, cluster: str, reason: str, commands: dict[str, str],
               sleep: Callable[[float], None] = time.sleep, field: str = "AdminComment") -> None:
    """Cancel the job with `reason` in its AdminComment (or the `field` that holds our
    figures: [slurm] comment_field), which sacct shows (root or SlurmUser only).
    Written into the database, as a site's own text before our figures' line: the
    mirror keeps it there, and slurmctld, holding no copy, carries none over it at the
    job's end (mirror.py). Looked at again after the cancel: a live mirror that read the
    old text just before would have written it back."""
    from .mirror import with_note

    job_id = check_job_id(job_id)

    def note() -> None:
        current, _, task, *_ = get_admin_comment(job_id, commands["sacct"], field)
        if reason.lower() not in current.lower():
            set_admin_comment(task, cluster, with_note(current, reason), commands["scontrol"],
                              commands["sacctmgr"], running=True, field=field)

    note()
    done = run_slurm([commands["scancel"], job_id], 30)
    if done.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {said(done)}")
    sleep(CANCEL_RECHECK_S)
    with contextlib.suppress(SlurmError):  # cancelled: the note is the lesser thing
        note()


CANCEL_RECHECK_S = 2.0


def private_jobs(scontrol: str = "scontrol") -> bool:
    """Whether Slurm hides other users' jobs from this caller (PrivateData=jobs; root sees
    all). Asked only when sacct showed nothing."""
    if os.geteuid() == 0:
        return False
    try:
        done = run_slurm([scontrol, "show", "config"], 30)
    except SlurmError:
        return False  # no scontrol here: say what sacct said
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PrivateData":
            return "jobs" in value.lower()
    return False


def allocated_tres(job_id: str, sacct: str = "sacct") -> dict[str, str]:
    """AllocTRES of the job, or of each task or component it names (by JobIDRaw)."""
    delimiter = fresh_delimiter()
    fields = ("JobIDRaw", "AllocTRES")
    done = run_slurm([sacct, "-j", check_job_id(job_id), "-X", "-P", "-n", f"--delimiter={delimiter}",
                       "--format=" + ",".join(fields)], 60)
    if done.returncode != 0:
        raise SlurmError(f"sacct failed: {said(done)}")
    rows = parse_rows(done.stdout.decode("utf-8", "replace"), delimiter, fields)
    return {r["JobIDRaw"]: r["AllocTRES"] for r in rows}


def mirrored_gpus(admin_comment: str) -> int | None:
    """The GPUs Slurm allocated, as our AdminComment line says; None without one."""
    words = parse_admin_comment(admin_comment)
    if words is None:
        return None
    for key in ("alloc_gpus", "gpus"):
        if words.get(key, "").isdigit():
            return int(words[key])
    return None


COMMENT_FIELDS = ("AdminComment", "SystemComment")  # where a site may have us keep our part


def set_admin_comment(job_id: str, cluster: str, text: str, scontrol: str = "scontrol",
                      sacctmgr: str = "sacctmgr", running: bool = False,
                      field: str = "AdminComment") -> str:
    """Write `text` into the job's AdminComment, or the `field` named (root or SlurmUser
    only); returns where.

    Checked on Slurm 22.05: while slurmctld still holds the job (running, or completing on
    other nodes) its copy is what the job's end record carries into the database, over
    anything written there meanwhile, so it is written through slurmctld (`scontrol
    update`); once slurmctld says the job has finished, into the database (`sacctmgr`,
    which lowercases it: callers write what survives that).

    A running job's live figures go into the database directly (`running`): slurmctld's
    copy reaches sacct only at the job's end, and a database value survives the end
    record when slurmctld holds none (checked on 22.05). So does a SystemComment always:
    `scontrol update` cannot set one (22.05), `sacctmgr` can (admins, from 22.05)."""
    job_id = check_job_id(job_id)
    if field not in COMMENT_FIELDS:
        raise SlurmError(f"{field!r} is not a job comment field we write ({' or '.join(COMMENT_FIELDS)})")
    if not running and field == "AdminComment":
        held = run_slurm([scontrol, "update", f"jobid={job_id}", f"AdminComment={text}"], 30)
        if held.returncode == 0:
            return "slurmctld"
        why = said(held)
        if "finished" not in why and "Invalid job id" not in why:
            raise SlurmError(f"scontrol could not set job {job_id}'s AdminComment: {why}")
    command = [sacctmgr, "-i", "modify", "job", "where", f"jobid={job_id}"]
    command += [f"cluster={cluster}"] if cluster else []
    stored = run_slurm([*command, "set", f"{field}={text}"], 30)
    if stored.returncode != 0:
        raise SlurmError(f"sacctmgr could not set job {job_id}'s {field}: {said(stored)}")
    return "slurmdbd"


class Comment(NamedTuple):
    """A job's comment field as the database holds it, with what writing it needs."""

    text: str
    tres: str  # AllocTRES: the GPUs Slurm allocated
    task: str  # the id to write it with (an array task's or heterogeneous component's own)
    user: str = ""  # whose job has this id now, and under which account: a figure of
    account: str = ""  # another job that had the id before must not go into it


def get_admin_comment(job_id: str, sacct: str = "sacct", field: str = "AdminComment",
                      owner: bool = False) -> Comment:
    """The job's AdminComment (or `field`) and AllocTRES as the database holds them, and the
    id to write it with: an array task's or a heterogeneous component's own (1234_7,
    1234+0). Its raw id alone names the whole array, or every component, when it is the
    array's or the heterogeneous job's id (checked on 22.05: sacctmgr then writes them all).
    `owner`: its user and account too. sacct gives the latest job with the id (without
    -D): the one a write reaches."""
    delimiter = fresh_delimiter()
    fields: tuple[str, ...] = (field, "AllocTRES", "JobIDRaw", "JobID")
    fields += ("User", "Account") if owner else ()
    done = run_slurm([sacct, "-j", check_job_id(job_id), "-X", "-n", "-P", f"--delimiter={delimiter}",
                       "--format=" + ",".join(fields)], 30)
    if done.returncode != 0:
        raise SlurmError(f"sacct failed: {said(done)}")
    rows = parse_rows(done.stdout.decode("utf-8", "replace"), delimiter, fields)
    row = next((r for r in rows if r["JobIDRaw"] == job_id), rows[0] if rows else None)
    if row is None:
        return Comment("", "", job_id)
    shown = row["JobID"]
    task = shown if ("_" in shown or "+" in shown) and JOB_ID.match(shown) else job_id
    return Comment(row[field], row["AllocTRES"], task, row.get("User", ""), row.get("Account", ""))


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


def parse_rows(text: str, delimiter: str = DELIMITER,
               fields: tuple[str, ...] = FIELDS) -> list[dict[str, str]]:
    """sacct -P output -> one dict per row, stitching rows a newline in a name split."""
    rows: list[dict[str, str]] = []
    pending = ""
    for line in text.split("\n"):
        pending = f"{pending}\n{line}" if pending else line
        count = pending.count(delimiter) + 1
        if count < len(fields):
            continue
        if count > len(fields):
            raise SlurmError(f"sacct returned {count} columns, expected {len(fields)}")
        rows.append(dict(zip(fields, pending.split(delimiter), strict=True)))
        pending = ""
    if pending.strip():
        raise SlurmError("sacct output ended in the middle of a row")
    return rows


def job_from_rows(job_id: str, rows: list[dict[str, str]]) -> SlurmJob:
    """The job's allocation row plus what its steps measured (peak RSS)."""
    jobs = [r for r in rows if "." not in r["JobID"]]
    if not jobs:
        raise JobNotFound(f"job {job_id} is not in Slurm's accounting")
    main = next((r for r in jobs if job_id in (r["JobID"], r["JobIDRaw"])), jobs[0])
    steps = [r for r in rows if r["JobID"].startswith(main["JobID"] + ".")]
    nnodes, ncpus = _int(main["NNodes"]), _int(main["NCPUS"])
    gpus = mirrored_gpus(main["AdminComment"])
    if gpus is None:
        gpus = allocated_gpus(main.get("AllocTRES", ""))
    return SlurmJob(
        job_id=main["JobID"], job_id_raw=main["JobIDRaw"], name=main["JobName"],
        cluster=main["Cluster"], user=main["User"], account=main["Account"],
        partition=main["Partition"], state=(main["State"].split() or ["UNKNOWN"])[0],
        exit_code=main["ExitCode"], elapsed_s=_int(main["ElapsedRaw"]),
        timelimit_s=None if not main["TimelimitRaw"].isdigit() else int(main["TimelimitRaw"]) * 60,
        start=main["Start"], end=main["End"], ncpus=ncpus, nnodes=nnodes,
        nodelist=main["NodeList"], total_cpu_s=parse_duration(main["TotalCPU"]),
        alloc_mem_bytes=requested_memory(main["ReqMem"], nnodes, ncpus),
        max_rss_bytes=peak_memory(steps), gpus=gpus, admin_comment=main["AdminComment"],
        alloc_tres=main.get("AllocTRES", ""),
    )


def requested_memory(text: str, nnodes: int, ncpus: int) -> int | None:
    """ReqMem in bytes, for the whole job: Slurm 21.08 and later give the total ('1400M'
    for 2 nodes x 700M, checked on 22.05); older ones per node ('700Mn') or per CPU
    ('300Mc')."""
    size = parse_size(text)
    if size is None:
        return None
    suffix = text.strip()[-1:]
    return size * (nnodes or 1) if suffix == "n" else size * (ncpus or 1) if suffix == "c" else size


def peak_memory(steps: list[dict[str, str]]) -> int | None:
    """seff 22.05's peak: MaxRSS is the largest task's peak in a step, so the step with the
    largest MaxRSS counts it once per task. (A 4-task step at 150 MiB a task is 600 MiB,
    not 150: a `--mem` hint built on 150 would kill the job.)"""
    peak: tuple[int, int] | None = None
    for step in steps:
        rss = parse_size(step["MaxRSS"]) if step["MaxRSS"] else None
        if rss is not None and (peak is None or rss > peak[0]):
            tasks = step.get("NTasks", "")
            peak = (rss, int(tasks) if tasks.isascii() and tasks.isdigit() and int(tasks) > 0 else 1)
    return None if peak is None else peak[0] * peak[1]


def period_jobs(since: str, until: str, sacct: str = "sacct", user: str | None = None) -> list[SlurmJob]:
    """Every job run (allocations; each run of a requeued job) in Slurm's accounting that
    was pending or running between since and until (sacct's -S / -E forms), of every user
    the caller may see, or of `user` alone. One sacct call; AllocTRES for the GPU model."""
    delimiter = fresh_delimiter()
    fields = (*FIELDS, "AllocTRES")
    who = ["-u", user] if user else ["-a"]
    done = run_slurm([sacct, *who, "-X", "-D", "-P", "-n", f"--delimiter={delimiter}", "-S", since,
                       "-E", until, "--format=" + ",".join(fields)], PERIOD_TIMEOUT_S)
    if done.returncode != 0:
        raise SlurmError(f"sacct failed: {said(done)}")
    rows = parse_rows(done.stdout.decode("utf-8", "replace"), delimiter, fields)
    return [job_from_rows(row["JobID"], [row]) for row in rows]


PERIOD_TIMEOUT_S = 600  # a month of a busy cluster's accounting is a slow query


def get_job(job_id: str, sacct: str = "sacct", scontrol: str = "scontrol") -> SlurmJob:
    query = SacctQuery(job_id, sacct, scontrol)
    return job_from_rows(query.job_id, query.rows())


def members(job_id: str, rows: list[dict[str, str]]) -> list[str]:
    """The tasks of an array (1234_1, 1234_2...) or components of a heterogeneous job
    (1234+0, 1234+1) that `job_id` names as a whole; [] when it names one job. Tasks
    still pending (1234_[5-9]) have no GPUs yet and are left out."""
    if "_" in job_id or "+" in job_id:
        return []
    found = [
        r["JobID"] for r in rows
        if "." not in r["JobID"] and "[" not in r["JobID"]
        and (r["JobID"].startswith(f"{job_id}_") or r["JobID"].startswith(f"{job_id}+"))
    ]
    return found if len(found) > 1 or (found and found[0] != job_id) else []


def get_jobs(job_id: str, sacct: str = "sacct") -> list[SlurmJob]:
    """One job, or every task of an array / component of a heterogeneous job."""
    return SacctQuery(job_id, sacct).jobs()


def jobs_from_rows(job_id: str, rows: list[dict[str, str]]) -> list[SlurmJob]:
    names = members(job_id, rows)
    if not names:
        return [job_from_rows(job_id, rows)]
    by_job: dict[str, list[dict[str, str]]] = {}  # one pass: an array has thousands of tasks
    for row in rows:
        by_job.setdefault(row["JobID"].split(".")[0], []).append(row)
    return [job_from_rows(name, by_job.get(name, [])) for name in names]


def allocated_gpus(alloc_tres: str) -> int:
    """The GPUs in an AllocTRES ('gres/gpu=2', or per type 'gres/gpu:h100=2')."""
    tres = parse_tres(alloc_tres)
    return tres.get("gres/gpu", sum(v for k, v in tres.items() if k.startswith("gres/gpu:")))


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
    match = re.match(r"^([\d.]+)([KMGTP]?)[nc]?$", text.strip())
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


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0
