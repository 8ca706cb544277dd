"""Idle-GPU alerts on running jobs: what `gpueff-mail --watch` does every `idle_check_s`.

The nodes' samplers say in every live copy of a running job which of its GPUs are idle
now and since when (`GpuSummary.idle_now`), and post a copy at once when such a stretch
passes the alert or the cancel minute; the copies reach the store as every summary does.
Here, on the host with the mail spool: the running jobs with a GPU idle past the alert
minute are read from the store, Slurm is asked about each (still running? exempt? who
gets the mail?), its user is mailed once, and, where the site cancels, the job is
cancelled `idle_cancel_min` minutes after the alert reached the mail server if the GPU
is still idle, the reason in its AdminComment (sacct shows it). The nodes never call
Slurm for this.

What was done for each job run is kept in the mail spool's `idle/`, one file a run:
nothing is done twice whatever restarts, and the job-end mail reads it to say the job
was cancelled and why.

A cancel is the worst thing this can do to a user, so the watch acts only on evidence
that cannot be another job's or a misreading (issue 20): only its own cluster's rows of
a shared store; only a job squeue shows as the store's run (same user, the store's nodes
among its own, started when the run's prolog ran); never where the sampler could not
verify, on every node, that the GPUs it read are the job's (the admins are told in the
mail log instead); the cancel minutes count from the alert's delivery, and an alert that
never went out cancels nothing; one job's error stops no other job's check.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, replace
from email.message import EmailMessage
from typing import Any

from ..config import Config
from ..errors import GpuEffError, SpoolError
from ..hostlist import expand_hostlist
from ..model import IDLE_UTIL, RUNNING, NodeSummary
from ..node.verify import GPU_USE_NONE, UNVERIFIED, VERIFIED
from ..report.render import render_idle
from ..slurm.base import Slurm
from ..slurm.records import RunningJob
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
    seconds: float  # its measured length when the node last reported


@dataclass(frozen=True)
class IdleJob:
    cluster: str
    job_id: str
    run: int  # when its prolog ran: a requeued job is alerted anew
    gpus: list[IdleGpu]  # those idle past the alert minute, longest first
    gpu_count: int  # the job's GPUs on the nodes that reported
    user: str = ""  # the run's owner as its nodes' prologs saw it ("": they disagree)
    nodes: tuple[str, ...] = ()  # the nodes that reported this run
    started: float = 0.0  # its first prolog (epoch seconds)
    binding: tuple[tuple[str, str, str], ...] = ()  # per node: (node, status, first evidence)
    sampled_until: float = 0.0  # the oldest of its nodes' copies: how recent what it says is

    @property
    def key(self) -> str:
        return safe_name(f"{self.cluster}-{self.job_id}-{self.run}")

    @property
    def longest_s(self) -> float:
        return self.gpus[0].seconds


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
# This cluster's only: one store may hold several clusters, whose job ids overlap ours.
_RUNNING = """
SELECT body FROM node_summaries
WHERE (cluster, job_id, node, run) IN (
    SELECT cluster, job_id, node, run FROM gpus
    WHERE sampled_until >= :fresh AND status = :running AND cluster = :cluster)
