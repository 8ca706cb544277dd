"""The mail spool under the idle policy (issue 20, finding 5): a message that asks for it
keeps a receipt of when the server took it (the cancel clock's start), a server that
cannot be reached is told apart from one that refused, and the watch's flush is bounded
so that a slow or absent server does not hold up the idle checks; a failed check never
stops the mail."""

from __future__ import annotations

import email
import socket
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.mail import prog
from slurm_gpu_eff.mail.outbox import MailError, Outbox, Smtp


class Server:
    """A mail server that takes everything."""

    def __init__(self) -> None:
        self.took: list[email.message.Message] = []

    def send(self, message: email.message.Message, to: list[str]) -> None:
        self.took.append(message)


def plain_message() -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "slurm@cluster.example", "alice@cluster.example", "t"
    message.set_content("x")
    return message


def closed_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


def test_a_message_posted_with_a_receipt_says_when_the_server_took_it(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "mail")).make()
    name = box.post(plain_message(), ["alice@cluster.example"], 1000.0, name="idle-alert-x", receipt=True)
    other = box.post(plain_message(), ["alice@cluster.example"], 1000.0)
    assert box.receipt(name) is None and box.holds(name)
    done = box.deliver(Server(), 1010.0, 60, 1800, 86400, clock=lambda: 1012.5)  # type: ignore[arg-type]
    assert sorted(done.sent) == sorted([name, other])
    assert box.receipt(name) == 1012.5 and not box.holds(name)
    assert box.receipt(other) is None  # it asked for none


def test_a_mail_server_that_cannot_be_reached_is_told_apart_from_a_refusal() -> None:
    with pytest.raises(MailError) as caught:
        Smtp("127.0.0.1", closed_port(), timeout_s=5).send(plain_message(), ["alice@cluster.example"])
    assert caught.value.unreachable and not caught.value.permanent


def watch_config(tmp_path: Path, **settings: Any) -> Config:
    return Config(mail_spool_dir=str(tmp_path / "mail"), mail_log_file=str(tmp_path / "mail.log"), **settings)


def test_a_watch_pass_stops_at_a_mail_server_it_cannot_reach(tmp_path: Path) -> None:
    """Finding 5: with the server away, each waiting message cost the watch its own
    connection timeout (30 s) before the next idle check. One try a pass now."""
    config = watch_config(tmp_path)
    box = Outbox(config.mail_spool_dir).make()
    for at in (1000.0, 1001.0, 1002.0):
        box.post(plain_message(), ["alice@cluster.example"], at)
    tries: list[list[str]] = []
    away = Smtp("127.0.0.1", closed_port(), timeout_s=5)

    class Counting:
        def send(self, message: EmailMessage, to: list[str]) -> None:
            tries.append(to)
            away.send(message, to)

    prog.idle_pass(config, clock=lambda: 2000.0, transport=Counting())  # type: ignore[arg-type]
    assert len(tries) == 1 and len(box.names()) == 3


def test_a_watch_pass_starts_no_send_after_its_time(tmp_path: Path) -> None:
    """A slow server (each message taking 0.3 s here) holds up the idle checks for a
    bounded time: half the check interval (at most 20 s), then the next pass goes on."""
    config = watch_config(tmp_path, idle_check_s=0.2)
    box = Outbox(config.mail_spool_dir).make()
    for at in (1000.0, 1001.0, 1002.0):
        box.post(plain_message(), ["alice@cluster.example"], at)
    server = Server()

    class Slow:
        def send(self, message: EmailMessage, to: list[str]) -> None:
            time.sleep(0.3)
            server.send(message, to)

    prog.idle_pass(config, clock=lambda: 2000.0, transport=Slow())  # type: ignore[arg-type]
    assert len(server.took) == 1 and len(box.names()) == 2
    assert prog.watch_budget_s(Config(idle_check_s=600)) == 20.0


def test_a_failed_idle_check_still_lets_the_mail_out(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    config = watch_config(tmp_path, idle_alert_min=1, store_url="nosuch://x")
    box = Outbox(config.mail_spool_dir).make()
    box.post(plain_message(), ["alice@cluster.example"], 1000.0)
    server = Server()
    assert prog.idle_pass(config, clock=lambda: 2000.0, transport=server) == 1  # type: ignore[arg-type]
    assert "idle check failed" in caplog.text and len(server.took) == 1


def test_a_pass_past_its_deadline_still_tries_one_message(tmp_path: Path) -> None:
    """However short the budget (a tiny idle_check_s), each pass moves the spool on."""
    box = Outbox(str(tmp_path / "mail")).make()
    for at in (1000.0, 1001.0):
        box.post(plain_message(), ["alice@cluster.example"], at)
    server = Server()
    done = box.deliver(server, 2000.0, 60, 1800, 86400, until=time.monotonic() - 1)  # type: ignore[arg-type]
    assert len(server.took) == 1 and len(done.left) == 1
