"""Slurm through its commands, on every release: the accounting through `sacct -P`
(stable across releases, unlike --json), the controller through squeue and scontrol,
writes through scontrol and sacctmgr, cancels through scancel (`Commands`).

The calls are few; everything else is pure parsing, tested on text captured from each
release (tests/fixtures/). Rows are zipped strictly with the columns asked for, so a new
Slurm column never shifts values silently. The delimiter is new for every call (random
bytes between unit separators): a job's owner cannot put it in the job's name ahead of
time, so no name can cut a row where it likes (forge JobIDRaw, hide a task); a name
holding a newline is stitched back together by counting real delimiters.
"""

from __future__ import annotations

import os
import re

from ..config import Config, find_command
from ..errors import JobNotFound, NotPermitted, SlurmError
from .base import Slurm
from .records import (
    COMMENT_FIELDS,
    Comment,
    RunningJob,
    SlurmJob,
    allocated_gpus,
    allocated_memory,
    interactive,
    local_epoch,
    members,
    mirrored_gpus,
    node_share,
    parse_duration,
    parse_size,
    sacct_time,
)
from .run import run_slurm, said
from .sacct import DELIMITER, FIELDS, SacctRun, check_job_id, fresh_delimiter, is_job_id

JOB_ID = re.compile(r"^\d+(_\d+)?(\+\d+)?$")  # sacct.is_job_id() says the same, without `re`


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
    return comment_from_rows(job_id, rows, field, owner)


def comment_from_rows(job_id: str, rows: list[dict[str, str]], field: str = "AdminComment",
                      owner: bool = False) -> Comment:
    """The Comment of `job_id` among sacct's allocation rows (either backend's): the row of
    its own raw id, else the first, and the id a write names it alone by."""
    row = next((r for r in rows if r["JobIDRaw"] == job_id), rows[0] if rows else None)
    if row is None:
        return Comment("", "", job_id)
    shown = row["JobID"]
    task = shown if ("_" in shown or "+" in shown) and is_job_id(shown) else job_id
    return Comment(row[field], row["AllocTRES"], task, row.get("User", "") if owner else "",
                   row.get("Account", "") if owner else "")


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
        alloc_mem_bytes=allocated_memory(main["ReqMem"], main.get("AllocTRES", ""), main["AdminComment"],
                                         nnodes, ncpus),
        max_rss_bytes=peak_memory(steps), gpus=gpus, admin_comment=main["AdminComment"],
        alloc_tres=main.get("AllocTRES", ""), interactive=interactive([r["JobID"] for r in steps]),
    )


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


def get_jobs(job_id: str, sacct: str = "sacct") -> list[SlurmJob]:
    """One job, or every task of an array / component of a heterogeneous job."""
    return SacctQuery(job_id, sacct).jobs()


def jobs_from_rows(job_id: str, rows: list[dict[str, str]]) -> list[SlurmJob]:
    names = members(job_id, [r["JobID"] for r in rows])
    if not names:
        return [job_from_rows(job_id, rows)]
    by_job: dict[str, list[dict[str, str]]] = {}  # one pass: an array has thousands of tasks
    for row in rows:
        by_job.setdefault(row["JobID"].split(".")[0], []).append(row)
    return [job_from_rows(name, by_job.get(name, [])) for name in names]


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