"""


FRESH_SLACK_S = 30  # a copy older than live_s + idle_check_s + this cancels nothing
RUN_SPREAD_S = 60  # one run's nodes start within this of each other; a requeue, later


def idle_jobs(store: Store, fresh: float, alert_s: float, cluster: str) -> list[IdleJob]:
    """The cluster's running jobs (copies sampled since `fresh`) with a GPU idle for
    alert_s or more: one a job, its current run (its nodes' copies; the copies of an
    earlier run are not it: a requeued job is another run, alerted anew)."""
    by_job: dict[str, list[NodeSummary]] = {}
    for row in store.read(_RUNNING, {"fresh": fresh, "running": RUNNING, "cluster": cluster}):
        try:
            summary = NodeSummary.from_json(row["body"])
        except SpoolError as exc:  # one bad row must not stop the alerts of all
            log.error("idle check: a running summary the store holds cannot be read: %s", exc)
            continue
        by_job.setdefault(summary.job_id, []).append(summary)
    found = []
    for job_id, copies in sorted(by_job.items()):
        try:  # a copy malformed past from_dict's checks is this job's trouble alone
            job = _job_of_copies(cluster, job_id, copies, alert_s)
        except Exception as exc:  # whatever its figures hold (10**400 s idle: OverflowError)
            log.error("idle check: job %s's running summary cannot be read: %s: %s",
                      job_id, type(exc).__name__, exc)
            continue
        if job is not None:
            found.append(job)
    return found


def _job_of_copies(cluster: str, job_id: str, copies: list[NodeSummary], alert_s: float) -> IdleJob | None:
    latest = max(s.run_started_at or 0.0 for s in copies)
    nodes = [s for s in copies if (s.run_started_at or 0.0) > latest - RUN_SPREAD_S]
    idle = [IdleGpu(g.node, g.index, g.minor, float(g.idle_now["since"]), float(g.idle_now["seconds"]))
            for s in nodes for g in s.gpus
            if g.idle_now and float(g.idle_now.get("seconds", 0)) >= alert_s]
    if not idle:
        return None
    idle.sort(key=lambda g: -g.seconds)
    return _idle_job(cluster, job_id, nodes, idle)


def _idle_job(cluster: str, job_id: str, nodes: list[NodeSummary], idle: list[IdleGpu]) -> IdleJob:
    started = min(s.run_started_at or 0.0 for s in nodes)
    users = {s.user for s in nodes}
    binding = tuple((s.node, binding_status(s.binding or {}),
                     str(((s.binding or {}).get("evidence") or [""])[0])[:200]) for s in nodes)
    return IdleJob(cluster, job_id, int(started), idle, sum(len(s.gpus) for s in nodes),
                   user=users.pop() if len(users) == 1 else "", nodes=tuple(sorted(s.node for s in nodes)),
                   started=started, binding=binding,
                   sampled_until=min(s.sampled_until or 0.0 for s in nodes))


# -- is it the run the store holds, and are its figures the job's own? -----------------------------

# The run's first prolog against slurmctld's start: squeue's is whole seconds and the
# nodes' clocks may be a little off (EARLY_S); the prolog runs after the allocation,
# later on a loaded node, or at the first step without PrologFlags=Alloc (LATE_S). A
# requeued run starts long after its stretch began, far outside this.
EARLY_S, LATE_S = 2.0, 30.0


def not_this_run(job: IdleJob, now: RunningJob) -> str | None:
    """Why the job squeue shows is not the run the store holds (None: it is)."""
    if not job.user or now.user != job.user:
        return f"squeue's job {job.job_id} belongs to {now.user!r}, the store's run to {job.user!r}"
    missing = sorted(set(job.nodes) - set(expand_hostlist(now.nodes)))
    if missing:
        return f"squeue's job {job.job_id} runs on {now.nodes!r}, not on {', '.join(missing)}"
    if now.start_at is None:
        return f"squeue gave no start time for job {job.job_id}"
    if not -EARLY_S <= job.started - now.start_at <= LATE_S:
        return (f"squeue's job {job.job_id} started at {_clock(now.start_at)}, the store's run "
                f"at {_clock(job.started)}")
    if not now.task_id:
        return f"squeue gave no id for job {job.job_id}'s own task"
    return None


UNUSED = "unverified, no GPU used"  # no process of the job on any GPU of the node (verify.py)


def binding_status(binding: dict[str, Any]) -> str:
    """A node's binding as the watch weighs it. An unverified one whose every look at the
    node's GPUs found none of the job's processes is no doubt: the job used no GPU there,
    whichever GPUs are its own (on cgroup v2 a job that never opens its GPU stays
    unverified, and is the commonest idle job of all)."""
    status = str(binding.get("status") or "not checked")
    return UNUSED if status == UNVERIFIED and binding.get("gpu_use") == GPU_USE_NONE else status


def binding_doubt(job: IdleJob) -> str | None:
    """Why the GPUs read idle may not be the ones the job uses (None: each node's sampler
    verified its binding): a lying gres map makes a busy job's GPU read idle."""
    doubts = [f"{status} on {node}" + (f" ({evidence})" if evidence else "")
              for node, status, evidence in job.binding if status not in (VERIFIED, UNUSED)]
    return "; ".join(doubts) or None


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))


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


def check(config: Config, store: Store, slurm: Slurm, box: Outbox, now: float) -> list[str]:
    """One look at this cluster's running jobs; what was done (for the log), messages in
    the outbox. Raises SlurmError when Slurm cannot say which cluster this is: then no job
    is acted on."""
    policy = Policy.from_config(config)
    if not policy.on:
        return []
    ledger = Ledger(box).make()
    with ledger.turn() as mine:
        if not mine:
            return []
        ledger.prune(now - KEEP_S)
        box.prune_receipts(now - KEEP_S)
        cluster = slurm.cluster()
        # a live copy is live_s old at most, plus its delivery: older, its sampler is gone
        fresh = now - max(3 * config.live_s + 60, 2 * config.idle_check_s)
        return [done for job in idle_jobs(store, fresh, policy.alert_s, cluster)
                for done in [_act_alone(job, policy, config, slurm, box, ledger, now)] if done]


