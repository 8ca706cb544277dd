"""What slurmctld asks of its MailProg: `MAILPROG -s SUBJECT RECIPIENT`, run as SlurmUser
with the job's SLURM_* variables (Slurm 21.08 and later) and stdin on /dev/null.

The environment is read first; the subject only where a variable is missing (an older
Slurm, or a site's wrapper that passes the subject alone). Facts and sources:
docs/notes/2026-11-23-issue-11-research.md (Slurm 22.05's agent.c, job_mgr.c).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import UsageError

# SLURM_JOB_MAIL_TYPE as agent.c's _mail_type_str writes it
BEGAN, ENDED, FAILED = "Began", "Ended", "Failed"
TIME_LIMIT = "Reached time limit"
# The mails sent when a job is over: the report goes with them. (END is only sent for a
# COMPLETED or CANCELLED job, FAIL for the failed states, TIMEOUT included; the time
# limit's own mail comes as the job is killed.)
END_TYPES = (ENDED, FAILED, TIME_LIMIT)
_TYPES = (BEGAN, ENDED, FAILED, "Requeued", "StageOut/Teardown", "Invalid dependency", TIME_LIMIT,
          "Reached 90% of time limit", "Reached 80% of time limit", "Reached 50% of time limit")

# "Slurm Job_id=327 Name=x Ended, Run time 00:05:01, COMPLETED, ExitCode 0"
# "Slurm Array Task Job_id=123_4 (127) Name=x Ended, ..."
# "Slurm Array Summary Job_id=123_* (123) Name=x Ended, Mixed, ExitCode [0-1]"
_SUBJECT = re.compile(r"^(?:Slurm|SLURM) (?:Array (?P<kind>Summary|Task) )?Job_id=(?P<id>\d+)"
                      r"(?:_(?P<task>\d+|\*))?(?: \((?P<raw>\d+)\))? Name=(?P<rest>.*)$", re.S)
_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
           "DEADLINE", "OUT_OF_MEMORY", "Mixed")


@dataclass(frozen=True)
class Notice:
    """One mail slurmctld wants sent."""

    subject: str  # Slurm's, as given (kept in the mail's subject, made header-safe)
    recipient: str  # the job's --mail-user, or its user (@MailDomain)
    job_id: str  # what `gpueff JOBID` takes: 327, 123_4, or 123 for an array's summary
    mail_type: str  # Began, Ended, Failed, ... ("" when neither the env nor the subject says)
    state: str  # COMPLETED, TIMEOUT, ... ("" when not said)
    user: str  # the job's user ("" when not said: an old Slurm's subject alone)
    cluster: str
    name: str  # the job's name as Slurm gave it (the user's text: never trusted)

    @property
    def at_end(self) -> bool:
        return self.mail_type in END_TYPES


def parse_args(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`-s SUBJECT RECIPIENT...` as mail(1) takes it; other options of mail(1) are let be."""
    subject, i = "", 0
    recipients: list[str] = []
    while i < len(argv):
        arg = argv[i]
        if arg == "-s" and i + 1 < len(argv):
            subject, i = argv[i + 1], i + 2
            continue
        if arg.startswith("-s") and len(arg) > 2:
            subject = arg[2:]
        elif arg == "--":
            recipients += argv[i + 1:]
            break
        elif not arg.startswith("-"):
            recipients.append(arg)
        i += 1
    if not recipients:
        raise UsageError("usage: gpueff-mail -s SUBJECT RECIPIENT (as Slurm's MailProg)")
    return subject, recipients


def read_notice(subject: str, recipient: str, env: Mapping[str, str]) -> Notice:
    """The notice from slurmctld's environment, the subject filling what it lacks."""
    match = _SUBJECT.match(subject)
    fields = match.groupdict() if match else {}
    rest = fields.get("rest") or ""
    job_id = _job_id(env, fields)
    mail_type = env.get("SLURM_JOB_MAIL_TYPE", "") or _type_in(rest)
    state = env.get("SLURM_JOB_STATE", "") if mail_type in (ENDED, FAILED) else ""
    if mail_type in (ENDED, FAILED) and not state:
        state = next((s for s in _STATES if f", {s}" in rest), "")
    return Notice(subject=subject, recipient=recipient, job_id=job_id, mail_type=mail_type, state=state,
                  user=env.get("SLURM_JOB_USER", ""), cluster=env.get("SLURM_CLUSTER_NAME", ""),
                  name=env.get("SLURM_JOB_NAME", "") or _name_in(rest, mail_type))


def _job_id(env: Mapping[str, str], fields: dict[str, str | None]) -> str:
    if fields.get("kind") == "Summary":  # the whole array: its id (env describes one task)
        return str(fields["id"])
    if fields.get("kind") == "Task" and fields.get("task"):
        return f"{fields['id']}_{fields['task']}"
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array.isdigit() and task.isdigit() and not fields:
        return f"{array}_{task}"
    for value in (env.get("SLURM_JOB_ID", ""), fields.get("id") or ""):
        if value.isdigit():
            return value
    raise UsageError("no job id in the environment (SLURM_JOB_ID) nor in the subject")


def _type_in(rest: str) -> str:
    """The mail type after the job's name (which may hold anything, spaces and commas too):
    the last of the known words that the subject carries."""
    found = [(rest.rfind(f" {t}"), t) for t in _TYPES if f" {t}" in rest]
    return max(found)[1] if found else ""


def _name_in(rest: str, mail_type: str) -> str:
    cut = rest.rfind(f" {mail_type}") if mail_type else -1
    return rest[:cut] if cut >= 0 else rest
