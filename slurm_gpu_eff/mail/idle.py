"""Idle-GPU alerts on running jobs: what `gpueff-mail --watch` does every `idle_check_s`.

The nodes' samplers say in every live copy of a running job which of its GPUs are idle
now and since when (`GpuSummary.idle_now`), and post a copy at once when such a stretch
passes the alert or the cancel minute; the copies reach the store as every summary does.
Here, on the host with the mail spool: the running jobs with a GPU idle past the alert
minute are read from the store, Slurm is asked about each (still running? exempt? who
gets the mail?), its user is mailed once, and, where the site cancels, the job is
cancelled `idle_cancel_min` minutes after the alert if the GPU is still idle, the reason
in its AdminComment (sacct shows it). The nodes never call Slurm for this.

What was done for each job run is kept in the mail spool's `idle/`, one file a run:
nothing is done twice whatever restarts, and the job-end mail reads it to say the job
was cancelled and why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Protocol

from ..config import Config, find_command
from ..model import IDLE_UTIL, RUNNING, NodeSummary
from ..report.render import render_idle
from ..slurm import RunningJob, cancel_job, running_job
from ..store.base import Store
from .message import new_message, recipients, sender
from .outbox import Outbox, held_alone, safe_name, write_whole

log = logging.getLogger("gpueff.mail")
KEEP_S = 30 * 86400  # a job run's record: long enough for any job to end and be mailed


@dataclass(frozen=True)
class IdleGpu:
    node: str
    index: int
    minor: int | None
    since: float  # when the stretch began (the node's clock)
    seconds: float  # its length when the node last reported


@dataclass(frozen=True)
class IdleJob:
    cluster: str
    job_id: str
    run: int  # when its prolog ran: a requeued job is alerted anew
    gpus: list[IdleGpu]  # those idle past the alert minute, longest first
    gpu_count: int  # the job's GPUs on the nodes that reported

    @property
    def key(self) -> str:
        return safe_name(f"{self.cluster}-{self.job_id}-{self.run}")

    @property
    def longest_s(self) -> float:
        return self.gpus[0].seconds


class SlurmAccess(Protocol):
    def running_job(self, job_id: str) -> RunningJob | None: ...

    def cancel(self, job_id: str, cluster: str, reason: str) -> None: ...


class SlurmCommands:
    """SlurmAccess through Slurm's commands, as configured."""

    def __init__(self, config: Config) -> None:
        self.commands = {name: find_command(getattr(config, name))
                         for name in ("squeue", "scontrol", "scancel", "sacct", "sacctmgr")}

    def running_job(self, job_id: str) -> RunningJob | None:
        return running_job(job_id, self.commands["squeue"])

    def cancel(self, job_id: str, cluster: str, reason: str) -> None:
        cancel_job(job_id, cluster, reason, self.commands)


@dataclass(frozen=True)
class Policy:
    alert_s: float
    cancel_s: float  # 0: alerts only
    interactive: bool
    users: frozenset[str]
    accounts: frozenset[str]
    word: str

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        return cls(config.idle_alert_min * 60, config.idle_cancel_min * 60, config.idle_interactive,
                   _names(config.idle_exempt_users), _names(config.idle_exempt_accounts),
                   config.idle_opt_out_word.strip())

    @property
    def on(self) -> bool:
        return self.alert_s > 0

    def exempt(self, job: RunningJob) -> str | None:
        """Why the site's policy leaves this job alone; None: it applies."""
        if not job.batch and not self.interactive:
            return "an interactive job"
        if job.user in self.users:
            return f"user {job.user} is exempt"
        if job.account in self.accounts:
            return f"account {job.account} is exempt"
        if self.word and self.word in job.comment:
            return f"its comment holds {self.word!r}"
        return None


def _names(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.replace(" ", ",").split(",") if part.strip())


# -- what the store says ------------------------------------------------------------------------

# The running jobs' node copies, found through the GPU rows' index on sampled_until (the
# summaries' table has none on status: a scan of every job ever would grow without end).
_RUNNING = """
SELECT body FROM node_summaries
WHERE (cluster, job_id, node, run) IN (
    SELECT cluster, job_id, node, run FROM gpus WHERE sampled_until >= :fresh AND status = :running)
"""


RUN_SPREAD_S = 60  # one run's nodes start within this of each other; a requeue, later


