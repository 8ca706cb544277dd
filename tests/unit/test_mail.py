"""gpueff-mail (issue 11): what Slurm asks (the environment first, the subject where it is
all there is), the messages (headers no job name can add to, HTML escaped, the charts in
the message), the spool (nothing lost, nothing sent twice) and a real SMTP server."""

from __future__ import annotations

import email
import email.policy
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import NoGpus, NoSummary, UsageError
from slurm_gpu_eff.mail import prog
from slurm_gpu_eff.mail.message import header_safe, outcome, plain_notice, recipients, report_message
from slurm_gpu_eff.mail.notice import Notice, parse_args, read_notice
from slurm_gpu_eff.mail.outbox import MailError, Outbox, Smtp
from slurm_gpu_eff.report.job import build_report
from tests.configfile import write_config
from tests.smtp import Inbox, Server, free_port

HOSTILE = "x\nBcc: victim@example.org <b>"
END_SUBJECT = "Slurm Job_id=327 Name=train Ended, Run time 00:05:01, COMPLETED, ExitCode 0"
ENV = {"SLURM_JOB_ID": "327", "SLURM_JOB_USER": "alice", "SLURM_JOB_MAIL_TYPE": "Ended",
       "SLURM_JOB_STATE": "COMPLETED", "SLURM_CLUSTER_NAME": "gpueffdev", "SLURM_JOB_NAME": "train"}


# -- what Slurm asks ----------------------------------------------------------------------------

def test_the_environment_comes_first() -> None:
    n = read_notice(END_SUBJECT, "alice", ENV)
    assert (n.job_id, n.mail_type, n.state, n.user, n.cluster, n.at_end) == (
        "327", "Ended", "COMPLETED", "alice", "gpueffdev", True)


@pytest.mark.parametrize(("subject", "job_id", "kind", "state"), [
    (END_SUBJECT, "327", "Ended", "COMPLETED"),
    ("Slurm Job_id=5 Name=a, b Failed, Run time 1-02:00:00, TIMEOUT, ExitCode 0", "5", "Failed", "TIMEOUT"),
    ("Slurm Job_id=5 Name=x Began, Queued time 00:00:01", "5", "Began", ""),
    ("Slurm Job_id=5 Name=x Reached 90% of time limit, Run time 00:09:00", "5",
     "Reached 90% of time limit", ""),
    ("Slurm Job_id=5 Name=x Reached time limit, Run time 00:10:00", "5", "Reached time limit", ""),
    ("Slurm Array Task Job_id=123_4 (127) Name=x Ended, Run time 00:00:10, COMPLETED, ExitCode 0",
     "123_4", "Ended", "COMPLETED"),
    ("Slurm Array Summary Job_id=123_* (123) Name=x Ended, Mixed, ExitCode [0-1]", "123", "Ended", "Mixed"),
    ("SLURM Job_id=9 Name=old Ended, Run time 00:00:01, COMPLETED, ExitCode 0", "9", "Ended", "COMPLETED"),
])
def test_the_subject_where_the_environment_says_nothing(subject: str, job_id: str, kind: str,
                                                        state: str) -> None:
    n = read_notice(subject, "alice", {})
    assert (n.job_id, n.mail_type, n.state) == (job_id, kind, state)


def test_an_array_summary_is_the_whole_array_whatever_task_the_environment_names() -> None:
    env = {**ENV, "SLURM_JOB_ID": "130", "SLURM_ARRAY_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "7"}
    assert read_notice("Slurm Array Summary Job_id=123_* (123) Name=x Ended", "a", env).job_id == "123"
    assert read_notice("", "a", {**env, "SLURM_JOB_ID": ""}).job_id == "123_7"


def test_no_job_id_anywhere_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="no job id"):
        read_notice("hello", "alice", {})


@pytest.mark.parametrize(("argv", "subject", "rcpts"), [
    (["-s", "S", "alice"], "S", ["alice"]),
    (["-sS", "alice@example.org"], "S", ["alice@example.org"]),
    (["-s", "S", "--", "-odd"], "S", ["-odd"]),
])
def test_arguments_as_mail_takes_them(argv: list[str], subject: str, rcpts: list[str]) -> None:
    assert parse_args(argv) == (subject, rcpts)


def test_no_recipient_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_args(["-s", "S"])


# -- the messages -------------------------------------------------------------------------------

def notice(**overrides: Any) -> Notice:
    return read_notice(overrides.pop("subject", END_SUBJECT), overrides.pop("recipient", "alice"),
                       {**ENV, **overrides})