class Commands(Slurm):
    """Slurm through its commands, as `[slurm]` names them: every release."""

    name = "commands"

    def __init__(self, config: Config, why: str = "", early: SacctRun | None = None) -> None:
        super().__init__(config.comment_field, why)
        self.config = config
        self.early = early  # the report's sacct, started before gpueff loaded (sacct.py)
        self.early_nodes = early.nodes if early is not None else None  # and every node's config

    def command(self, name: str) -> str:
        return find_command(getattr(self.config, name))

    def jobs(self, job_id: str) -> list[SlurmJob]:
        early = self.early
        if early is not None and (early.job_id, early.sacct, early.comment_field) == (
                job_id.strip(), self.config.sacct, self.field):
            self.early = None  # read once
            return SacctQuery(job_id, early.sacct, self.command("scontrol"), run=early).jobs()
        return SacctQuery(job_id, self.command("sacct"), self.command("scontrol"),
                          comment_field=self.field).jobs()

    def period_jobs(self, since: float, until: float, user: str | None = None) -> list[SlurmJob]:
        return period_jobs(sacct_time(since), sacct_time(until), self.command("sacct"), user=user)

    def comment(self, job_id: str, owner: bool = False) -> Comment:
        return get_admin_comment(job_id, self.command("sacct"), self.field, owner=owner)

    def set_comment(self, job_id: str, cluster: str, text: str, running: bool = False) -> str:
        return set_admin_comment(job_id, cluster, text, self.command("scontrol"), self.command("sacctmgr"),
                                 running=running, field=self.field)

    def running_job(self, job_id: str) -> RunningJob | None:
        return job_now(job_id, self.command("squeue"))

    def cluster(self) -> str:
        return cluster_name(self.command("scontrol"))

    def private_jobs(self) -> bool:
        return private_jobs(self.command("scontrol"))

    def node_shares(self, nodes: list[str]) -> dict[str, dict[str, int]]:
        early, self.early_nodes = self.early_nodes, None  # read once
        if early is not None and early.argv[0] == self.command("scontrol"):
            try:
                text = early.text()
            except SlurmError:
                return {}
            return parse_node_lines(text, only=set(nodes))
        return node_shares(nodes, self.command("scontrol"))

    def scancel(self, job_id: str) -> None:
        job_id = check_job_id(job_id)
        done = run_slurm([self.command("scancel"), job_id], 30)
        if done.returncode != 0:
            raise SlurmError(f"scancel {job_id} failed: {said(done)}")


# -- slurmctld: squeue, scontrol --------------------------------------------------------------

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # never an option of scontrol


def node_shares(nodes: list[str], scontrol: str = "scontrol") -> dict[str, dict[str, int]]:
    """Each node's share (records.node_share) from `scontrol show node -o`, one call for all;
    {} for what Slurm does not say (a node gone from the config, no answer)."""
    names = [n for n in nodes if NODE_NAME.match(n)]
    if not names:
        return {}
    try:
        done = run_slurm([scontrol, "show", "node", "-o", ",".join(names)], 30)
    except SlurmError:
        return {}
    if done.returncode != 0:
        return {}
    return parse_node_lines(done.stdout.decode("utf-8", "replace"), only=set(names))


# parse_node_lines' fields, each by its own name after a space (compiled with the module:
# `gpueff JOBID` loads it while sacct answers)
_NODE_NAME, _CFG_TRES = re.compile(r"NodeName=(\S+)"), re.compile(r" CfgTRES=(\S*)")
_CPU_EFCTV, _CPU_TOT = re.compile(r" CPUEfctv=(\d+)"), re.compile(r" CPUTot=(\d+)")


def parse_node_lines(text: str, only: set[str] | None = None) -> dict[str, dict[str, int]]:
    """`scontrol show node -o` lines -> node -> share; `only`: those nodes' lines alone
    (the others left unread: a large cluster's listing is thousands). Values may hold
    spaces (OS=, Reason=): only the fields read are matched, each by its own name after a
    space."""
    shares = {}
    for line in text.splitlines():
        if only is not None and line.partition(" ")[0][9:] not in only:
            continue
        name = _NODE_NAME.match(line)
        tres = _CFG_TRES.search(line)
        if not name or not tres:
            continue
        usable = _CPU_EFCTV.search(line) or _CPU_TOT.search(line)
        share = node_share(tres[1], int(usable[1]) if usable else None)
        if share:
            shares[name[1]] = share
    return shares