def idle_jobs(store: Store, fresh: float, alert_s: float) -> list[IdleJob]:
    """Running jobs (copies sampled since `fresh`) with a GPU idle for alert_s or more:
    one a job, its current run (its nodes' copies; the copies of an earlier run are not
    it: a requeued job is another run, alerted anew)."""
    by_job: dict[tuple[str, str], list[NodeSummary]] = {}
    for row in store.read(_RUNNING, {"fresh": fresh, "running": RUNNING}):
        try:
            summary = NodeSummary.from_dict(json.loads(row["body"]))
        except (ValueError, TypeError) as exc:  # one bad row must not stop the alerts of all
            log.error("idle check: a running summary the store holds cannot be read: %s", exc)
            continue
        by_job.setdefault((summary.cluster, summary.job_id), []).append(summary)
    found = []
    for (cluster, job_id), copies in sorted(by_job.items()):
        latest = max(s.run_started_at or 0.0 for s in copies)
        nodes = [s for s in copies if (s.run_started_at or 0.0) > latest - RUN_SPREAD_S]
        idle = [IdleGpu(g.node, g.index, g.minor, float(g.idle_now["since"]), float(g.idle_now["seconds"]))
                for s in nodes for g in s.gpus
                if g.idle_now and float(g.idle_now.get("seconds", 0)) >= alert_s]
        if idle:
            idle.sort(key=lambda g: -g.seconds)
            run = int(min(s.run_started_at or 0.0 for s in nodes))
            found.append(IdleJob(cluster, job_id, run, idle, sum(len(s.gpus) for s in nodes)))
    return found


# -- what was done, per job run -----------------------------------------------------------------


