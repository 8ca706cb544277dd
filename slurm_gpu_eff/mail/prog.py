"""gpueff-mail: Slurm's MailProg (slurm.conf `MailProg=`), run by slurmctld as SlurmUser
with `-s SUBJECT RECIPIENT` and the job's SLURM_* variables.

It writes Slurm's request into the mail spool, starts a detached worker and returns to
Slurm at once (slurmctld kills a MailProg's process group after 120 s and never retries).
The worker makes the message: for the end of a GPU job, once its summary and accounting
are there (waiting at most `[mail] wait_s`), the report as text and HTML; for anything
else, or when the report cannot be made, Slurm's plain notification (saying why). Then
it sends it, and what the mail server does not take waits in the spool and is tried
again, the wait doubling, until `[mail] retry_for_s`. `gpueff-mail --flush` (cron, or
by hand) sends what is due and finishes requests a killed worker left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from email.message import EmailMessage
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Config, load_config
from ..errors import GpuEffError, NoGpus
from ..model import RUNNING
from . import idle
from .message import header_safe, plain_notice, recipients, report_message, sender
from .notice import Notice, parse_args, read_notice
from .outbox import Delivered, MailError, Outbox, Sendmail, Smtp, Transport

if TYPE_CHECKING:
    from ..slurm.base import Slurm

POLL_S = 5.0  # how often the worker looks again for the summary and accounting
USAGE = """usage: gpueff-mail -s SUBJECT RECIPIENT   Slurm's MailProg (slurm.conf MailProg=)
       gpueff-mail --watch                 the service: idle-GPU checks, the mail spool
       gpueff-mail --idle-check            one idle-GPU check, then what is due
       gpueff-mail --flush                 send what is due in the mail spool
