"""A real SMTP server for the mail tests (aiosmtpd), that keeps what it receives, parsed."""

from __future__ import annotations

import email
import email.policy
import socket
import time
from email.message import EmailMessage
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []  # (envelope recipients, message)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append((list(envelope.rcpt_tos), parsed))  # type: ignore[arg-type]
        return "250 OK"

    def of(self, job_id: str) -> list[tuple[list[str], EmailMessage]]:
        """The messages about a job (Slurm's subject names it)."""
        return [(to, m) for to, m in self.messages if f"Job_id={job_id} " in str(m["Subject"])]

    def wait(self, job_id: str, timeout: float = 120, settle: float = 4,
             subject: str = "") -> list[tuple[list[str], EmailMessage]]:
        """The job's messages, `settle` seconds after one came (one with `subject` in its
        subject, if given): a message that must come is waited for, not slept on."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not any(subject in str(m["Subject"]) for _, m in self.of(job_id)):
            time.sleep(0.5)
        time.sleep(settle)
        return self.of(job_id)


class Server:
    """Stopped and started again on its port (a new aiosmtpd controller each time), into
    one inbox."""

    def __init__(self, port: int) -> None:
        self.port, self.inbox = port, Inbox()
        self.controller: Any = None

    def start(self) -> Inbox:
        from aiosmtpd.controller import Controller

        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        return self.inbox

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