class Ledger:
    """The mail spool's idle/: one JSON file a job run, written whole."""

    def __init__(self, box: Outbox) -> None:
        self.root = box.root / "idle"

    def make(self) -> Ledger:
        self.root.mkdir(mode=0o700, exist_ok=True)
        return self

    def get(self, key: str) -> dict[str, Any]:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # never acted on twice: a broken record stops it
            log.error("idle record %s unreadable (%s): the job is left alone", key, exc)
            return {"broken": True}
        return data if isinstance(data, dict) else {"broken": True}

    def put(self, key: str, record: dict[str, Any]) -> None:
        write_whole(self.root / f"{key}.json", json.dumps(record).encode())

    def cancelled(self, cluster: str, job_id: str) -> dict[str, Any] | None:
        """The record of the job's cancelling (any of its runs), if it was cancelled."""
        tail = re.compile(re.escape(safe_name(f"-{job_id}-")) + r"\d+$")
        head = safe_name(f"{cluster}-") if cluster else ""  # a MailProg told no cluster: any
        for path in sorted(self.root.glob("*.json"), reverse=True):
            if not (path.stem.startswith(head) and tail.search(path.stem)):
                continue
            record = self.get(path.stem)
            if record.get("cancelled_at"):
                return record
        return None

    def prune(self, before: float) -> None:
        """Records of runs long over: the end mail has read them, no check needs them."""
        for path in self.root.glob("*.json"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < before:
                    path.unlink()

    def turn(self) -> contextlib.AbstractContextManager[bool]:
        """One checker at a time (a --watch service and a hand-run --idle-check)."""
        return held_alone(self.root / ".lock")


# -- one pass ------------------------------------------------------------------------------------


def check(config: Config, store: Store, slurm: SlurmAccess, box: Outbox, now: float) -> list[str]:
    """One look at the running jobs; what was done (for the log), messages in the outbox."""
    policy = Policy.from_config(config)
    if not policy.on:
        return []
    ledger = Ledger(box).make()
    with ledger.turn() as mine:
        if not mine:
            return []
        ledger.prune(now - KEEP_S)
        # a live copy is live_s old at most, plus its delivery: older, its sampler is gone
        fresh = now - max(3 * config.live_s + 60, 2 * config.idle_check_s)
        return [done for job in idle_jobs(store, fresh, policy.alert_s)
                for done in [_act(job, policy, config, slurm, box, ledger, now)] if done]


def _act(job: IdleJob, policy: Policy, config: Config, slurm: SlurmAccess, box: Outbox,
         ledger: Ledger, now: float) -> str:
    record = ledger.get(job.key)
    if record.get("broken") or record.get("cancelled_at") or record.get("cancel_error"):
        return ""
    alerted = record.get("alerted_at")
    cancel_due = (policy.cancel_s > 0 and alerted is not None and now - float(alerted) >= policy.cancel_s
                  and _still(job, record.get("gpus") or [], policy.alert_s + policy.cancel_s))
    if alerted is not None and not cancel_due:
        return ""
    facts = slurm.running_job(job.job_id)
    if facts is None or facts.state != "RUNNING":  # ended, or suspended: not idle by its own doing
        return ""
    why = policy.exempt(facts)
    if why is not None:
        if record.get("exempt") != why:
            ledger.put(job.key, {**record, "exempt": why})
            return f"job {job.job_id}: GPU idle, no alert: {why}"
        return ""
    if not cancel_due:
        ledger.put(job.key, {**record, "alerted_at": now, "gpus": [g.__dict__ for g in job.gpus]})
        _mail(box, config, facts, "alert", job, policy, now)
        return f"job {job.job_id}: alerted {facts.user} (GPU idle {job.longest_s / 60:.1f} min)"
    reason = cancel_reason(job)
    # recorded first: the job's end mail may be made before this call returns
    ledger.put(job.key, {**record, "cancelled_at": now, "reason": reason})
    try:
        slurm.cancel(job.job_id, job.cluster, reason)
    except Exception as exc:  # said once, in the log and the record: never tried in a loop
        ledger.put(job.key, {**record, "cancel_error": str(exc)})
        log.error("job %s: could not cancel: %s", job.job_id, exc)
        return f"job {job.job_id}: cancelling failed: {exc}"
    _mail(box, config, facts, "cancel", job, policy, now)
    return f"job {job.job_id}: cancelled ({reason})"


def _still(job: IdleJob, alerted: list[dict[str, Any]], cancel_at_s: float) -> bool:
    """A GPU the alert named is still in the stretch the alert was about (it began when
    that one did: a GPU that worked since began a new one), long enough to cancel."""
    named = {(g.get("node"), g.get("index")): float(g.get("since", 0.0)) for g in alerted}
    return any(abs(named.get((g.node, g.index), -1e18) - g.since) < 1.0 and g.seconds >= cancel_at_s
               for g in job.gpus)


def cancelled_note(config: Config, cluster: str, job_id: str) -> str:
    """The job-end mail's line for a job this policy cancelled; "" for any other."""
    record = Ledger(Outbox(config.mail_spool_dir)).cancelled(cluster, job_id)
    if record is None:
        return ""
    return f"This job was {str(record.get('reason', '')).removeprefix('gpueff: ')}."


def span(seconds: float) -> str:
    """A stretch in the policy's unit, minutes (seconds under one: a test cluster's)."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.0f} min"


def cancel_reason(job: IdleJob) -> str:
    """One line, no quote (slurmdbd's SQL escaping turns ' into `)."""
    g = job.gpus[0]
    return (f"gpueff: cancelled by the idle-GPU policy: GPU {g.index} on {g.node} under "
            f"{IDLE_UTIL:g}% utilisation for {span(g.seconds)} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(g.since))}")


def _mail(box: Outbox, config: Config, facts: RunningJob, kind: str, job: IdleJob, policy: Policy,
          now: float) -> None:
    try:
        message, to = idle_message(config, facts, kind, job, policy, now)
        box.post(message, to, now, job=job.job_id, name=f"idle-{kind}-{job.key}")
    except (OSError, ValueError) as exc:  # the record says it was done: logged, never sent twice
        log.error("job %s: the idle %s mail was not made: %s", job.job_id, kind, exc)


def recipient(facts: RunningJob, domain: str) -> str:
    """The job's owner (at [mail] domain, as Slurm's MailDomain). Not its --mail-user:
    nothing of Slurm 22.05's tells it apart from what the user wrote in the job's comment
    or paths (scontrol prints it only with a mail type, after fields users write), so it
    would let a user send the alert anywhere."""
    return f"{facts.user}@{domain}" if domain else facts.user


def idle_message(config: Config, facts: RunningJob, kind: str, job: IdleJob, policy: Policy,
                 now: float) -> tuple[EmailMessage, list[str]]:
    to = recipients(recipient(facts, config.mail_domain))
    if kind == "alert":
        subject = (f"Slurm Job_id={job.job_id} Name={facts.name}: {len(job.gpus)} of {job.gpu_count} "
                   f"GPUs idle for {span(job.longest_s)}")
    else:
        subject = f"Slurm Job_id={job.job_id} Name={facts.name} cancelled: GPU idle for {span(job.longest_s)}"
    message = new_message(sender(config.mail_from), to, subject)
    message.set_content(render_idle(kind, {
        "job": facts, "idle": job, "policy": policy, "now": now, "footer": config.mail_footer,
        "cancel_at": now + policy.cancel_s if policy.cancel_s else None, "idle_util": IDLE_UTIL,
        "span": span,
    }))
    return message, to