def test_no_job_name_adds_a_header() -> None:
    n = notice(subject=f"Slurm Job_id=327 Name={HOSTILE} Ended, Run time 00:00:05, COMPLETED, ExitCode 0",
               SLURM_JOB_NAME=HOSTILE)
    raw = plain_notice(n, "slurm@example.org").as_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["Bcc"] is None and "victim" not in str(parsed["To"])
    assert "\n" not in str(parsed["Subject"]) and "Bcc: victim" in str(parsed["Subject"])  # as text
    assert header_safe("a\r\nb\x00c\u2028d") == "a b c d"


@pytest.mark.parametrize("bad", ["-oQ/tmp/x", "alice bob", "<alice>", "a@b,-x", ""])
def test_recipients_that_are_no_address_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        recipients(bad)


def test_recipients_split_slurm_s_comma_list() -> None:
    assert recipients("alice, bob@example.org") == ["alice", "bob@example.org"]


def test_slurm_s_plain_notice_has_its_subject_and_no_body() -> None:
    m = plain_notice(notice(SLURM_JOB_MAIL_TYPE="Began", subject="Slurm Job_id=327 Name=train Began"),
                     "slurm@example.org")
    assert m["Subject"] == "Slurm Job_id=327 Name=train Began" and m.get_content().strip() == ""
    assert not m.is_multipart() and m["Auto-Submitted"] == "auto-generated"


@pytest.fixture
def idle_report(make_job: Any, make_summary: Any, make_gpu: Any) -> Any:
    timeline = {"fields": ["util"], "bucket_s": 60.0, "points": [[5.0], [95.0], [None], [50.0]]}
    gpus = [make_gpu(minor=0, util=80.0, timeline=timeline), make_gpu(minor=1, util=1.0)]
    return build_report(make_job(name=HOSTILE), [make_summary(gpus=gpus)])


def test_the_report_in_both_parts_with_its_charts(idle_report: Any) -> None:
    m = report_message(notice(SLURM_JOB_NAME=HOSTILE), "slurm@example.org", idle_report,
                       footer="Help: https://hpc.example.org/gpu")
    assert m["Subject"] == f"{END_SUBJECT}; GPU efficiency 40%: 1 of 2 GPUs idle"
    assert m.get_content_type() == "multipart/alternative"
    text, html = m.get_payload()  # type: ignore[misc]
    assert text.get_content_type() == "text/plain" and "Verdict:" in text.get_content()
    assert "Help: https://hpc.example.org/gpu" in text.get_content()
    assert html.get_content_type() == "multipart/related"
    page, *images = html.get_payload()
    body = page.get_content()
    assert "x\nBcc: victim@example.org &lt;b&gt;" in body and "<b>" not in body  # escaped
    assert len(images) == 1 and images[0].get_content_type() == "image/png"  # GPU 1: no timeline
    png = images[0].get_content()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'cid:{images[0]["Content-ID"][1:-1]}' in body
    assert "How to do better" in body and "Fix:" in body  # the hints with their fix


def test_outcome_words() -> None:
    class R:
        gpu_util_mean, idle_gpus, gpus = None, [], []
    assert outcome(R()) == "GPU efficiency n/a"  # type: ignore[arg-type]


# -- the worker's choice ------------------------------------------------------------------------

@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(mail_spool_dir=str(tmp_path / "mail"), mail_log_file=str(tmp_path / "mail.log"),
                  mail_from="slurm@example.org", mail_wait_s=60.0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_the_report_waits_for_the_summary(config: Config, idle_report: Any) -> None:
    clock, asked = Clock(), []

    def find(n: Notice, c: Config) -> Any:
        asked.append(clock())
        if len(asked) < 3:
            raise NoSummary("not yet")
        return idle_report

    m = prog.build(notice(), config, clock, clock.sleep, deadline=clock() + 60, find=find)
    assert m.is_multipart() and asked == [1000.0, 1005.0, 1010.0]


def test_a_report_not_ready_in_time_sends_slurm_s_notice_saying_why(config: Config) -> None:
    clock = Clock()

    def find(n: Notice, c: Config) -> Any:
        raise NoSummary("no summary of job 327 yet")

    m = prog.build(notice(), config, clock, clock.sleep, deadline=clock() + 60, find=find)
    assert not m.is_multipart() and m["Subject"] == END_SUBJECT
    assert "was not ready 60 s after" in m.get_content() and "gpueff 327" in m.get_content()
    assert clock() <= 1060


@pytest.mark.parametrize("env", [{"SLURM_JOB_MAIL_TYPE": "Began"}, {"SLURM_JOB_MAIL_TYPE": "Requeued"}])
def test_other_mails_are_slurm_s_own(config: Config, env: dict[str, str]) -> None:
    def find(n: Notice, c: Config) -> Any:
        raise AssertionError("no report for these")
    m = prog.build(notice(**env), config, Clock(), Clock().sleep, deadline=0, find=find)
    assert not m.is_multipart() and m.get_content().strip() == ""


def test_a_cpu_job_gets_slurm_s_notice(config: Config) -> None:
    def find(n: Notice, c: Config) -> Any:
        raise NoGpus("job 327 had no GPUs")
    m = prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000, find=find)
    assert not m.is_multipart() and m.get_content().strip() == ""