def cluster_name(scontrol: str = "scontrol") -> str:
    """slurmctld's own ClusterName: the name its prologs give every row this cluster's
    nodes write (SLURM_CLUSTER_NAME), asked once a pass. Not a setting of ours: a copied
    config would name the wrong cluster, and the watch would act on another's jobs."""
    done = run_slurm([scontrol, "show", "config"], 30)
    if done.returncode != 0:
        raise SlurmError(f"scontrol show config failed: {said(done)}")
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName" and value.strip():
            return value.strip()
    raise SlurmError("scontrol show config names no ClusterName")


# squeue's names for RunningJob's fields, in order. JobID is the job's own (raw) id, one per
# array task and component; JobArrayID the name of the task alone (%i: 1234_7, 1234+1).
SQUEUE_FIELDS = (
    ("JobID", "job_id"), ("JobArrayID", "task_id"), ("Name", "name"), ("UserName", "user"),
    ("Account", "account"), ("Partition", "partition"), ("State", "state"), ("BatchFlag", "batch"),
    ("Comment", "comment"), ("TimeLimit", "time_limit"), ("TimeUsed", "run_time"),
    ("NodeList", "nodes"), ("tres-alloc", "tres"), ("StartTime", "start_at"),
)


def job_now(job_id: str, squeue: str = "squeue") -> RunningJob | None:
    """The job whose own id is `job_id` while slurmctld holds it; None once it is gone.
    `squeue -j` on an array's id lists every task of it (the last task keeps the array's
    id as its own), on a heterogeneous job's every component: the row of this id is the
    one. Each field ends with a fresh delimiter, so no name or comment forges another."""
    job_id = check_job_id(job_id)
    delimiter = fresh_delimiter()
    # ":0": no width, so nothing is cut or padded; the suffix ends each field
    form = ",".join(f"{name}:0{delimiter}" for name, _ in SQUEUE_FIELDS)
    # StartTime in epoch seconds (Slurm's strftime): no local time to read back, whose
    # hour a change from summer time makes ambiguous, whatever the site's format says
    done = run_slurm([squeue, "-h", "-j", job_id, "-O", form], 30, {"SLURM_TIME_FORMAT": "%s"})
    if done.returncode != 0:
        if "Invalid job id" in said(done):
            return None
        raise SlurmError(f"squeue failed: {said(done)}")
    rows = squeue_rows(done.stdout.decode("utf-8", "replace"), delimiter, job_id)
    return next((row for row in rows if row.job_id == job_id), None)


def squeue_rows(text: str, delimiter: str, job_id: str) -> list[RunningJob]:
    """squeue's rows: every field, the last of a row too, ends with the delimiter, and a
    newline parts the rows (it begins the next row's first field)."""
    if not text.strip():
        return []
    values, width = text.split(delimiter), len(SQUEUE_FIELDS)
    if (len(values) - 1) % width or values[-1].strip():
        raise SlurmError(f"squeue gave {len(values) - 1} fields for job {job_id}, not rows of {width}")
    return [_job_now(values[at:at + width]) for at in range(0, len(values) - 1, width)]


def _job_now(values: list[str]) -> RunningJob:
    fields = {key: (value if key in ("name", "comment") else value.strip())
              for (_, key), value in zip(SQUEUE_FIELDS, values, strict=True)}
    if fields["comment"] == "(null)":
        fields["comment"] = ""
    task_id, start, batch = fields.pop("task_id"), fields.pop("start_at"), fields.pop("batch")
    return RunningJob(**fields, batch=batch == "1", task_id=task_id if JOB_ID.match(task_id) else "",
                  start_at=_start(start))


def _start(text: str) -> float | None:
    """Epoch seconds as asked, or Slurm's standard local time (a squeue that ignored
    SLURM_TIME_FORMAT); None for "N/A", "Unknown": no start to compare with."""
    return float(text) if text.isdigit() else local_epoch(text)
