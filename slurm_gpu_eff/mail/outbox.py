"""Where gpueff-mail keeps its work, so that no notification is lost: Slurm's requests
(`requests/`, until a worker made a message of each), the messages (`outbox/`, until the
mail server took them, retried with a doubling wait), the ones given up (`failed/`),
which jobs' reports went out (`reported/`: one report a job run), and when the messages
that asked for it were taken by the server (`receipts/`: the idle policy's cancel clock
starts there, not when its alert was queued).

Every file is written whole under another name and renamed; a message is sent under an
exclusive lock on its file and removed once the server took it, so two workers never
send one twice. (A worker killed between the server's "250 OK" and the removal would
send it again at its next try: the one window left, a few milliseconds wide.)
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import email.utils
import fcntl
import json
import os
import smtplib
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from ..errors import GpuEffError

POLICY = email.policy.default.clone(max_line_length=998)  # as message.py writes them


class MailError(GpuEffError):
    """The mail server or program did not take a message: it waits and is retried, unless
    `permanent` (the server refused it for good: 5xx), or only `refused` some recipients
    (the others have it: only those are tried again). `unreachable`: no server or program
    to talk to at all (every other message would fail, and wait as long, the same way)."""

    def __init__(self, message: str, permanent: bool = False, refused: list[str] | None = None,
                 unreachable: bool = False) -> None:
        super().__init__(message)
        self.permanent, self.refused, self.unreachable = permanent, refused or [], unreachable


# -- how a message leaves ---------------------------------------------------------------------


@dataclass(frozen=True)
class Smtp:
    host: str
    port: int
    security: str = "none"  # "starttls" or "tls"
    user: str = ""
    password_file: str = ""
    timeout_s: float = 30.0

    def send(self, message: EmailMessage, to: list[str]) -> None:
        try:
            if self.security == "tls":
                client: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout_s,
                                                        context=ssl.create_default_context())
            else:
                client = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
            with client:
                if self.security == "starttls":
                    client.starttls(context=ssl.create_default_context())
                if self.user:
                    client.login(self.user, Path(self.password_file).read_text().strip())
                refused = client.send_message(message, to_addrs=to)
        except smtplib.SMTPRecipientsRefused as exc:  # every recipient: a 5xx is for good
            codes = [code for code, _ in exc.recipients.values()]
            raise MailError(f"SMTP {self.host}:{self.port} refused every recipient: {exc.recipients}",
                            permanent=all(c >= 500 for c in codes)) from exc
        except smtplib.SMTPConnectError as exc:  # its greeting refused us, not this message
            raise MailError(f"SMTP {self.host}:{self.port}: {exc}", unreachable=True) from exc
        except smtplib.SMTPResponseException as exc:
            raise MailError(f"SMTP {self.host}:{self.port}: {exc}", permanent=exc.smtp_code >= 500) from exc
        except (OSError, smtplib.SMTPServerDisconnected) as exc:  # no answer, or none to the end
            raise MailError(f"SMTP {self.host}:{self.port}: {exc}", unreachable=True) from exc
        except smtplib.SMTPException as exc:
            raise MailError(f"SMTP {self.host}:{self.port}: {exc}") from exc
        if refused:  # the others took it: only these are tried again (or given up, 5xx)
            raise MailError(f"SMTP {self.host}:{self.port} refused {', '.join(refused)}",
                            permanent=all(code >= 500 for code, _ in refused.values()),
                            refused=sorted(refused))


@dataclass(frozen=True)
class Sendmail:
    program: str = "/usr/sbin/sendmail"
    timeout_s: float = 60.0

    def send(self, message: EmailMessage, to: list[str]) -> None:
        sender = email.utils.parseaddr(str(message["From"]))[1]
        # no shell; -i: a lone "." is text; --: no recipient is read as an option
        argv = [self.program, "-i", *(["-f", sender] if sender else []), "--", *to]
        try:
            done = subprocess.run(argv, input=message.as_bytes(), capture_output=True,
                                  timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MailError(f"{self.program}: {exc}", unreachable=True) from exc
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise MailError(f"{self.program} exited {done.returncode}: {why[0][:200]}")


Transport = Smtp | Sendmail


# -- the spool --------------------------------------------------------------------------------


@dataclass
class Delivered:
    sent: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # the server away: tried again later
    given_up: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # not tried: server unreachable, or out of time


@dataclass(frozen=True)
class Retry:
    """How a message the server would not take waits: retry_s, doubling to max_s, for for_s."""
    first_s: float
    max_s: float
    for_s: float


class Outbox:
    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.requests, self.outbox = self.root / "requests", self.root / "outbox"
        self.failed, self.reported = self.root / "failed", self.root / "reported"
        self.receipts = self.root / "receipts"

    def make(self) -> Outbox:
        old = os.umask(0o077)  # messages name users and jobs: SlurmUser's alone
        try:
            for path in (self.root, self.requests, self.outbox, self.failed, self.reported, self.receipts):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
        finally:
            os.umask(old)
        return self

    # Slurm's requests: written by the MailProg at once, made into messages by a worker
    def request(self, subject: str, recipient: str, env: Mapping[str, str], now: float) -> Path:
        slurm = {k: v for k, v in env.items() if k.startswith(("SLURM_", "SPANK_"))}
        body = {"subject": subject, "recipient": recipient, "env": slurm, "at": now}
        return write_whole(self.requests / f"{now:.6f}-{uuid.uuid4().hex}.json", json.dumps(body).encode())

    def claim(self, request: Path) -> Path | None:
        """The request, taken by this process (renamed: one taker, whoever asks); None if
        another took it first."""
        taken = request.with_name(f"{request.name.split('.json')[0]}.json.taken{os.getpid()}")
        try:
            # Made young first: a taken request is old (for flush) once its taker had time
            # to finish it, and a rename keeps the time it was written.
            with contextlib.suppress(PermissionError):  # another user's (root trying us out)
                os.utime(request)
            os.rename(request, taken)
        except FileNotFoundError:
            return None
        return taken

    def unclaimed(self) -> Path | None:
        """The oldest request no worker has taken (a request is named by its time)."""
        waiting = sorted(p for p in self.requests.iterdir()
                         if p.name.endswith(".json") and not p.name.startswith("."))
        return waiting[0] if waiting else None

    def take_slot(self, workers: int) -> int | None:
        """An open file holding one of `workers` worker slots (an flock: let go when the
        file is closed, in every process that has it, however they end); None when every
        slot is held."""
        for slot in range(workers):
            fd = os.open(self.root / f"worker-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    def pending_requests(self, older_than_s: float, now: float) -> list[Path]:
        """Requests a worker should have finished by now (it was killed, or the host
        rebooted), taken or not."""
        return sorted(p for p in self.requests.iterdir() if ".json" in p.name and not p.name.startswith(".")
                      and not p.name.endswith(".corrupt") and now - _mtime(p, now) > older_than_s)

    # messages
    def post(self, message: EmailMessage, to: list[str], now: float, job: str = "", name: str = "",
             receipt: bool = False) -> str:
        """Into the outbox as `name` (a request's own: made again, it replaces itself);
        with `receipt`, when the server takes it is kept (`sent_at`)."""
        name = name or f"{now:.6f}-{uuid.uuid4().hex}"
        meta = {"to": to, "first_at": now, "next_at": now, "tries": 0, "job": job, "receipt": receipt}
        write_whole(self.outbox / f"{name}.json", json.dumps(meta).encode())
        write_whole(self.outbox / f"{name}.eml", message.as_bytes())
        return name

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.outbox.glob("*.eml"))

    def next_due(self) -> float | None:
        times = [_meta(self.outbox / f"{n}.json").get("next_at", 0.0) for n in self.names()]
        return min(times) if times else None

    def deliver(self, transport: Transport, now: float, retry_s: float, retry_max_s: float,
                retry_for_s: float, only: set[str] | None = None, until: float | None = None,
                clock: Callable[[], float] | None = None) -> Delivered:
        """Send what is due; what the server would not take waits, doubling, for retry_for_s.
        A pass ends at a server that cannot be reached (each other message would wait out
        the same timeout) and, once it tried one, starts no send after `until`
        (time.monotonic()): the rest are `left` for the next. `clock`: when a receipt
        says the server took a message (else `now`)."""
        done, retry = Delivered(), Retry(retry_s, retry_max_s, retry_for_s)
        names = [name for name in self.names() if only is None or name in only]
        for at, name in enumerate(names):
            tried = done.sent or done.errors
            if until is not None and tried and time.monotonic() >= until:
                done.left.extend(names[at:])
                break
            with self._locked(name) as held:  # not held: another worker is sending it
                reached = not held or self._try(name, transport, now, retry, done, clock)
            if not reached:
                done.left.extend(names[at + 1:])
                break
        return done

    def _try(self, name: str, transport: Transport, now: float, retry: Retry, done: Delivered,
             clock: Callable[[], float] | None) -> bool:
        """One message, if due; False when its server could not be reached."""
        meta_path, body_path = self.outbox / f"{name}.json", self.outbox / f"{name}.eml"
        if not body_path.exists():
            return True
        meta = _meta(meta_path)
        if meta.get("next_at", 0.0) > now:
            done.waiting.append(name)
            return True
        message = email.message_from_bytes(body_path.read_bytes(), policy=POLICY)
        try:
            transport.send(message, list(meta.get("to") or []))
        except MailError as exc:
            self._not_taken(name, meta, exc, now, retry, done)
            return not exc.unreachable
        if meta.get("receipt"):  # before the removal: a receipt is never missing for a sent one
            self._receipt(name, clock() if clock is not None else now, done)
        body_path.unlink()
        meta_path.unlink(missing_ok=True)
        done.sent.append(name)
        return True

    def _not_taken(self, name: str, meta: dict[str, Any], exc: MailError, now: float, retry: Retry,
                   done: Delivered) -> None:
        tries = int(meta.get("tries", 0)) + 1
        meta.update(tries=tries, last_error=str(exc),
                    next_at=now + min(retry.max_s, retry.first_s * 2 ** (tries - 1)))
        if exc.refused:
            meta["to"] = exc.refused
        done.errors.append(str(exc))
        if exc.permanent or now - float(meta.get("first_at", now)) >= retry.for_s:
            write_whole(self.failed / f"{name}.json", json.dumps(meta).encode())
            os.replace(self.outbox / f"{name}.eml", self.failed / f"{name}.eml")
            (self.outbox / f"{name}.json").unlink(missing_ok=True)
            done.given_up.append(name)
        else:
            write_whole(self.outbox / f"{name}.json", json.dumps(meta).encode())
            done.waiting.append(name)

    def _receipt(self, name: str, sent_at: float, done: Delivered) -> None:
        try:
            write_whole(self.receipts / f"{name}.json", json.dumps({"sent_at": sent_at}).encode())
        except OSError as exc:  # sent all the same; whoever waits on the receipt waits on
            done.errors.append(f"{name} sent, but its receipt could not be kept: {exc}")

    def receipt(self, name: str) -> float | None:
        """When the server took message `name` (posted with `receipt`); None: not yet."""
        sent_at = _meta(self.receipts / f"{name}.json").get("sent_at")
        return float(sent_at) if isinstance(sent_at, (int, float)) else None

    def holds(self, name: str) -> bool:
        """Whether message `name` still waits in the outbox (or is being sent)."""
        return (self.outbox / f"{name}.eml").exists()

    def given_up(self, name: str) -> bool:
        return (self.failed / f"{name}.eml").exists()

    def prune_receipts(self, before: float) -> None:
        for path in self.receipts.glob("*.json"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < before:
                    path.unlink()

    def first_report(self, key: str) -> bool:
        """Marks this job run's report as sent (once it is in the outbox): whichever of
        Slurm's mails (time limit, then FAIL) comes first carries it. True the first time."""
        try:
            os.close(os.open(self._reported(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        return True

    def reported_already(self, key: str) -> bool:
        return self._reported(key).exists()

    def _reported(self, key: str) -> Path:
        return self.reported / safe_name(key)

    def retrier(self) -> contextlib.AbstractContextManager[bool]:
        """Held by the one process that waits to try the outbox again (True), so that a
        mail server away for a day leaves one sleeping process, not one per message."""
        return held_alone(self.root / "retrier.lock")

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[bool]:
        try:
            fd = os.open(self.outbox / f"{name}.eml", os.O_RDONLY)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        try:
            yield True
        finally:
            os.close(fd)


def safe_name(text: str) -> str:
    """A file name for a key made of user-given parts (cluster, job id): nothing but
    letters, digits and ._- (no / or ..), 200 characters at most."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:200]


@contextlib.contextmanager
def held_alone(lock: Path) -> Iterator[bool]:
    """True while this process holds `lock` (an exclusive flock); False, at once, when
    another does."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def write_whole(path: Path, data: bytes) -> Path:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return path


def _meta(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default
