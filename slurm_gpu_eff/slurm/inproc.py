"""Slurm through pyslurm, its Python binding, in-process: the second backend (issue 21).

pyslurm must be built for the Slurm release it talks to (scripts/build-pyslurm.sh builds
22.5.3 for Slurm 22.05 and the 24.11 branch for 24.11; Slurm 26.05 has none yet), so it is
used only where `usable()` says its major.minor is the running slurmctld's.

Every answer is meant to equal the commands backend's (commands.py) for the
same job. The accounting records are turned into the rows `sacct -P` would have printed,
field for field and in sacct's own text forms, and read by the same code
(`commands.jobs_from_rows`), so which rows make a job, an array or a heterogeneous job, its
peak memory and GPU count are decided in one place. Two pyslurm calls make one answer:

- `pyslurm.slurmdb_jobs().get()` (pyslurm's older, dict-returning API, in both 22.5.3 and
  the 24.11 branch): job ids in sacct's own forms (1234, 1234_7, 1234+1, parsed by
  libslurm as sacct parses them), the raw CPU times with their microseconds, the TRES
  strings and each step's usage. `pyslurm.db.Jobs.load` (the newer API) drops the
  microseconds (TotalCPU whole seconds per step, short of sacct's by up to one second a
  step), the TRES strings (no AllocTRES, so no GPU count without our line) and takes job
  ids as integers only, and also fetches the QOS list at every call.
- `pyslurm.db.Jobs.load()`: the AdminComment and SystemComment, which the older API lacks.

What still differs from the commands, and by how much:

- `period_jobs` asks sacct: neither pyslurm API can ask for every run of a requeued job
  (sacct -D: JOBCOND_FLAG_DUP; the older API takes the flag but keys its answer by job
  id, so runs overwrite each other), and the usage report counts each run.
- A heterogeneous job's components are told apart by their ids: neither API gives
  het_job_id/het_job_offset from the database, and Slurm numbers a heterogeneous job's
  components from the leader's id up, so component K of leader N is job N+K. A
  component asked for by its own id (1235 for 1234+1) is shown as 1235, where sacct
  shows 1234+1.
- `comment`/`set_comment` name an array task or heterogeneous component to slurmdbd and
  slurmctld by its raw job id (the newer API's only form). Where that raw id is also the
  array's or the heterogeneous job's own id (every array has one such task, and the
  leader is component 0), it would name them all, so that one write goes through the
  commands (the commands' `set_comment`), which name it alone.

What it costs (Slurm 22.05 dev cluster, 2 busy cores; every slurmdbd round trip there
takes 88 ms however small: two ~44 ms waits, the request's and the answer's second
write held back by Nagle's algorithm against delayed ACKs, as strace of sacct shows;
slurm-newer.md saw 2-4 ms a load on 24.11): `import pyslurm` 25 ms;
usable()'s RPC 2-3 ms; `slurmdb_jobs().get` one round trip (88 ms, as `sacct -j N`: 92 ms
as a process); `pyslurm.db.Jobs.load` two (176 ms): the jobs, then the whole QOS list
(slurmdb_qos_get, to name each job's QOS), which no JobFilter option and no other call of
that API leaves out (steps come with both, as with sacct without -X); the TRES names one
more, once a process. So jobs() costs three round trips (~270 ms) where the commands
cost one (~92 ms), comment() three against two, period_jobs() about 1.4x sacct's; the
slurmctld calls are where in-process wins: running_job() 4 ms against squeue's 23 ms,
cluster() one cached RPC against `scontrol show config`'s 20 ms.

Importing pyslurm has effects on the process: libslurm reads slurm.conf at import and,
without one, ends the process (see CONFIG_PATHS); pyslurm sets RTLD_GLOBAL in the
interpreter's dlopen flags (24.11: and RTLD_DEEPBIND) for every later extension import;
libslurm logs its connection errors to stderr itself ("python: error: ...").

pyslurm's exceptions never leave this module: they become SlurmError, JobNotFound or
NotPermitted, with Slurm's message. pyslurm has no type stubs: it is Any here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pwd
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..config import Config, find_command
from ..errors import JobNotFound, NotPermitted, SlurmError
from .base import Slurm
from .commands import Commands, comment_from_rows, jobs_from_rows, parse_rows
from .records import COMMENT_FIELDS, Comment, RunningJob, SlurmJob, mirrored_gpus
from .run import run_slurm, said
from .sacct import FIELDS, check_job_id, fresh_delimiter, is_job_id

# Slurm's constants (slurm.h), the same in 22.05 and 24.11
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF
NO_VAL64 = 0xFFFFFFFFFFFFFFFE
PRIVATE_DATA_JOBS = 0x0001
JOBCOND_FLAG_NO_STEP = 1 << 1  # sacct -X: allocations only, no steps sent
JOBCOND_FLAG_NO_TRUNC = 1 << 2  # sacct's default: start and end as they were
TRES_CPU, TRES_MEM, TRES_NODE = 1, 2, 4
JOB_COMPLETE = 3  # enum job_states: pending 0, running 1, suspended 2, complete 3, ...
STEP_NAMES = {0xFFFFFFFA: "interactive", 0xFFFFFFFB: "batch", 0xFFFFFFFC: "extern", 0xFFFFFFFD: "TBD"}
# Where libslurm looks for slurm.conf (Debian's build) after SLURM_CONF: without one,
# `import pyslurm` does not raise, it ends the process ("fatal: Could not establish a
# configuration source", exit status 1), so none is imported without a config to read.
CONFIG_PATHS = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")

T = TypeVar("T")


def usable() -> tuple[bool, str]:
    """(True, "pyslurm 22.5.3 for Slurm 22.05") where pyslurm imports and was built for the
    running slurmctld's major.minor; else (False, why, in one line). Costs the import
    (about 25 ms) and one RPC to slurmctld (its configuration, kept for cluster() and
    private_jobs()), once a process: 2-3 ms, but 9.4 s where slurmctld refuses
    connections (libslurm's retries), which sacct alone would not have waited for."""
    if _USABLE:
        return _USABLE[0]
    answer = _check_usable()
    _USABLE.append(answer)
    return answer


class Pyslurm(Slurm):
    """The Slurm access the commands backend gives, through pyslurm in this process."""

    name = "pyslurm"

    def __init__(self, config: Config | None = None, why: str = "") -> None:
        self.config = config or Config()
        super().__init__(self.config.comment_field, why)

    # -- the accounting (slurmdbd) ------------------------------------------------------------

    def jobs(self, job_id: str) -> list[SlurmJob]:
        """One job, or every task of an array / component of a heterogeneous job when the
        id names them as a whole: as `the commands' `jobs``."""
        job_id = check_job_id(job_id)
        rows = self._rows(job_id, with_steps=True)
        if not rows and self.private_jobs():
            raise NotPermitted(
                f"job {job_id} is not among the jobs Slurm lets you see: this cluster "
                "keeps jobs private (PrivateData=jobs), so it is another user's job, or none")
        return jobs_from_rows(job_id, rows)

    def period_jobs(self, since: float, until: float, user: str | None = None) -> list[SlurmJob]:
        """Through sacct, as the commands ask: every run of a requeued job is a row of the
        usage report, and neither pyslurm API can ask for them (sacct -D: the older one takes
        the flag but keys its answer by job id, so runs overwrite each other). Measured on
        22.05, pyslurm's way was also 1.4x slower (204 ms against 149 ms for 30 jobs)."""
        return Commands(self.config).period_jobs(since, until, user)

    def comment(self, job_id: str, owner: bool = False) -> Comment:
        """The job's comment field and AllocTRES as the database holds them, and the id to
        write it with: as the commands' `comment`."""
        job_id = check_job_id(job_id)
        rows = self._rows(job_id, with_steps=False, field=self.field)
        return comment_from_rows(job_id, rows, owner=owner)

    def set_comment(self, job_id: str, cluster: str, text: str, running: bool = False) -> str:
        """Write `text` into the job's AdminComment (or SystemComment); returns where, as
        the commands' `set_comment`: a running job's AdminComment through slurmctld, a finished
        one's (and every SystemComment, and `running` live copies) through slurmdbd.
        Not checked against a cluster (the dev cluster's test runs must not be written to):
        sacctmgr 22.05 was seen lowercasing what it stores; if that is sacctmgr's own doing,
        text written here through slurmdbd keeps its case (callers write what survives
        either way)."""
        job_id, field = check_job_id(job_id), self.field
        if field not in COMMENT_FIELDS:
            raise SlurmError(f"{field!r} is not a job comment field we write ({' or '.join(COMMENT_FIELDS)})")
        raw = self._raw_id(job_id)
        if raw is None:  # an id pyslurm cannot name alone: see the module's docstring
            return Commands(self.config).set_comment(job_id, cluster, text, running=running)
        ps = _module()
        if not running and field == "AdminComment":
            try:
                ps.Job(raw).modify(ps.JobSubmitDescription(admin_comment=text))
                return "slurmctld"
            except Exception as exc:  # noqa: BLE001 - pyslurm's, whatever its class
                why = _message(exc)
                if "finished" not in why and "Invalid job id" not in why:
                    raise SlurmError(f"slurmctld could not set job {job_id}'s AdminComment: {why}") from None
        changes = ps.db.Job(**{"system_comment" if field == "SystemComment" else "admin_comment": text})
        filt = ps.db.JobFilter(ids=[raw], clusters=[cluster] if cluster else None)
        done = _call(lambda: ps.db.Jobs.modify(filt, changes), "slurmdbd",
                     f"could not set job {job_id}'s {field}")
        if not done:
            raise SlurmError(f"slurmdbd could not set job {job_id}'s {field}: no such job")
        return "slurmdbd"

    # -- slurmctld ----------------------------------------------------------------------------

    def running_job(self, job_id: str) -> RunningJob | None:
        """The job whose own id is `job_id` while slurmctld holds it; None once it is gone:
        as the commands' `running_job` (squeue)."""
        job_id = check_job_id(job_id)
        ps = _module()
        newer = int(ps.__version__.split(".")[0]) >= 23
        try:
            # The older API's find_id is broken from 23.x: it hands slurm_load_job the id as
            # text where the C function now takes an integer ("an integer is required").
            records = [ps.Job.load(int(job_id))] if newer else ps.job().find_id(job_id)
        except Exception as exc:  # noqa: BLE001
            if "Invalid job id" in _message(exc):
                return None
            raise SlurmError(f"slurmctld: {_message(exc)}") from None
        if newer:
            return job_now_newer(records[0]) if str(records[0].id) == job_id else None
        for record in records:
            if str(record.get("job_id")) == job_id:
                return job_now(record)
        return None

    def cluster(self) -> str:
        """slurmctld's own ClusterName, as the commands' `cluster`."""
        name = _controller()["cluster"]
        if not name:
            raise SlurmError("slurmctld's configuration names no ClusterName")
        return str(name)

    def private_jobs(self) -> bool:
        """Whether Slurm hides other users' jobs from this caller (PrivateData=jobs; root
        sees all), as the commands'."""
        if os.geteuid() == 0:
            return False
        try:
            return bool(_controller()["private_jobs"])
        except SlurmError:
            return False  # no answer: say what the accounting said (as slurm.private_jobs)

    def node_shares(self, nodes: list[str]) -> dict[str, dict[str, int]]:
        """As the commands' (scontrol show node): pyslurm.Node.load a node (one RPC each,
        slurm_load_node_single), in both 22.5.3 and the 24.11 branch."""
        ps = _module()
        shares = {}
        for name in nodes:
            try:
                node = ps.Node.load(name)
                gres = node.configured_gres or {}
                gpus = sum(int(n) for k, n in gres.items() if k == "gpu" or k.startswith("gpu:"))
                cpus = node.effective_cpus or node.total_cpus
                mem = node.real_memory
            except Exception:  # noqa: BLE001 - a node gone: its share is not known
                continue
            if cpus and mem and gpus:
                shares[name] = {"cpus": int(cpus), "mem_mb": int(mem), "gpus": gpus}
        return shares

    def scancel(self, job_id: str) -> None:
        """Cancel the job (`scancel JOBID`: an array task or component alone by its own
        form, 1234_7 or 1234+1), through libslurm's slurm_kill_job2 as scancel does."""
        job_id = check_job_id(job_id)
        ps = _module()
        # const char * in pyslurm (22.5.3, 24.11): bytes; SIGKILL, as scancel sends by default
        _call(lambda: ps.slurm_kill_job2(job_id.encode(), 9, 0), "slurmctld",
              f"could not cancel job {job_id}")

    # -- the records, as sacct's rows ---------------------------------------------------------

    def _rows(self, job_id: str, with_steps: bool, field: str | None = None) -> list[dict[str, str]]:
        """sacct's rows for `sacct -j JOB_ID` (with its steps, or -X), AllocTRES added as
        SacctQuery adds it (every row, where an allocation has no GPU count of ours)."""
        ps = _module()
        flags = JOBCOND_FLAG_NO_TRUNC | (0 if with_steps else JOBCOND_FLAG_NO_STEP)
        here = self._here()
        records = list(_call(lambda: ps.slurmdb_jobs().get(jobids=[job_id], flags=flags, clusters=here),
                             "slurmdbd").values())
        if not records:
            return []
        ids = sorted({int(r["jobid"]) for r in records})
        comments = self._comments(ps.db.JobFilter(ids=ids), ids, field)
        names = job_names(job_id, records)
        rows: list[dict[str, str]] = []
        for record in sorted(records, key=sacct_order):
            row = self._job_row(record, names[int(record["jobid"])], comments)
            rows.append(row)
            if with_steps:
                rows.extend(step_rows(row, record))
        if not with_steps or any("." not in r["JobID"] and mirrored_gpus(r["AdminComment"]) is None
                                 for r in rows):
            tres = {str(r["jobid"]): self._alloc_tres(r.get("tres_alloc_str") or "") for r in records}
            for row in rows:
                row["AllocTRES"] = tres.get(row["JobIDRaw"], "")
        return rows

    def _here(self) -> list[str]:
        """This cluster (from slurm.conf, as sacct's default): the older API otherwise asks
        every cluster of the database, and keys its answer by job id alone."""
        ps = _module()
        name = getattr(getattr(ps, "settings", None), "LOCAL_CLUSTER", None)
        return [str(name)] if name else [self.cluster()]

    def _job_row(self, record: dict[str, Any], shown: str,
                 comments: dict[tuple[str, int], str]) -> dict[str, str]:
        row = job_row(record, shown)
        row["AdminComment"] = comments.get((row["Cluster"], int(record["jobid"])), "")
        return row

    def _comments(self, filt: Any, ids: list[int], field: str | None = None) -> dict[tuple[str, int], str]:
        """(cluster, job id) -> the comment field (AdminComment or [slurm] comment_field).
        pyslurm.db.Jobs.load fails on a heterogeneous job whose step spans components
        (IndexError in JobStatistics.from_step, 22.5.3 and the 24.11 branch alike: the
        step's node index is the whole job's, its node list the component's): then sacct
        is asked for the comments of `ids` alone."""
        ps = _module()
        field = field or self.field
        attr = "system_comment" if field == "SystemComment" else "admin_comment"
        try:
            loaded = ps.db.Jobs.load(filt)
        except IndexError:
            return comments_by_sacct(ids, field, self._here()[0], find_command(self.config.sacct))
        except Exception as exc:  # noqa: BLE001
            raise SlurmError(f"slurmdbd: {_message(exc)}") from None
        out: dict[tuple[str, int], str] = {}
        for cluster, jobs in _clusters(loaded):
            for job in jobs:
                out[(str(cluster), int(job.id))] = getattr(job, attr, None) or ""
        return out

    def _alloc_tres(self, simple: str) -> str:
        """An AllocTRES as sacct prints it, from the database's ids ('1=4,2=4000,4=1,1001=2'
        -> 'billing=...,cpu=4,gres/gpu=2,mem=4000M,node=1'); the TRES names are asked once
        a process (a TRES, once made, keeps its id)."""
        if not simple:
            return ""
        if not _TRES_NAMES:
            ps = _module()
            loaded = _call(lambda: ps.db.TrackableResources.load(), "slurmdbd")
            _TRES_NAMES.update({int(t.id): str(t.type_and_name) for t in loaded.values()})
        return alloc_tres_text(simple, _TRES_NAMES)

    def _raw_id(self, job_id: str) -> int | None:
        """The raw job id that names `job_id` alone to slurmdbd and slurmctld; None where
        the raw id would name a whole array or heterogeneous job."""
        if job_id.isdigit():
            return int(job_id)
        rows = self._rows(job_id, with_steps=False)
        row = next((r for r in rows if r["JobID"] == job_id), None)
        if row is None:
            raise JobNotFound(f"job {job_id} is not in Slurm's accounting")
        raw = int(row["JobIDRaw"])
        return None if raw == int(re.split(r"[_+]", job_id)[0]) else raw


# -- pyslurm itself ---------------------------------------------------------------------------

_MODULE: list[Any] = []
_USABLE: list[tuple[bool, str]] = []
_CONTROLLER: list[dict[str, Any]] = []
_TRES_NAMES: dict[int, str] = {}


def config_source() -> str | None:
    """The slurm.conf libslurm would read, if any (SLURM_CONF first). One it cannot read
    is none: libslurm retries it for 60 s, then ends the process."""
    named = os.environ.get("SLURM_CONF")
    for path in (named,) if named else CONFIG_PATHS:
        if os.path.isfile(path) and os.access(path, os.R_OK):
            return path
    return None


def _module() -> Any:
    """pyslurm, imported once; a SlurmError where it cannot be."""
    if not _MODULE:
        if config_source() is None:
            raise SlurmError("no slurm.conf here (SLURM_CONF, /etc/slurm/slurm.conf): "
                             "importing pyslurm would end this process")
        try:
            _MODULE.append(importlib.import_module("pyslurm"))
        except Exception as exc:  # noqa: BLE001 - a broken build raises anything
            raise SlurmError(f"import pyslurm failed: {_message(exc)}") from None
    return _MODULE[0]


def _check_usable() -> tuple[bool, str]:
    if importlib.util.find_spec("pyslurm") is None:
        return False, "pyslurm is not installed (scripts/build-pyslurm.sh builds it from its sources)"
    try:
        ps = _module()
    except SlurmError as exc:
        return False, str(exc)
    version = str(getattr(ps, "__version__", "") or "")
    built = slurm_release(version)
    if built is None:
        return False, f"pyslurm {version or '(no version)'}: not a release built for one Slurm"
    try:
        running = _controller()["version"]
    except SlurmError as exc:
        return False, f"pyslurm {version} (for Slurm {built}) got no answer from {exc}"
    here = slurm_release(str(running))
    if here != built:
        return False, f"pyslurm {version} is built for Slurm {built}, the Slurm running here is {running}"
    return True, f"pyslurm {version} for Slurm {built}"


def slurm_release(version: str) -> str | None:
    """'22.5.3' (pyslurm) or '22.05.8' (Slurm) -> '22.05'."""
    match = re.match(r"^(\d+)\.(\d+)", version)
    return f"{int(match[1])}.{int(match[2]):02d}" if match else None


def _controller() -> dict[str, Any]:
    """slurmctld's version, ClusterName and PrivateData (one RPC, kept for the process)."""
    if not _CONTROLLER:
        ps = _module()
        config = getattr(getattr(ps, "slurmctld", None), "Config", None)
        if config is not None and hasattr(config, "version"):  # 24.11: the newer API has it all
            loaded = _call(config.load, "slurmctld")
            private = loaded.private_data
            answer = {"version": loaded.version, "cluster": loaded.cluster_name,
                      "private_jobs": "jobs" in (private or [])}
        else:  # 22.5.3: the older API's dict
            loaded = _call(lambda: ps.config().get(), "slurmctld")
            answer = {"version": loaded.get("version"), "cluster": loaded.get("cluster_name"),
                      "private_jobs": bool(int(loaded.get("private_data") or 0) & PRIVATE_DATA_JOBS)}
        _CONTROLLER.append(answer)
    return _CONTROLLER[0]


def _call(what: Callable[[], T], daemon: str, doing: str = "") -> T:
    """A pyslurm call; its exception as a SlurmError (NotPermitted for an access denial)."""
    try:
        return what()
    except Exception as exc:  # noqa: BLE001 - pyslurm raises ValueError, RPCError, ...
        why = _message(exc)
        if "Access/permission denied" in why or "Access denied" in why:
            raise NotPermitted(f"{daemon}: {why}") from None
        raise SlurmError(f"{daemon}{': ' + doing if doing else ''}: {why}") from None


def _message(exc: BaseException) -> str:
    """pyslurm's message: ValueError(message, errno) or RPCError(msg=...)."""
    args = [a for a in getattr(exc, "args", ()) if isinstance(a, str) and a]
    text = getattr(exc, "msg", None) or (args[0] if args else str(exc)) or type(exc).__name__
    return " ".join(str(text).split())


def _clusters(loaded: Any) -> Iterable[tuple[str, Iterable[Any]]]:
    """A pyslurm.db.Jobs (cluster -> {id: job}) as (cluster, jobs)."""
    data = getattr(loaded, "data", None)
    if isinstance(data, dict):
        return [(cluster, list(jobs.values())) for cluster, jobs in data.items()]
    return [("", list(loaded.values()))]


def comments_by_sacct(ids: list[int], field: str, cluster: str,
                      sacct: str = "sacct") -> dict[tuple[str, int], str]:
    """The comment field of these jobs through `sacct -X` (where pyslurm cannot load them)."""
    out: dict[tuple[str, int], str] = {}
    fields = ("Cluster", "JobIDRaw", field)
    for at in range(0, len(ids), 2000):  # an argument of at most 128 KiB
        delimiter = fresh_delimiter()
        done = run_slurm([sacct, "-j", ",".join(str(i) for i in ids[at:at + 2000]), "-X", "-P", "-n",
                          f"--delimiter={delimiter}", "--format=" + ",".join(fields)], 60)
        if done.returncode != 0:
            raise SlurmError(f"sacct failed: {said(done)}")
        rows = parse_rows(done.stdout.decode("utf-8", "replace"), delimiter, fields)
        out.update({(r["Cluster"] or cluster, int(r["JobIDRaw"])): r[field]
                    for r in rows if r["JobIDRaw"].isdigit()})
    return out


def sacct_order(record: dict[str, Any]) -> tuple[int, int, int, int]:
    """The order sacct prints allocations in (seen on 22.05): by submit time, then job id,
    an array's tasks by the array's id and task id (those still pending last)."""
    array = int(record.get("array_job_id") or 0)
    task = _u32(record.get("array_task_id")) if array else None
    return (int(record.get("submit") or 0), array or int(record["jobid"]),
            task if task is not None else 1 << 32, int(record["jobid"]))


def job_names(job_id: str, records: list[dict[str, Any]]) -> dict[int, str]:
    """Each record's JobID as sacct shows it: 1234_7 for an array task, 1234_[5-9] for the
    tasks still pending, 1234+1 for a heterogeneous component, else the id. The database's
    records carry no heterogeneous job id or offset through pyslurm: those are the records
    the id asked for brought that are neither it nor its array's tasks, numbered from the
    asked id (Slurm gives a heterogeneous job's components consecutive ids)."""
    base = int(re.split(r"[_+]", job_id)[0])
    offset = int(job_id.split("+")[1]) if "+" in job_id else None
    names: dict[int, str] = {}
    het = []
    for record in records:
        raw = int(record["jobid"])
        array, task = _u32(record.get("array_job_id")), _u32(record.get("array_task_id"))
        waiting = (record.get("array_task_str") or "").split("%")[0]
        if array and task is not None:
            names[raw] = f"{array}_{task}"
        elif array and waiting:
            names[raw] = f"{array}_[{waiting}]"
        else:
            names[raw] = str(raw)
            het.append(raw)
    if offset is not None and len(het) == 1:
        names[het[0]] = f"{base}+{offset}"
    elif offset is None and len(het) > 1 and base in het:
        for raw in het:
            names[raw] = f"{base}+{raw - base}"
    return names


def job_row(record: dict[str, Any], shown: str) -> dict[str, str]:
    """An allocation's row as `sacct -P --format=FIELDS` prints it (AdminComment blank)."""
    alloc, req = record.get("tres_alloc_str") or "", record.get("tres_req_str") or ""
    cpus = tres_count(alloc, TRES_CPU)
    nodes = tres_count(alloc, TRES_NODE)
    if nodes is None:
        nodes = tres_count(req, TRES_NODE)
    mem = tres_count(req, TRES_MEM)
    limit = _u32(record.get("timelimit"), keep_infinite=True)
    row = {
        "JobID": shown, "JobName": record.get("jobname") or "", "JobIDRaw": str(record["jobid"]),
        "Cluster": record.get("cluster") or "", "User": record.get("user") or _user(record.get("uid")),
        "Account": record.get("account") or "", "Partition": record.get("partition") or "",
        "State": record.get("state_str") or "", "ExitCode": exit_code(record.get("exitcode")),
        "ElapsedRaw": str(int(record.get("elapsed") or 0)),
        "TimelimitRaw": ("UNLIMITED" if limit == INFINITE else "Partition_Limit" if limit is None
                         else str(limit)),
        "Start": time_text(record.get("start")), "End": time_text(record.get("end")),
        "NCPUS": str(cpus if cpus is not None else int(record.get("req_cpus") or 0)),
        "NNodes": str(nodes if nodes is not None else int(record.get("alloc_nodes") or 0)),
        "NodeList": record.get("nodes") or "",
        "TotalCPU": cpu_time(*job_cpu(record)),
        "ReqMem": f"{mem}M" if mem is not None else "",
        "MaxRSS": "", "NTasks": "", "AdminComment": "",
    }
    return row


def step_rows(job: dict[str, str], record: dict[str, Any]) -> list[dict[str, str]]:
    """The job's steps as sacct's step rows: what job_from_rows reads of them (JobID,
    MaxRSS, NTasks), the rest blank."""
    rows = []
    steps = record.get("steps") or {}
    for step_id, step in steps.items():  # slurmdbd's order, which sacct prints
        name = STEP_NAMES.get(int(step_id), str(step_id))
        rss = tres_count((step.get("stats") or {}).get("tres_usage_in_max") or "", TRES_MEM)
        row = dict.fromkeys(FIELDS, "")
        row.update({"JobID": f"{job['JobID']}.{name}", "JobIDRaw": f"{job['JobIDRaw']}.{name}",
                     "Cluster": job["Cluster"], "MaxRSS": str(rss) if rss is not None else "",
                     "NTasks": str(step.get("ntasks") or "")})
        rows.append(row)
    return rows


def tres_count(simple: str, tres_id: int) -> int | None:
    """The count of TRES id in a database TRES string ('1=4,2=4000,4=1'); None if absent."""
    for part in simple.split(","):
        key, _, value = part.partition("=")
        if key.strip() == str(tres_id) and value.strip().isdigit():
            count = int(value)
            return None if count in (NO_VAL64, NO_VAL64 + 1) else count
    return None


def alloc_tres_text(simple: str, names: dict[int, str]) -> str:
    """sacct's AllocTRES: name=count sorted by name (as seen on 22.05), memory in M (G, T
    when exact), what is not counted left out."""
    out: list[tuple[str, str]] = []
    for part in simple.split(","):
        key, _, value = part.partition("=")
        if not key.strip().isdigit() or not value.strip().isdigit():
            continue
        name = names.get(int(key))
        if name is None:
            continue
        count = int(value)
        if count >= NO_VAL64:  # not counted (energy without a plugin)
            continue
        out.append((name, _mega(count) if int(key) == TRES_MEM or name.startswith("bb/") else str(count)))
    return ",".join(f"{name}={count}" for name, count in sorted(out))


def _mega(count: int) -> str:
    """Megabytes as Slurm writes them exactly (convert_num_unit, CONVERT_NUM_UNIT_EXACT)."""
    units = "MGTPE"
    at = 0
    while count and count % 1024 == 0 and at < len(units) - 1:
        count //= 1024
        at += 1
    return f"{count}{units[at]}"


def job_cpu(record: dict[str, Any]) -> tuple[int, int]:
    """The job's CPU time as sacct adds it up (sacct.c): onto the job record's own (0 from
    slurmdbd), the seconds and microseconds of each step that has ended (a step's state
    below JOB_COMPLETE, pending, running or suspended, is left out)."""
    sec, usec = _count(record.get("tot_cpu_sec")), _count(record.get("tot_cpu_usec"))
    for step in (record.get("steps") or {}).values():
        if int(step.get("state") or 0) < JOB_COMPLETE:
            continue
        sec += _count(step.get("tot_cpu_sec"))
        usec += _count(step.get("tot_cpu_usec"))
    return sec, usec


def _count(value: Any) -> int:
    return 0 if value is None or int(value) >= NO_VAL64 else int(value)


def cpu_time(sec: Any, usec: Any) -> str:
    """sacct's TotalCPU from the database's seconds and microseconds, in seconds: sacct keeps
    the milliseconds only under an hour (MM:SS.mmm; HH:MM:SS and D-HH:MM:SS drop them)."""
    seconds = int(sec or 0) if sec not in (None, NO_VAL64) else 0
    micro = int(usec or 0) if usec not in (None, NO_VAL64) else 0
    seconds += micro // 1_000_000
    millis = (micro % 1_000_000) // 1000
    return str(seconds) if seconds >= 3600 else f"{seconds}.{millis:03d}"


def exit_code(code: Any) -> str:
    """sacct's ExitCode 'status:signal' from the wait(2)-style value."""
    if code is None or int(code) == NO_VAL:
        return "0:0"
    code = int(code)
    signal = code & 0x7F if (code & 0x7F) not in (0, 0x7F) else 0
    status = (code >> 8) & 0xFF
    return f"{status - 128 if status >= 128 else status}:{signal}"


def time_text(at: Any) -> str:
    """sacct's Start/End: local ISO time (or SLURM_TIME_FORMAT's), Unknown for none."""
    if not at or int(at) in (INFINITE, NO_VAL):
        return "Unknown"
    form = os.environ.get("SLURM_TIME_FORMAT", "standard")
    if form in ("", "standard", "relative"):
        form = "%Y-%m-%dT%H:%M:%S"
    return time.strftime(form, time.localtime(int(at)))


def job_now(record: dict[str, Any]) -> RunningJob:
    """A slurmctld job record (pyslurm's older job dict) as squeue's row (RunningJob)."""
    raw = str(record["job_id"])
    task_id = own_id(raw, record.get("array_job_id"), record.get("array_task_id"),
                     record.get("het_job_id"), record.get("het_job_offset"))
    start = record.get("start_time")
    limit = record.get("time_limit")
    return RunningJob(
        job_id=raw, name=record.get("name") or "", user=_user(record.get("user_id")),
        account=record.get("account") or "", partition=record.get("partition") or "",
        state=record.get("job_state") or "", batch=record.get("batch_flag") == 1,
        comment=record.get("comment") or "",
        time_limit=duration(int(limit) * 60) if isinstance(limit, int) else str(limit or ""),
        run_time=duration(int(record.get("run_time") or 0)), nodes=record.get("nodes") or "",
        tres=record.get("tres_alloc_str") or "", task_id=task_id if is_job_id(task_id) else "",
        start_at=float(start) if start else None,
    )


def own_id(raw: str, array: Any, task: Any, het: Any, offset: Any) -> str:
    """The id naming an array task or heterogeneous component alone (squeue's %i: 1234_7,
    1234+1), else the job's raw id; "" for an array's tasks still pending (1234_[5-9])."""
    if array and task is not None:
        return f"{array}_{task}"
    if het:
        return f"{het}+{offset or 0}"
    return "" if array else raw


def job_now_newer(job: Any) -> RunningJob:
    """A slurmctld job as pyslurm's newer API (`pyslurm.Job`, 23.x and later) gives it, as
    squeue's row. That API has no allocated TRES string: `tres` is put together from the
    parts it has, in Slurm's own form, and names a GPU count only where the job asked per
    node (--gres, --gpus-per-node); a request per job (--gpus=N) leaves gres/gpu out."""
    raw = str(job.id)
    task_id = own_id(raw, job.array_id, job.array_task_id, job.heterogeneous_id, job.heterogeneous_offset)
    limit = job.time_limit
    return RunningJob(
        job_id=raw, name=job.name or "", user=job.user_name or "", account=job.account or "",
        partition=job.partition or "", state=job.state or "", batch=bool(job.is_batch_job),
        comment=job.comment or "",
        time_limit=duration(int(limit) * 60) if isinstance(limit, int) else "UNLIMITED",
        run_time=duration(int(job.run_time or 0)), nodes=job.allocated_nodes or "",
        tres=tres_text(job), task_id=task_id if is_job_id(task_id) else "",
        start_at=float(job.start_time) if job.start_time else None,
    )


def tres_text(job: Any) -> str:
    """cpu=3,mem=3000M,node=1,billing=3,gres/gpu=2 as squeue's tres-alloc writes it."""
    parts = [f"cpu={job.cpus}"]
    if job.memory:
        parts.append(f"mem={_mega(int(job.memory))}")
    parts.append(f"node={job.num_nodes}")
    if job.billable_tres:
        parts.append(f"billing={int(job.billable_tres)}")
    per_node = (job.gres_per_node or {}).get("gres/gpu")
    if isinstance(per_node, int) and job.num_nodes:
        parts.append(f"gres/gpu={per_node * int(job.num_nodes)}")
    return ",".join(parts)


def duration(seconds: int) -> str:
    """squeue's TimeUsed and TimeLimit (Slurm's secs2time_str): D-HH:MM:SS, H:MM:SS, M:SS."""
    if seconds < 0:
        return "INVALID"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _u32(value: Any, keep_infinite: bool = False) -> int | None:
    if value is None:
        return None
    value = int(value)
    if value == NO_VAL or (value == INFINITE and not keep_infinite):
        return None
    return value


def _user(uid: Any) -> str:
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError):
        return str(uid)