Settings: [mail] in the config file (gpueff config shows them); docs/install.md.
"""
log = logging.getLogger("gpueff.mail")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    if args[:1] == ["--work"] and len(args) == 2:
        return work(Path(args[1]))
    if args[:1] == ["--work"] and len(args) == 4 and args[2] == "--slot-fd" and args[3].isdigit():
        return work(Path(args[1]), slot=int(args[3]))
    if args == ["--flush"]:
        return flush()
    if args in (["--help"], ["-h"]):
        sys.stdout.write(USAGE)
        return 0
    if args == ["--watch"]:
        return watch()
    if args == ["--idle-check"]:
        return idle_pass(load_config())
    try:
        mailprog(args, env)
    except Exception as exc:  # a bug: said where slurmctld logs it, never raised to Slurm
        sys.stderr.write(f"gpueff-mail: internal error: {exc!r}\n")
        log.exception("gpueff-mail: internal error")
    return 0


def mailprog(args: list[str], env: Mapping[str, str], detach: bool = True) -> int:
    """Take Slurm's request and return at once, always 0 (as every hook of ours: what
    fails is said on stderr, which slurmctld logs, and in the mail log): once the request
    is in the spool, or, the spool unusable, once Slurm's notice went out directly (a few
    seconds at most)."""
    try:
        subject, rcpts = parse_args(args)
    except GpuEffError as exc:
        sys.stderr.write(f"gpueff-mail: {exc}\n")
        return 0
    try:
        config = load_config()
        _logging(config)
    except GpuEffError as exc:  # no settings to send with: as Slurm itself would
        sys.stderr.write(f"gpueff-mail: {exc}: handing Slurm's notice to mail(1)\n")
        _as_slurm_would(subject, rcpts)
        return 0
    recipient = ",".join(rcpts)
    try:
        box = Outbox(config.mail_spool_dir).make()
        request = box.request(subject, recipient, env, time.time())
    except OSError as exc:  # no spool (disk full, unwritable): Slurm's notice at once
        log.error("mail spool %s unusable (%s): sending Slurm's notice directly", config.mail_spool_dir, exc)
        _direct(config, _notice_anyway(subject, recipient, env), f"(gpueff-mail: {exc.strerror})")
        return 0
    if detach:
        try:
            _start_worker_for(config, box, request)
        except OSError as exc:  # no process to be had: the notice now, unless a worker took it
            log.error("cannot start a mail worker (%s): sending Slurm's notice directly", exc)
            taken = box.claim(request)
            if taken is not None:
                taken.unlink()
                _direct(config, _notice_anyway(subject, recipient, env), "")
    return 0


def _start_worker_for(config: Config, box: Outbox, request: Path) -> None:
    """A worker, holding a slot taken here (so that MailProgs called together do not each
    start one); none when every slot is held: a worker takes the request once done with
    its own."""
    try:
        slot = box.take_slot(config.mail_workers)
        if slot is None:
            return
    except OSError as exc:  # the slots cannot be read: the worker looks for itself
        log.warning("mail worker slots in %s: %s", box.root, exc)
        slot = None
    try:
        _start_worker(config, request, slot)
    finally:
        if slot is not None:
            os.close(slot)  # the worker has it now


def _start_worker(config: Config, request: Path, slot: int | None) -> None:
    """A process of its own session holding none of slurmctld's pipes: slurmctld sees the
    MailProg end at once. Its stderr goes to the mail log (a worker that cannot start says
    why there). `slot`: an open worker slot it inherits."""
    python = config.python or sys.executable
    try:
        err = _open_log(config.mail_log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError:
        err = os.open(os.devnull, os.O_WRONLY)
    try:
        held = [] if slot is None else ["--slot-fd", str(slot)]
        subprocess.Popen([python, "-I", "-m", "slurm_gpu_eff.mail.prog", "--work", str(request), *held],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                         start_new_session=True, close_fds=True, pass_fds=() if slot is None else (slot,),
                         env=_keep(os.environ))
    finally:
        os.close(err)


def _keep(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in ("GPUEFF_CONFIG", "SLURM_CONF", "PATH", "TZ", "LANG")}


def work(request: Path, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
         config: Config | None = None, transport: Transport | None = None, slot: int | None = None) -> int:
    """Slurm's request, then any other no worker took, each made into its message and
    sent; what the server would not take is retried until sent or given up. At most
    `[mail] workers` do this at once: a flood of job ends (a partition drained, a
    reservation's end) must not start a process per job on slurmctld's host. `slot`: one
    the MailProg took for it; a worker that finds every slot held leaves its request to
    the workers at it."""
    config = config or load_config()
    _logging(config)
    box = Outbox(config.mail_spool_dir).make()
    transport = transport or transport_for(config)
    made: set[str] = set()
    next_request: Path | None = request
    while next_request is not None:
        if slot is None:
            slot = box.take_slot(config.mail_workers)
            if slot is None:
                break  # the workers at it take this request once done with theirs
        try:
            while next_request is not None:
                try:
                    taken = box.claim(next_request)
                except OSError as exc:  # it would come back first each time: leave it to flush
                    log.error("cannot take mail request %s: %s", next_request.name, exc)
                    return _send_until_done(box, made, config, transport, clock, sleep)
                if taken is not None:
                    names = set(_made(box, taken, config, clock, sleep))
                    _deliver(box, transport, config, clock, only=names)
                    made |= names
                next_request = box.unclaimed()
        finally:
            os.close(slot)
            slot = None
        # One that came as the slot was let go: its worker found every slot held
        next_request = box.unclaimed()
    return _send_until_done(box, made, config, transport, clock, sleep)


def _made(box: Outbox, taken: Path, config: Config, clock: Callable[[], float],
          sleep: Callable[[float], None], wait: bool = True) -> list[str]:
    try:
        return make_message(box, taken, config, clock, sleep, wait)
    except Exception:  # a bug: the notice must still go out
        log.exception("gpueff-mail: making the message for %s failed", taken)
        return _fallback(box, taken, config, clock)


def flush(config: Config | None = None, transport: Transport | None = None,
          clock: Callable[[], float] = time.time, budget_s: float | None = None) -> int:
    """Send what is due, and finish what a killed worker left (requests of more than
    twice the wait). `budget_s`: no send starts after that many seconds (the rest waits
    for the next flush)."""
    config = config or load_config()
    _logging(config)
    box = Outbox(config.mail_spool_dir).make()
    transport = transport or transport_for(config)
    for request in box.pending_requests(2 * config.mail_wait_s + 60, clock()):
        taken = box.claim(request)
        if taken is not None:
            _made(box, taken, config, clock, lambda s: None, wait=False)
    # Requests no worker took: left to workers that were killed before they looked again
    waiting = box.unclaimed()
    if waiting is not None:
        try:
            _start_worker_for(config, box, waiting)
        except OSError as exc:
            log.error("cannot start a mail worker (%s): the next flush tries again", exc)
    until = None if budget_s is None else time.monotonic() + budget_s
    done = _deliver(box, transport, config, clock, until=until)
    return 0 if not done.given_up else 1


def watch(sleep: Callable[[float], None] = time.sleep) -> int:
    """The service on the mail spool's host: every `[mail] idle_check_s`, the idle-GPU
    check (when the site has it on), then what is due in the outbox, for a bounded time
    (`watch_budget_s`). The configuration is read anew each time: a change needs no
    restart."""
    while True:
        try:
            config = load_config()
        except GpuEffError as exc:
            sys.stderr.write(f"gpueff-mail --watch: {exc}\n")
            sleep(60.0)
            continue
        idle_pass(config)
        sleep(config.idle_check_s)


def watch_budget_s(config: Config) -> float:
    """How long the watch's flush may start sends: a mail server that is slow or away
    must not hold up the next idle check (a pass also ends at the first send that cannot
    reach the server, so it waits out one connection timeout at most)."""
    return min(WATCH_FLUSH_MAX_S, config.idle_check_s / 2)


WATCH_FLUSH_MAX_S = 20.0


def idle_pass(config: Config, clock: Callable[[], float] = time.time, transport: Transport | None = None,
              slurm: Slurm | None = None) -> int:
    """One idle-GPU check, then a bounded flush; never raises (it runs as a service).
    The flush runs whatever the check did: a store or Slurm away stops no mail."""
    _logging(config)
    checked = _idle_check(config, clock, slurm)
    try:
        flushed = flush(config, transport, clock, budget_s=watch_budget_s(config))
    except Exception:  # a bug, or the spool unusable: said, and the next pass tries again
        log.exception("gpueff-mail: flush failed")
        return 1
    return 0 if checked and flushed == 0 else 1


_SAID: set[str] = set()


def _idle_check(config: Config, clock: Callable[[], float], slurm: Slurm | None) -> bool:
    if config.idle_alert_min <= 0:
        return True
    try:
        from ..slurm.access import connect
        from ..store import open_store

        box = Outbox(config.mail_spool_dir).make()
        slurm = slurm or connect(config, use="watch")
        if slurm.why and slurm.why not in _SAID:  # which backend asks Slurm: once a process
            _SAID.add(slurm.why)
            log.info("gpueff-mail: Slurm through %s: %s", slurm.name, slurm.why)
        with open_store(config.store_read_url, readonly=True) as store:
            for line in idle.check(config, store, slurm, box, clock()):
                log.info("%s", line)
    except GpuEffError as exc:  # the store or Slurm away: said, and the next pass tries again
        log.error("gpueff-mail: idle check failed: %s", exc)
        return False
    except Exception:  # a bug: said in full
        log.exception("gpueff-mail: idle check failed")
        return False
    return True


def make_message(box: Outbox, request: Path, config: Config, clock: Callable[[], float],
                 sleep: Callable[[float], None], wait: bool = True) -> list[str]:
    """The request's message in the outbox (the request then removed); its names."""
    try:
        raw = json.loads(request.read_text())
    except FileNotFoundError:
        return []  # another worker made it
    except (OSError, ValueError) as exc:
        log.error("corrupt mail request %s (%s): set aside", request, exc)
        request.rename(request.with_suffix(".corrupt"))
        return []
    notice = read_notice(str(raw.get("subject", "")), str(raw.get("recipient", "")), raw.get("env") or {})
    try:
        notice, to = addressed(notice, config)
    except ValueError as exc:
        log.error("job %s: %s: not sent", notice.job_id, exc)
        request.unlink(missing_ok=True)
        return []
    report_key: list[str] = []
    message = build(notice, config, clock, sleep if wait else (lambda s: None),
                    deadline=float(raw.get("at", clock())) + (config.mail_wait_s if wait else 0.0),
                    report_key=report_key)
    # named after the request: made again (its taker killed before the end), it replaces itself
    name = box.post(message, to, clock(), job=notice.job_id, name=_stem(request))
    for key in report_key:  # only now: a report that never reached the outbox was not sent
        box.first_report(key)
    request.unlink(missing_ok=True)
    return [name]


def addressed(notice: Notice, config: Config) -> tuple[Notice, list[str]]:
    """The notice as it goes out, and its addresses: each bare user name at `[mail]
    domain`, as the idle alerts address theirs. ValueError: a recipient that is no address."""
    to = recipients(notice.recipient, config.mail_domain)
    return replace(notice, recipient=",".join(to)), to


def _stem(request: Path) -> str:
    return request.name.split(".json")[0]


def build(notice: Notice, config: Config, clock: Callable[[], float], sleep: Callable[[float], None],
          deadline: float, find: Callable[[Notice, Config], Any] | None = None,
          report_key: list[str] | None = None) -> EmailMessage:
    """The report's message for the end of a GPU job, else Slurm's plain notice. With a
    report, its job run's key goes into `report_key` (the caller marks it sent)."""
    from_ = sender(config.mail_from)
    why = _no_report(notice, config)
    if why is not None:
        return plain_notice(notice, from_, why)
    find = find or find_report
    error: GpuEffError | None = None
    while True:
        try:
            report = find(notice, config)
        except NoGpus:
            return plain_notice(notice, from_)  # a CPU job: Slurm's own notice, nothing added
        except GpuEffError as exc:  # not in the accounting yet, no summary yet, ...
            report, error = None, exc
        else:
            error = None
        if report is not None and _ready(report):
            break
        if clock() + POLL_S > deadline:
            why = (f"The GPU report of job {notice.job_id} was not ready "
                   f"{config.mail_wait_s:.0f} s after the job ended"
                   + (f" ({header_safe(str(error), 200)})" if error else "")
                   + f": run `gpueff {notice.job_id}` later.")
            return plain_notice(notice, from_, why)
        sleep(POLL_S)
    short = _too_small(report, config)
    if short:
        return plain_notice(notice, from_)
    starts = [r.job.start for r in getattr(report, "reports", [report])]
    key = f"{notice.cluster}-{notice.job_id}-{max(starts, default='')}"
    if Outbox(config.mail_spool_dir).make().reported_already(key):
        return plain_notice(notice, from_, f"The GPU report of job {notice.job_id} went out with an "
                                           "earlier mail.")
    if report_key is not None:
        report_key.append(key)
    return report_message(notice, from_, report, footer=config.mail_footer,
                          extra=idle.cancelled_note(config, notice.cluster, notice.job_id))


def find_report(notice: Notice, config: Config) -> Any:
    """The job's report as `gpueff JOBID` makes it (accounting first: Slurm's rules; our
    line read from the field `[slurm] comment_field` names)."""
    from ..report.hints import HintSettings
    from ..report.lookup import job_report
    from ..slurm.access import connect
    from ..store import open_store

    read_store = partial(open_store, config.store_read_url, readonly=True)
    slurm = connect(config, use="report")
    return job_report(slurm, notice.job_id, read_store, HintSettings.from_config(config.hints))


def _ready(report: Any) -> bool:
    """The job is over in the accounting and its figures are final (or said missing): no
    node's figures are still a live copy (a cancelled job's mail comes while its epilog
    still stops the sampler)."""
    return all(not r.job.running and r.status != RUNNING and all(g.status != RUNNING for g in r.gpus)
               for r in getattr(report, "reports", [report]))


def _no_report(notice: Notice, config: Config) -> str | None:
    """Why this mail gets no report (None: it may): Slurm's notice then goes out as is."""
    if not config.mail_enabled or not notice.at_end:
        return ""
    if notice.user and notice.user in _opted_out(config.mail_opt_out_file):
        return ""
    return None


def _too_small(report: Any, config: Config) -> bool:
    jobs = [r.job for r in getattr(report, "reports", [report])]
    gpus = max((j.gpus for j in jobs), default=0)
    minutes = max((j.elapsed_s for j in jobs), default=0) / 60.0
    return gpus < max(1, config.mail_min_gpus) or minutes < config.mail_min_minutes


def _opted_out(path: str) -> set[str]:
    if not path:
        return set()
    try:
        return {line.strip() for line in Path(path).read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    except OSError as exc:
        log.error("opt-out file %s unreadable (%s): nobody opted out", path, exc)
        return set()


def _fallback(box: Outbox, request: Path, config: Config, clock: Callable[[], float]) -> list[str]:
    """Slurm's notice, whatever went wrong in making the message; a request that cannot
    even give that is set aside (`.corrupt`), never left to fail every --flush."""
    try:
        raw = json.loads(request.read_text())
        notice, to = addressed(_notice_anyway(str(raw["subject"]), str(raw["recipient"]),
                                              raw.get("env") or {}), config)
        name = box.post(plain_notice(notice, sender(config.mail_from), "(gpueff-mail could not add the "
                                     "GPU report: see its log)"), to, clock(), name=_stem(request))
    except Exception:
        log.exception("gpueff-mail: request %s cannot be sent: set aside", request)
        with contextlib.suppress(OSError):
            request.rename(request.with_name(request.name + ".corrupt"))
        return []
    request.unlink(missing_ok=True)
    return [name]


def _notice_anyway(subject: str, recipient: str, env: Mapping[str, str]) -> Notice:
    """The notice, or (no job id anywhere: someone's test, a wrapper's subject) one with
    Slurm's subject and recipient only."""
    try:
        return read_notice(subject, recipient, env)
    except GpuEffError:
        return Notice(subject=subject, recipient=recipient, job_id="", mail_type="", state="", user="",
                      cluster="", name="")


def _send_until_done(box: Outbox, names: set[str], config: Config, transport: Transport,
                     clock: Callable[[], float], sleep: Callable[[float], None]) -> int:
    """Send this worker's messages; if the server would not take them, one process (the
    retrier: whoever holds its lock) tries the whole outbox again until it is empty."""
    _deliver(box, transport, config, clock, only=names)
    if not set(names) & set(box.names()):
        return 0
    with box.retrier() as mine:
        if not mine:
            return 0  # the retrier sends it with the rest
        while box.names():
            due = box.next_due()
            sleep(max(1.0, (due if due is not None else clock()) - clock()))
            _deliver(box, transport, config, clock)
    return 0


DIRECT_TIMEOUT_S = 15.0  # a send from the MailProg itself: well inside slurmctld's 120 s


def _direct(config: Config, notice: Notice, why: str) -> bool:
    try:
        notice, to = addressed(notice, config)
        transport_for(config, DIRECT_TIMEOUT_S).send(plain_notice(notice, sender(config.mail_from), why), to)
    except (MailError, ValueError) as exc:
        sys.stderr.write(f"gpueff-mail: Slurm's notice not sent: {exc}\n")
        log.error("Slurm's notice not sent: %s", exc)
        return False
    return True


def _as_slurm_would(subject: str, rcpts: list[str]) -> int:
    """Slurm's default MailProg, with Slurm's own arguments and an empty body: to the
    recipients that are addresses only (no option or header for mail(1) in the rest)."""
    to = _addresses_only(rcpts)
    if not to:
        return 1
    for program in ("/usr/bin/mail", "/bin/mail", "/usr/bin/mailx"):
        if os.access(program, os.X_OK):
            try:
                # No "--" before the addresses: Debian's bsd-mailx takes it, but s-nail
                # (RHEL's mailx) stops at it with a usage error and sends nothing. None of
                # the addresses starts with "-": none can be an option.
                return subprocess.run([program, "-s", header_safe(subject), *to], stdin=subprocess.DEVNULL,
                                      timeout=DIRECT_TIMEOUT_S, check=False).returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                sys.stderr.write(f"gpueff-mail: {program}: {exc}\n")
                return 1
    sys.stderr.write("gpueff-mail: no mail(1) either: Slurm's notice is lost\n")
    return 1


def _addresses_only(rcpts: list[str]) -> list[str]:
    """Each of Slurm's recipients (comma lists split) that is a user name or an address;
    the rest said on stderr (slurmctld logs it: there are no settings, so no mail log)."""
    to: list[str] = []
    for part in (p for r in rcpts for p in r.split(",") if p.strip()):
        try:
            to += recipients(part)
        except ValueError as exc:
            sys.stderr.write(f"gpueff-mail: {exc}: refused\n")
    if not to:
        sys.stderr.write("gpueff-mail: no recipient left: Slurm's notice is not sent\n")
    return to


def transport_for(config: Config, timeout_s: float = 30.0) -> Transport:
    if config.mail_transport == "sendmail":
        return Sendmail(config.mail_sendmail, timeout_s)
    return Smtp(config.mail_smtp_host, config.mail_smtp_port, config.mail_smtp_security,
                config.mail_smtp_user, config.mail_smtp_password_file, timeout_s)


def _deliver(box: Outbox, transport: Transport, config: Config, clock: Callable[[], float],
             only: set[str] | None = None, until: float | None = None) -> Delivered:
    """Send what is due in the outbox (of `only`, if given; no send started after
    `until`, time.monotonic()), and log what happened."""
    done = box.deliver(transport, clock(), config.mail_retry_s, config.mail_retry_max_s,
                       config.mail_retry_for_s, only=only, until=until, clock=clock)
    _log_delivery(done)
    return done


def _log_delivery(done: Delivered) -> None:
    for name in done.sent:
        log.info("sent %s", name)
    for error in done.errors:
        log.warning("not sent yet: %s", error)
    for name in done.given_up:
        log.error("given up: %s (kept in the spool's failed/)", name)
    if done.left:
        log.info("%d message(s) left for the next try (the server unreachable, or out of time)",
                 len(done.left))


# The mail log names users and their jobs, which users may not read of each other: the
# writer's alone (root reads it), as the hooks' log (node/log.py). Not 0640: its group
# would be whatever SlurmUser's is, which says nothing of who should read it.
LOG_MODE = 0o600


def _open_log(path: str, flags: int) -> int:
    """The mail log, made LOG_MODE if new (an existing file keeps its mode). Never through
    a symlink: root or SlurmUser writes it, and whoever could put one there would choose
    the file they write."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, LOG_MODE)


def _logging(config: Config) -> None:
    if log.handlers:
        return
    refused = None
    try:
        # The last part only, as the hooks' log (node/log.py) does.
        Path(config.mail_log_file).parent.mkdir(exist_ok=True)
        stream = open(config.mail_log_file, "a", encoding="utf-8", opener=_open_log)
        handler: logging.Handler = logging.StreamHandler(stream)
    except OSError as exc:  # a symlink there (ELOOP), no such directory, no permission
        refused = exc
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s gpueff-mail[%(process)d] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    if refused is not None:
        log.warning("mail log %s unusable (%s): logging here instead", config.mail_log_file,
                    refused.strerror or refused)


if __name__ == "__main__":
    sys.exit(main())