def _act_alone(job: IdleJob, policy: Policy, config: Config, slurm: Slurm, box: Outbox,
               ledger: Ledger, now: float) -> str:
    """_act, whose failure is this job's alone: logged, and the other jobs are checked."""
    try:
        return _act(job, policy, config, slurm, box, ledger, now)
    except GpuEffError as exc:  # Slurm or the spool away: the next pass tries again
        log.error("job %s: idle check failed: %s", job.job_id, exc)
    except Exception:  # a bug: said in full, and still only this job's
        log.exception("job %s: idle check failed", job.job_id)
    return ""


def _act(job: IdleJob, policy: Policy, config: Config, slurm: Slurm, box: Outbox,
         ledger: Ledger, now: float) -> str:
    record = ledger.get(job.key)
    if record.get("broken") or record.get("cancelled_at") or record.get("cancel_error"):
        return ""
    if record.get("alerted_at") is not None:
        record = _delivery(job, record, box, ledger)
        if _stretch_ended(job, record):
            _tell_once(ledger, job, record, ("stretch_ended", "yes"), logging.WARNING,
                       f"job {job.job_id}: the idle stretch alerted at {_clock(float(record['alerted_at']))} "
                       "ended (the GPU worked, or the readings had a gap): this run is not cancelled")
            return ""
        if not _cancel_due(job, record, policy, now):
            return ""
        if now - job.sampled_until > config.live_s + config.idle_check_s + FRESH_SLACK_S:
            return ""  # no cancel on an old copy: the GPU may have worked since (the next pass)
    facts = slurm.running_job(job.job_id)
    if facts is None or facts.state != "RUNNING":  # ended, or suspended: not idle by its own doing
        return ""
    other = not_this_run(job, facts)
    if other is not None:
        _tell_once(ledger, job, record, ("not_this_run", other), logging.WARNING,
                   f"job {job.job_id}: left alone: {other}")
        return ""
    why = policy.exempt(facts)
    if why is not None:
        if record.get("exempt") != why:
            ledger.put(job.key, {**record, "exempt": why})
            return f"job {job.job_id}: GPU idle, no alert: {why}"
        return ""
    doubt = binding_doubt(job)
    if doubt is not None:
        _tell_once(ledger, job, record, ("binding", doubt), logging.ERROR, _doubt_note(job, facts, doubt))
        return ""
    if record.get("alerted_at") is None:
        return _alert(job, policy, config, facts, box, ledger, record, now)
    return _cancel(job, policy, config, slurm, facts, box, ledger, record, now)


def _alert(job: IdleJob, policy: Policy, config: Config, facts: RunningJob, box: Outbox, ledger: Ledger,
           record: dict[str, Any], now: float) -> str:
    # recorded first: an alert is never sent twice, whatever happens next
    ledger.put(job.key, {**record, "alerted_at": now, "gpus": [g.__dict__ for g in job.gpus]})
    if not _mail(box, config, facts, "alert", job, policy, now):
        ledger.put(job.key, {**record, "alerted_at": now, "alert_lost": "the alert could not be made"})
    return f"job {job.job_id}: alerted {facts.user} (GPU idle {job.longest_s / 60:.1f} min)"


def _cancel(job: IdleJob, policy: Policy, config: Config, slurm: Slurm, facts: RunningJob, box: Outbox,
            ledger: Ledger, record: dict[str, Any], now: float) -> str:
    reason = cancel_reason(job)
    # recorded first: the job's end mail may be made before this call returns
    ledger.put(job.key, {**record, "cancelled_at": now, "reason": reason})
    try:
        # by the task's own id: an array's (or a heterogeneous job's) id would end them all
        slurm.cancel(facts.task_id, job.cluster, reason)
    except Exception as exc:  # said once, in the log and the record: never tried in a loop
        ledger.put(job.key, {**record, "cancel_error": str(exc)})
        log.error("job %s: could not cancel: %s", job.job_id, exc)
        return f"job {job.job_id}: cancelling failed: {exc}"
    _mail(box, config, facts, "cancel", job, policy, now)
    return f"job {job.job_id}: cancelled ({reason})"


def _tell_once(ledger: Ledger, job: IdleJob, record: dict[str, Any], said: tuple[str, str], level: int,
               note: str) -> None:
    """The admins' note, in the mail log once a job run while `said` (key, what) stays the
    same (the check comes back every pass, the idle minutes in the note grow)."""
    key, what = said
    if record.get(key) != what:
        ledger.put(job.key, {**record, key: what})
        log.log(level, "%s", note)