def test_opted_out_users_and_small_jobs_get_slurm_s_notice(config: Config, idle_report: Any,
                                                          tmp_path: Path) -> None:
    (tmp_path / "optout").write_text("# users who asked\nalice\n")
    config.mail_opt_out_file = str(tmp_path / "optout")
    m = prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000, find=lambda n, c: idle_report)
    assert not m.is_multipart()
    config.mail_opt_out_file, config.mail_min_gpus = "", 4  # the job had 2
    m = prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000, find=lambda n, c: idle_report)
    assert not m.is_multipart()


def test_one_report_a_job_whichever_mail_asks_first(config: Config, idle_report: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prog, "find_report", lambda n, c: idle_report)
    box, clock = Outbox(config.mail_spool_dir).make(), Clock()
    sent = []
    for env in ({**ENV, "SLURM_JOB_MAIL_TYPE": "Reached time limit"},
                {**ENV, "SLURM_JOB_MAIL_TYPE": "Failed", "SLURM_JOB_STATE": "TIMEOUT"}):
        taken = box.claim(box.request(END_SUBJECT, "alice", env, clock()))
        assert taken is not None
        (name,) = prog.make_message(box, taken, config, clock, clock.sleep)
        sent.append(email.message_from_bytes((box.outbox / f"{name}.eml").read_bytes(),
                                             policy=email.policy.default))
    assert sent[0].is_multipart() and not sent[1].is_multipart()
    assert "went out with an earlier mail" in sent[1].get_content()


def test_a_report_that_never_reached_the_outbox_was_not_sent(config: Config, idle_report: Any) -> None:
    """The mark is made once the message is in the outbox, not when it is built."""
    key: list[str] = []
    prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000, find=lambda n, c: idle_report,
               report_key=key)
    again = prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000,
                       find=lambda n, c: idle_report)
    assert key and again.is_multipart()


def test_a_request_is_taken_once(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path)).make()
    request = box.request(END_SUBJECT, "alice", ENV, 1.0)
    assert box.claim(request) is not None and box.claim(request) is None