def _doubt_note(job: IdleJob, facts: RunningJob, doubt: str) -> str:
    g = job.gpus[0]
    return (f"job {job.job_id} ({facts.user}): GPU {g.index} on {g.node} reads idle for {span(g.seconds)}, "
            f"but the sampler could not verify that the GPUs it read are the job's: {doubt}. Neither "
            f"alerted nor cancelled; check the node's gres.conf against its devices (`gpueff "
            f"{job.job_id} --json`, binding)")


def _delivery(job: IdleJob, record: dict[str, Any], box: Outbox, ledger: Ledger) -> dict[str, Any]:
    """The record with when the alert reached the mail server (`delivered_at`), or why it
    never will (`alert_lost`, said once): the cancel minutes count from the delivery."""
    if record.get("delivered_at") is not None or record.get("alert_lost"):
        return record
    name = alert_name(job)
    waiting = box.holds(name)  # first: a send between the two looks leaves its receipt
    sent_at = box.receipt(name)
    if sent_at is not None:
        record = {**record, "delivered_at": sent_at}
    elif waiting:
        return record
    else:
        why = ("never delivered (given up: the spool's failed/)" if box.given_up(name) else
               "not known to be delivered (not in the outbox, no receipt: never made, or sent by a "
               "version that kept none)")
        record = {**record, "alert_lost": why}
        log.error("job %s: the idle alert was %s: the job will not be cancelled", job.job_id, why)
    ledger.put(job.key, record)
    return record


def _cancel_due(job: IdleJob, record: dict[str, Any], policy: Policy, now: float) -> bool:
    delivered = record.get("delivered_at")
    return (policy.cancel_s > 0 and delivered is not None and now - float(delivered) >= policy.cancel_s
            and _still(job, record.get("gpus") or [], policy.alert_s + policy.cancel_s))


def _stretch_ended(job: IdleJob, record: dict[str, Any]) -> bool:
    """No GPU the alert named is in the stretch it was about any more."""
    named = {(g.get("node"), g.get("index")): float(g.get("since", 0.0)) for g in record.get("gpus") or []}
    return bool(named) and not any(abs(named.get((g.node, g.index), -1e18) - g.since) < 1.0 for g in job.gpus)


def _still(job: IdleJob, alerted: list[dict[str, Any]], cancel_at_s: float) -> bool:
    """A GPU the alert named is still in the stretch the alert was about (it began when
    that one did: a GPU that worked since began a new one), long enough to cancel."""
    named = {(g.get("node"), g.get("index")): float(g.get("since", 0.0)) for g in alerted}
    return any(abs(named.get((g.node, g.index), -1e18) - g.since) < 1.0 and g.seconds >= cancel_at_s
               for g in job.gpus)


def alert_name(job: IdleJob) -> str:
    """The alert's name in the outbox (and its receipt's)."""
    return f"idle-alert-{job.key}"


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
          now: float) -> bool:
    """The message into the outbox (the alert with a receipt: the cancel clock's start)."""
    try:
        message, to = idle_message(config, facts, kind, job, policy, now)
        box.post(message, to, now, job=job.job_id, name=f"idle-{kind}-{job.key}", receipt=kind == "alert")
    except (OSError, ValueError) as exc:  # the record says it was done: logged, never sent twice
        log.error("job %s: the idle %s mail was not made: %s", job.job_id, kind, exc)
        return False
    return True


def idle_message(config: Config, facts: RunningJob, kind: str, job: IdleJob, policy: Policy,
                 now: float) -> tuple[EmailMessage, list[str]]:
    # The job's owner (at [mail] domain, as Slurm's MailDomain). Not its --mail-user:
    # nothing of Slurm 22.05's tells it apart from what the user wrote in the job's comment
    # or paths (scontrol prints it only with a mail type, after fields users write), so it
    # would let a user send the alert anywhere.
    to = recipients(facts.user, config.mail_domain)
    # The user's own name for the task (1234_7) in the subject and the commands the mail
    # gives: `scancel 1234` would end every task of the array.
    facts = replace(facts, job_id=facts.task_id or facts.job_id)
    if kind == "alert":
        subject = (f"Slurm Job_id={facts.job_id} Name={facts.name}: {len(job.gpus)} of {job.gpu_count} "
                   f"GPUs idle for {span(job.longest_s)}")
    else:
        subject = (f"Slurm Job_id={facts.job_id} Name={facts.name} cancelled: GPU idle for "
                   f"{span(job.longest_s)}")
    message = new_message(sender(config.mail_from), to, subject)
    message.set_content(render_idle(kind, {
        "job": facts, "idle": job, "policy": policy, "now": now, "footer": config.mail_footer,
        "cancel_at": now + policy.cancel_s if policy.cancel_s else None, "idle_util": IDLE_UTIL,
        "span": span,
    }))
    return message, to