def test_a_bad_request_is_set_aside_and_flush_goes_on(config: Config, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No job id anywhere (someone's test of the MailProg) and a job name Python's email
    package would refuse in a header: Slurm's notice still goes out; a request that cannot
    give even that is set aside, and the rest of the spool is sent."""
    box = Outbox(config.mail_spool_dir).make()
    box.request("test", "root", {}, 1.0)
    box.request("Slurm Job_id=7 Name=a\x85Bcc: x@y Began", "alice", {}, 1.0)
    (box.requests / "0-broken.json").write_text("{not json")
    server = Recorder()
    later = time.time() + 1e6  # long after: a worker should have finished them
    assert prog.flush(config, server, clock=lambda: later) == 0
    assert sorted(s for s, _ in server.sent) == ["Slurm Job_id=7 Name=a Bcc: x@y Began", "test"]
    assert [p.name for p in box.requests.iterdir()] == ["0-broken.json.corrupt"]
    assert prog.flush(config, server, clock=lambda: later) == 0 and len(server.sent) == 2  # nothing twice


# -- the spool ---------------------------------------------------------------------------------

class Recorder:
    def __init__(self, fail: int = 0) -> None:
        self.fail, self.sent = fail, []  # type: ignore[var-annotated]

    def send(self, message: EmailMessage, to: list[str]) -> None:
        if self.fail:
            self.fail -= 1
            raise MailError("SMTP localhost:25: [Errno 111] Connection refused")
        self.sent.append((str(message["Subject"]), to))


def test_the_server_away_the_message_waits_doubling_then_goes_once(tmp_path: Path) -> None:
    box, server = Outbox(str(tmp_path)).make(), Recorder(fail=2)
    name = box.post(plain_notice(notice(), "slurm@example.org"), ["alice"], 1000.0)
    assert box.deliver(server, 1000.0, 60, 1800, 86400).waiting == [name]
    assert box.deliver(server, 1030.0, 60, 1800, 86400).waiting == [name]  # not due before 1060
    assert box.deliver(server, 1060.0, 60, 1800, 86400).waiting == [name]  # second failure
    assert box.next_due() == 1060.0 + 120
    assert box.deliver(server, 1180.0, 60, 1800, 86400).sent == [name]
    assert box.deliver(server, 9999.0, 60, 1800, 86400).sent == []
    assert server.sent == [(END_SUBJECT, ["alice"])] and box.names() == []


def test_a_recipient_refused_for_good_is_not_retried_and_the_others_not_sent_again(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path)).make()
    name = box.post(plain_notice(notice(recipient="alice,bob"), "slurm@example.org"), ["alice", "bob"], 1.0)

    class Partial(Recorder):
        def send(self, message: EmailMessage, to: list[str]) -> None:
            self.sent.append((str(message["Subject"]), to))
            raise MailError("refused bob", permanent=False, refused=["bob"])

    server = Partial()
    assert box.deliver(server, 1.0, 60, 1800, 86400).waiting == [name]
    box.deliver(server, 100.0, 60, 1800, 86400)
    assert [to for _, to in server.sent] == [["alice", "bob"], ["bob"]]  # alice had it
    gone = Recorder(fail=0)
    gone.send = lambda m, to: (_ for _ in ()).throw(MailError("550 no such user", permanent=True))  # type: ignore[method-assign]
    assert box.deliver(gone, 1000.0, 60, 1800, 86400).given_up == [name]


def test_given_up_after_retry_for_s_and_kept(tmp_path: Path) -> None:
    box, server = Outbox(str(tmp_path)).make(), Recorder(fail=99)
    name = box.post(plain_notice(notice(), "slurm@example.org"), ["alice"], 1000.0)
    assert box.deliver(server, 1000.0 + 86400, 60, 1800, 86400).given_up == [name]
    assert (tmp_path / "failed" / f"{name}.eml").exists() and box.names() == []


def test_a_message_being_sent_is_not_sent_by_another_worker(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path)).make()
    name = box.post(plain_notice(notice(), "slurm@example.org"), ["alice"], 1000.0)
    with box._locked(name) as held:
        assert held
        assert box.deliver(Recorder(), 1000.0, 60, 1800, 86400).sent == []
    assert box.deliver(Recorder(), 1000.0, 60, 1800, 86400).sent == [name]


def test_the_spool_is_slurmuser_s_alone(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "m")).make()
    box.post(plain_notice(notice(), "slurm@example.org"), ["alice"], 1.0)
    for path in [box.root, *box.root.rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, path


# -- a real SMTP server (aiosmtpd) --------------------------------------------------------------

@pytest.fixture
def smtp_port() -> int:
    return free_port()


@pytest.fixture
def smtp_server(smtp_port: int) -> Iterator[Callable[[], Inbox]]:
    server = Server(smtp_port)
    yield server.start
    server.stop()


def test_mailprog_to_a_real_smtp_server_down_then_up(config: Config, smtp_port: int,
                                                     smtp_server: Callable[[], Inbox],
                                                     idle_report: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's call returns at once; the worker's message waits while the server is down
    and arrives once when it is up, with both parts."""
    config.mail_smtp_host, config.mail_smtp_port = "127.0.0.1", smtp_port
    monkeypatch.setattr(prog, "load_config", lambda path=None: config)
    monkeypatch.setattr(prog, "find_report", lambda n, c: idle_report)
    assert prog.mailprog(["-s", END_SUBJECT, "alice"], ENV, detach=False) == 0
    (request,) = Outbox(config.mail_spool_dir).requests.glob("*.json")
    clock, inbox = Clock(), None

    def sleep(seconds: float) -> None:
        nonlocal inbox
        clock.sleep(seconds)
        if inbox is None:
            inbox = smtp_server()  # the server comes back while the worker waits

    transport = Smtp("127.0.0.1", smtp_port, timeout_s=5)
    assert prog.work(request, clock, sleep, config, transport) == 0
    assert inbox is not None and len(inbox.messages) == 1
    (to, message), = inbox.messages
    assert to == ["alice"] and message.get_content_type() == "multipart/alternative"
    assert str(message["Subject"]).endswith("GPU efficiency 40%: 1 of 2 GPUs idle")
    assert not request.exists() and Outbox(config.mail_spool_dir).names() == []
    assert prog.flush(config, transport, clock) == 0 and len(inbox.messages) == 1  # nothing twice


def test_a_broken_config_hands_slurm_s_notice_to_mail(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No settings to send with: Slurm's own way (mail -s SUBJECT RCPT), not nothing."""
    bad = tmp_path / "gpueff.toml"
    bad.write_text('[mail]\nsmtp_port = "many"\n')
    monkeypatch.setenv("GPUEFF_CONFIG", str(bad))
    calls: list[list[str]] = []
    monkeypatch.setattr(prog.os, "access", lambda path, mode: path == "/usr/bin/mail")
    monkeypatch.setattr(prog.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or type("Done", (), {"returncode": 0})())
    assert prog.mailprog(["-s", END_SUBJECT, "alice"], ENV, detach=False) == 0
    assert calls == [["/usr/bin/mail", "-s", END_SUBJECT, "alice"]]


def test_gpueff_mail_returns_to_slurm_at_once_and_its_worker_holds_nothing_of_slurm_s(
        tmp_path: Path) -> None:
    """slurmctld reads the MailProg's output until end of file, and kills its process
    group at 120 s: the MailProg must close its end at once, and the worker (here kept
    waiting for a mail server that is not there) live in a session of its own."""
    import os
    import signal
    import subprocess
    import sys

    conf = write_config(tmp_path / "gpueff.toml", {"mail": {
        "enabled": False, "smtp_host": "127.0.0.1", "smtp_port": free_port(),
        "spool_dir": str(tmp_path / "spool"), "log_file": str(tmp_path / "mail.log"), "retry_s": 30,
    }})
    program = Path(sys.executable).parent / "gpueff-mail"
    started = time.monotonic()
    proc = subprocess.Popen([str(program), "-s", END_SUBJECT, "alice"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**ENV, "GPUEFF_CONFIG": str(conf)})
    out, err = proc.communicate(timeout=30)  # returns at end of file on both pipes
    took = time.monotonic() - started
    # A MailProg that did its worker's waiting (for the report, for the server: retry_s
    # 30 s) would hold the pipes for half a minute and more: the bar is well under that,
    # and over the seconds a Python's start-up can take on a loaded machine.
    assert proc.returncode == 0 and took < 15, (took, err)
    workers = []
    for _ in range(50):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"--work" in cmdline and str(tmp_path).encode() in cmdline:
                    workers.append(int(entry.name))
        if workers:
            break
        time.sleep(0.1)
    try:
        assert workers, "no worker started"
        (worker,) = workers
        assert os.getsid(worker) == worker != os.getsid(0)  # a session (and group) of its own
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGKILL)


def test_the_mailprog_exits_0_within_seconds_whatever_fails(config: Config, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """No spool to write and no mail server: Slurm's notice is tried directly, the failure
    said on stderr (slurmctld logs it), and the MailProg still exits 0, fast."""
    (tmp_path / "file").write_text("")
    config.mail_spool_dir = str(tmp_path / "file" / "spool")  # under a file: cannot be made
    config.mail_smtp_host, config.mail_smtp_port = "127.0.0.1", free_port()
    monkeypatch.setattr(prog, "load_config", lambda path=None: config)
    started = time.monotonic()
    assert prog.main(["-s", END_SUBJECT, "alice"], ENV) == 0
    assert time.monotonic() - started < 5
    assert "Slurm's notice not sent" in capsys.readouterr().err
    assert prog.main(["-s", END_SUBJECT], ENV) == 0  # no recipient: said, and 0


def test_the_end_mail_of_a_job_the_idle_policy_cancelled_says_so(config: Config, idle_report: Any) -> None:
    from slurm_gpu_eff.mail.idle import Ledger

    reason = "gpueff: cancelled by the idle-GPU policy: GPU 1 on gpu1 under 5% utilisation for 15 min"
    record = {"alerted_at": 1.0, "cancelled_at": 2.0, "reason": reason}
    Ledger(Outbox(config.mail_spool_dir).make()).make().put("gpueffdev-327-1700000000", record)
    m = prog.build(notice(), config, Clock(), Clock().sleep, deadline=2000, find=lambda n, c: idle_report)
    text, html = m.get_payload()  # type: ignore[misc]
    line = ("This job was cancelled by the idle-GPU policy: GPU 1 on gpu1 under 5% utilisation "
            "for 15 min.")
    assert line in text.get_content()
    assert "This job was cancelled by the idle-GPU policy" in html.get_payload()[0].get_content()
    other = prog.build(notice(SLURM_JOB_ID="32"), config, Clock(), Clock().sleep, deadline=2000,
                       find=lambda n, c: idle_report)
    assert "cancelled" not in other.get_payload()[0].get_content()  # type: ignore[index]


def test_a_job_over_whose_figures_are_still_a_live_copy_is_not_ready(make_job: Any,
                                                                      make_summary: Any) -> None:
    """A cancelled job's mail comes while its epilog still stops the sampler."""
    from slurm_gpu_eff.model import RUNNING

    live = build_report(make_job(state="CANCELLED"), [make_summary(status=RUNNING)])
    assert live.status == "partial" and not prog._ready(live)
    assert prog._ready(build_report(make_job(state="CANCELLED"), [make_summary()]))
    assert not prog._ready(build_report(make_job(state="RUNNING"), [make_summary()]))


def test_help_says_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert prog.main(["--help"], {}) == 0
    out = capsys.readouterr().out
    assert all(mode in out for mode in ("-s SUBJECT RECIPIENT", "--watch", "--idle-check", "--flush"))


# -- a flood of job ends: at most [mail] workers at once -------------------------------------

def requests_for(config: Config, *jobs: str) -> list[Path]:
    box = Outbox(config.mail_spool_dir).make()
    return [box.request(END_SUBJECT.replace("327", job), "alice", {**ENV, "SLURM_JOB_ID": job}, 1000.0 + i)
            for i, job in enumerate(jobs)]


def test_a_worker_takes_the_requests_no_worker_took_once_done_with_its_own(
        config: Config, idle_report: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prog, "find_report", lambda n, c: idle_report)
    first, *others = requests_for(config, "327", "328", "329")
    server, clock = Recorder(), Clock()
    assert prog.work(first, clock, clock.sleep, config, server) == 0
    assert [subject.split()[1] for subject, _ in server.sent] == ["Job_id=327", "Job_id=328", "Job_id=329"]
    assert not any(r.exists() for r in others) and Outbox(config.mail_spool_dir).names() == []


def test_every_slot_held_a_worker_leaves_its_request_to_those_at_it(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slots are flocks: held here as another worker's would be. Before, every job's
    end started a process that waited for its report: a thousand at once."""
    config.mail_workers = 2
    (request,) = requests_for(config, "327")
    box, server, clock = Outbox(config.mail_spool_dir), Recorder(), Clock()
    started: list[Path] = []

    def start(config: Config, request: Path, slot: int | None) -> None:
        assert slot is not None
        probe = os.open(box.root / "worker-0.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):  # the worker is given the slot, held
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        started.append(request)

    monkeypatch.setattr(prog, "load_config", lambda path=None: config)
    monkeypatch.setattr(prog, "_start_worker", start)
    held = [box.take_slot(2), box.take_slot(2)]
    assert None not in held and box.take_slot(2) is None
    assert prog.work(request, clock, clock.sleep, config, server) == 0
    assert request.exists() and server.sent == []  # left for the workers at it
    assert prog.mailprog(["-s", END_SUBJECT, "alice"], ENV) == 0
    assert started == []  # no process started only to find the slots held
    os.close(held.pop(0))  # a worker ends
    assert prog.mailprog(["-s", END_SUBJECT, "alice"], ENV) == 0
    assert len(started) == 1  # a slot free: a worker, and the slot is let go here once it has it
    assert box.take_slot(2) is not None
    os.close(held[0])


def test_flush_starts_a_worker_for_requests_no_worker_took(config: Config,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed before it looked again leaves the requests it was to take; the
    watch service's flush starts one for them, not only once they are old."""
    (request,) = requests_for(config, "327")
    started: list[Path] = []
    monkeypatch.setattr(prog, "_start_worker", lambda c, r, slot: started.append(r))
    assert prog.flush(config, Recorder(), Clock()) == 0
    assert started == [request]


def test_a_taken_request_is_young_to_flush_until_its_taker_had_time(tmp_path: Path) -> None:
    """Flush takes requests whose worker should have finished: one just taken is not,
    however long it waited in the queue (a rename keeps the time it was written)."""
    box = Outbox(str(tmp_path)).make()
    request = box.request(END_SUBJECT, "alice", ENV, 1.0)
    os.utime(request, (1.0, 1.0))
    taken = box.claim(request)
    assert taken is not None and box.pending_requests(60, time.time()) == []


def test_a_config_without_mail_workers_is_an_error(tmp_path: Path) -> None:
    from slurm_gpu_eff.config import load_config
    from slurm_gpu_eff.errors import ConfigError

    path = tmp_path / "gpueff.toml"
    path.write_text("[mail]\nworkers = 0\n")
    with pytest.raises(ConfigError, match=r"\[mail\] workers must be at least 1"):
        load_config(str(path))


def test_a_request_that_cannot_be_taken_stops_the_draining_not_the_sending(
        config: Config, idle_report: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A request the worker cannot rename would come back first at every look: the worker
    stops draining there, says so, and still sends what it made."""
    monkeypatch.setattr(prog, "find_report", lambda n, c: idle_report)
    own, stuck = requests_for(config, "327", "328")
    claim = Outbox.claim

    def refuse(box: Outbox, request: Path) -> Path | None:
        if request == stuck:
            raise PermissionError(13, "Permission denied")
        return claim(box, request)

    monkeypatch.setattr(Outbox, "claim", refuse)
    server, clock = Recorder(), Clock()
    assert prog.work(own, clock, clock.sleep, config, server) == 0
    assert [subject.split()[1] for subject, _ in server.sent] == ["Job_id=327"]
    assert stuck.exists() and "cannot take mail request" in caplog.text


# -- issue 20: as a site installs it ([mail] domain, the mail log, mail(1), comment_field) --------

class Capture:
    """A transport that keeps each message and its envelope recipients."""

    def __init__(self) -> None:
        self.sent: list[tuple[EmailMessage, list[str]]] = []

    def send(self, message: EmailMessage, to: list[str]) -> None:
        self.sent.append((message, to))


def test_the_job_end_mail_puts_mail_domain_after_a_bare_user_name(
        config: Config, idle_report: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """[mail] domain, as the idle alerts use it: the mail went to `To: alice`. An address
    with its own domain is kept."""
    monkeypatch.setattr(prog, "find_report", lambda n, c: idle_report)
    config.mail_domain = "example.org"
    box = Outbox(config.mail_spool_dir).make()
    request = box.request(END_SUBJECT, "alice,bob@elsewhere.org", ENV, 1000.0)
    server, clock = Capture(), Clock()
    assert prog.work(request, clock, clock.sleep, config, server) == 0
    ((message, to),) = server.sent
    assert to == ["alice@example.org", "bob@elsewhere.org"]
    assert message["To"] == "alice@example.org, bob@elsewhere.org"


def test_slurm_s_notice_sent_directly_gets_the_mail_domain_too(
        config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    config.mail_spool_dir = str(tmp_path / "file" / "spool")  # no spool: the notice goes directly
    config.mail_domain = "example.org"
    server = Capture()
    monkeypatch.setattr(prog, "load_config", lambda path=None: config)
    monkeypatch.setattr(prog, "transport_for", lambda config, timeout_s=30.0: server)
    assert prog.main(["-s", END_SUBJECT, "alice"], ENV) == 0
    ((message, to),) = server.sent
    assert to == ["alice@example.org"] and message["To"] == "alice@example.org"


def test_the_domain_is_added_only_to_bare_names_and_checked_with_them() -> None:
    assert recipients("alice, bob@b.org", "example.org") == ["alice@example.org", "bob@b.org"]
    assert recipients("alice", "@example.org") == ["alice@example.org"]  # Slurm's MailDomain has no @
    assert recipients("alice", "") == ["alice"]
    with pytest.raises(ValueError, match="not a mail address"):
        recipients("alice", "example.org -oQ/tmp")


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """prog's logger as a new process finds it: no handler yet."""
    monkeypatch.setattr(prog.log, "handlers", [])
    yield
    for handler in prog.log.handlers:
        handler.close()


def test_the_mail_log_is_made_0600(config: Config, fresh_log: None) -> None:
    """It names users and their jobs; it was made 0644."""
    old = os.umask(0o022)
    try:
        prog._logging(config)
    finally:
        os.umask(old)
    prog.log.info("sent job 327 of alice")
    assert Path(config.mail_log_file).stat().st_mode & 0o777 == 0o600
    assert "sent job 327 of alice" in Path(config.mail_log_file).read_text()


def test_the_mail_log_is_never_written_through_a_symlink(config: Config, tmp_path: Path, fresh_log: None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "elsewhere"
    Path(config.mail_log_file).symlink_to(target)
    prog._logging(config)
    prog.log.info("sent job 327 of alice")
    assert not target.exists()
    assert "mail log" in capsys.readouterr().err  # said where it can be, stderr


def test_the_worker_s_stderr_is_never_opened_through_a_symlink(config: Config, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "elsewhere"
    Path(config.mail_log_file).symlink_to(target)
    given: list[int] = []
    monkeypatch.setattr(prog.subprocess, "Popen", lambda argv, **kw: given.append(kw["stderr"]))
    prog._start_worker(config, tmp_path / "request.json", None)
    assert not target.exists() and len(given) == 1


def test_the_worker_s_stderr_log_is_made_0600(config: Config, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prog.subprocess, "Popen", lambda argv, **kw: None)
    old = os.umask(0o022)
    try:
        prog._start_worker(config, tmp_path / "request.json", None)
    finally:
        os.umask(old)
    assert Path(config.mail_log_file).stat().st_mode & 0o777 == 0o600


@pytest.fixture
def mail_1(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """/usr/bin/mail, as Slurm's default MailProg: the argument lists it was run with."""
    calls: list[list[str]] = []
    monkeypatch.setattr(prog.os, "access", lambda path, mode: path == "/usr/bin/mail")
    monkeypatch.setattr(prog.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or type("Done", (), {"returncode": 0})())
    return calls


def test_mail_1_gets_no_recipient_that_could_be_an_option_or_a_header(
        mail_1: list[list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    assert prog._as_slurm_would(END_SUBJECT, ["-oQ/tmp/x", "alice,bob smith", "carol\nBcc: x@y",
                                              "dave@example.org"]) == 0
    assert mail_1 == [["/usr/bin/mail", "-s", END_SUBJECT, "alice", "dave@example.org"]]
    err = capsys.readouterr().err
    assert err.count("refused") == 3 and "-oQ/tmp/x" in err


def test_mail_1_is_not_run_when_no_recipient_is_an_address(
        mail_1: list[list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    assert prog._as_slurm_would(END_SUBJECT, ["-oQ/tmp/x"]) == 1
    assert mail_1 == [] and "Slurm's notice is not sent" in capsys.readouterr().err


def test_a_broken_config_still_hands_no_option_to_mail_1(tmp_path: Path, mail_1: list[list[str]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Through gpueff-mail's own arguments: after "--", Slurm's RECIPIENT could be anything."""
    bad = tmp_path / "gpueff.toml"
    bad.write_text('[mail]\nsmtp_port = "many"\n')
    monkeypatch.setenv("GPUEFF_CONFIG", str(bad))
    assert prog.mailprog(["-s", END_SUBJECT, "--", "-oQ/tmp/x", "alice"], ENV, detach=False) == 0
    assert mail_1 == [["/usr/bin/mail", "-s", END_SUBJECT, "alice"]]


def test_the_job_end_report_reads_our_line_from_the_configured_comment_field(
        tmp_path: Path, make_summary: Callable[..., Any]) -> None:
    """[slurm] comment_field = "SystemComment": the mail's report is gpueff JOBID's, so
    sacct is asked for that field, and the figures come from it."""
    from slurm_gpu_eff.config import load_config
    from slurm_gpu_eff.mirror import admin_comment
    from slurm_gpu_eff.slurm.sacct import FIELDS
    from tests.unit.test_slurm import FIXTURES, fake_sacct

    line = admin_comment([make_summary(node="gpu2", utils=(90.0, 10.0))], 2).lower()
    rows = (FIXTURES / "completed_2gpu.txt").read_text().splitlines()
    rows[0] += line  # the allocation's row, whose last column is empty: our line there
    (tmp_path / "rows.txt").write_text("\n".join(rows) + "\n")
    args = tmp_path / "args"
    script = fake_sacct(tmp_path, f'printf "%s\\n" "$@" > {args}\nemit {tmp_path / "rows.txt"}\n')
    config = load_config(str(write_config(tmp_path / "gpueff.toml", {
        "store": {"path": str(tmp_path / "absent.db")},
        "slurm": {"sacct": str(script), "comment_field": "SystemComment"}})))
    report = prog.find_report(notice(SLURM_JOB_ID="4242"), config)
    assert [g.util_mean for g in report.gpus] == [90.0, 10.0]
    assert args.read_text().splitlines()[5] == "--format=" + ",".join(FIELDS).replace(
        "AdminComment", "SystemComment")
