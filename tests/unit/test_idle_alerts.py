"""Idle-GPU alerts on running jobs (issue 11, part 5): the sampler's open idle stretch,
the check over the store (a real SQLite store), the site's exemptions, one alert a job
run, cancelling only after the alert had its minutes, and the messages."""

from __future__ import annotations

import email
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_gpu_eff import model
from slurm_gpu_eff.config import Config, load_config
from slurm_gpu_eff.errors import SlurmError
from slurm_gpu_eff.mail import idle, prog
from slurm_gpu_eff.mail.outbox import MailError, Outbox
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import GpuStats, Sampler
from slurm_gpu_eff.slurm import commands
from slurm_gpu_eff.slurm.access import connect
from slurm_gpu_eff.slurm.base import Slurm
from slurm_gpu_eff.slurm.commands import Commands
from slurm_gpu_eff.slurm.records import RunningJob
from slurm_gpu_eff.store import open_store
from slurm_gpu_eff.store.base import Store
from tests.configfile import write_config

Factory = Callable[..., model.NodeSummary]
NOW = 1_790_000_000.0
HOSTILE = "x\nBcc: victim@example.org <b>"


# -- the node: the stretch a GPU is in now --------------------------------------------------------

def test_the_open_idle_stretch_is_where_it_began_and_how_long_it_is_so_far() -> None:
    track = GpuStats(gpu=None)  # type: ignore[arg-type]
    for t, util in enumerate([90, 1, 0, 2], start=1):
        track._add_idle(NOW + t, 1.0, float(util))
    assert track.idle_now() == (NOW + 1, 3.0)  # from t=1 (the poll stands for the second before)
    track._add_idle(NOW + 5, 1.0, 50.0)
    assert track.idle_now() is None  # busy again: no stretch open
    assert track.idle_longest == (1.0, 3.0)  # the finished one is still the longest


def test_a_poll_without_a_utilisation_reading_ends_the_stretch() -> None:
    """Issue 20, finding 8: 10 minutes measured idle, then 80 minutes of failed reads,
    then one idle poll is a stretch of one poll, not 90 minutes (past a cancel line)."""
    track = GpuStats(gpu=None)  # type: ignore[arg-type]
    t = 0
    for _ in range(600):
        t += 1
        track._add_idle(NOW + t, 1.0, 0.0)
    assert track.idle_now() == (NOW, 600.0)
    for _ in range(4800):
        t += 1
        track._add_idle(NOW + t, 1.0, None)
    assert track.idle_now() is None  # no reading: no evidence of idleness
    t += 1
    track._add_idle(NOW + t, 1.0, 0.0)
    assert track.idle_now() == (NOW + t - 1, 1.0)
    assert track.idle_longest == (0.0, 600.0)


def test_a_wall_clock_step_does_not_lengthen_the_stretch(sim_node: Any) -> None:
    """Issue 20, finding 8: the sampler counts an idle stretch in the monotonic clock's
    seconds; the driver's (wall) clock stepping 80 minutes ahead between two polls adds
    one poll's second, not 80 minutes."""
    from .conftest import BOOT

    sim_node.write_state(0, {"phases": [{"seconds": 100_000, "gpus": {"*": {"util": 0}}}]},
                         started_at=BOOT + 950.0)
    session = sim_node.session()
    mono = [500.0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0])
    for step in (1.0, 1.0, 1.0, 4800.0 + 1.0, 1.0):  # the wall clock steps before the 4th poll
        sim_node.now += step
        mono[0] += 1.0
        sampler.sample_once()
    since, seconds = sampler.gpus[0].idle_now()  # type: ignore[misc]
    assert since == BOOT + 1000.0 and seconds == pytest.approx(5.0)
    assert sampler.idle_level() == 0  # nowhere near an alert minute


def test_a_sampler_stopped_for_minutes_ends_the_stretch_rather_than_extends_it(sim_node: Any) -> None:
    """A gap no reading covered (the sampler stopped two minutes, both clocks moving):
    the stretch starts again at the poll after it, the unread time not counted."""
    from .conftest import BOOT

    sim_node.write_state(0, {"phases": [{"seconds": 100_000, "gpus": {"*": {"util": 0}}}]},
                         started_at=BOOT + 950.0)
    session = sim_node.session()
    mono = [500.0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0])
    for step in (1.0, 1.0, 120.0, 1.0, 1.0):  # stopped before the 3rd poll
        sim_node.now += step
        mono[0] += step
        sampler.sample_once()
    assert sampler.gpus[0].idle_now() == (BOOT + 1122.0, pytest.approx(2.0))
    assert sampler.gpus[0].idle_longest == (0.0, pytest.approx(2.0))


def test_the_stretch_counts_the_simulation_s_seconds_under_a_time_scale(sim_node: Any) -> None:
    """The simulated driver runs `time_scale` times the wall clock: so does the stretch."""
    from .conftest import BOOT

    sim_node.write_state(0, {"phases": [{"seconds": 100_000, "gpus": {"*": {"util": 0}}}]},
                         started_at=BOOT + 950.0)
    session = sim_node.session()
    mono = [500.0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0], time_scale=10.0)
    for _ in range(3):
        sim_node.now += 10.0
        mono[0] += 1.0
        sampler.sample_once()
    assert sampler.gpus[0].idle_now() == (BOOT + 1000.0, pytest.approx(30.0))


@pytest.mark.parametrize(("alert_min", "cancel_min", "idle_s", "level"), [
    (0, 0, 10_000, 0),  # the policy is off
    (10, 0, 599, 0), (10, 0, 600, 1), (10, 0, 10_000, 1),  # no cancelling: never level 2
    (10, 5, 899, 1), (10, 5, 900, 2),
])
def test_the_sampler_knows_which_minute_of_the_policy_the_longest_stretch_passed(
    alert_min: float, cancel_min: float, idle_s: float, level: int,
) -> None:
    busy, idle_gpu = GpuStats(gpu=None), GpuStats(gpu=None)  # type: ignore[arg-type]
    busy._add_idle(NOW + idle_s, 1.0, 90.0)
    idle_gpu._add_idle(NOW, 0.0, 0.0)
    idle_gpu._add_idle(NOW + idle_s, idle_s, 0.0)  # one poll standing for idle_s
    fake = SimpleNamespace(config=Config(idle_alert_min=alert_min, idle_cancel_min=cancel_min),
                           gpus=[busy, idle_gpu])
    assert Sampler.idle_level(fake) == level  # type: ignore[arg-type]


# -- the controller: what the store says ---------------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite://{tmp_path / 'gpueff.db'}") as opened:
        yield opened


VERIFIED = {"status": "verified", "evidence": ["job 500's processes on its GPUs"]}


def running(make_summary: Factory, idle_s: tuple[float | None, ...], job_id: str = "500",
            node: str = "gpu1", sampled_until: float = NOW, run: float = NOW - 7200,
            **kw: Any) -> model.NodeSummary:
    kw.setdefault("binding", VERIFIED)
    summary = make_summary(node=node, status=model.RUNNING, utils=tuple(50.0 for _ in idle_s), job_id=job_id,
                           sampled_until=sampled_until, ended_at=None, run_started_at=run, **kw)
    for g, seconds in zip(summary.gpus, idle_s, strict=True):
        g.idle_now = None if seconds is None else {"since": sampled_until - seconds, "seconds": seconds}
    return summary


def test_only_running_jobs_with_a_gpu_idle_past_the_alert_minute_and_a_fresh_copy_are_found(
    store: Store, make_summary: Factory,
) -> None:
    store.put(running(make_summary, (None, 700.0), job_id="500"))  # GPU 1 idle 11.7 min
    store.put(running(make_summary, (None, 700.0), job_id="500", node="gpu2"))
    store.put(running(make_summary, (300.0,), job_id="501"))  # idle, not long enough yet
    store.put(running(make_summary, (900.0,), job_id="502", sampled_until=NOW - 3600))  # its sampler is gone
    store.put(make_summary(job_id="503", utils=(0.0,)))  # over
    found = idle.idle_jobs(store, fresh=NOW - 600, alert_s=600, cluster="gpueffdev")
    assert [(j.job_id, j.gpu_count, [(g.node, g.index) for g in j.gpus]) for j in found] == [
        ("500", 4, [("gpu1", 1), ("gpu2", 1)])]
    assert found[0].longest_s == 700.0 and found[0].gpus[0].since == NOW - 700
    assert (found[0].user, found[0].nodes, found[0].started) == ("alice", ("gpu1", "gpu2"), NOW - 7200)


# -- the policy -------------------------------------------------------------------------------------

def job(**changes: Any) -> RunningJob:
    """The job squeue shows: the store's run of `running()` (alice's, on gpu1 and gpu2,
    started when its prolog ran)."""
    base = RunningJob(job_id="500", name="train", user="alice", account="physics", partition="gpu",
                       state="RUNNING", batch=True, comment="", time_limit="4:00:00", run_time="1:00:00",
                       nodes="gpu[1-2]", tres="cpu=8,mem=16G,node=2,billing=8,gres/gpu=4",
                       task_id="500", start_at=NOW - 7200)
    return replace(base, **changes)


@pytest.mark.parametrize(("changes", "settings", "why"), [
    ({}, {}, None),
    ({"batch": False}, {}, "an interactive job"),
    ({"batch": False}, {"idle_interactive": True}, None),
    ({}, {"idle_exempt_users": "bob, alice"}, "user alice is exempt"),
    ({}, {"idle_exempt_accounts": "physics"}, "account physics is exempt"),
    ({"comment": "debug session gpueff:idle-ok please"}, {}, "its comment holds 'gpueff:idle-ok'"),
    ({"comment": "gpueff:idle-ok"}, {"idle_opt_out_word": ""}, None),  # no word configured
])
def test_exemptions(changes: dict[str, Any], settings: dict[str, Any], why: str | None) -> None:
    policy = idle.Policy.from_config(Config(idle_alert_min=10, **settings))
    assert policy.exempt(job(**changes)) == why


# -- one pass, and the next ----------------------------------------------------------------------

class FakeSlurm(Slurm):
    """Slurm's side, recorded: this cluster's name, the jobs it holds (by their own id)
    and what it was asked to cancel (by the task's id)."""

    def __init__(self, **jobs: RunningJob) -> None:
        super().__init__()
        self.name = "gpueffdev"
        self.jobs = dict(jobs)
        self.cancelled: list[tuple[str, str]] = []
        self.fail_cancel = ""
        self.fail_job: dict[str, Exception] = {}

    def cluster(self) -> str:
        return self.name

    def running_job(self, job_id: str) -> RunningJob | None:
        if job_id in self.fail_job:
            raise self.fail_job[job_id]
        return self.jobs.get(job_id)

    def cancel(self, job_id: str, cluster: str, reason: str, sleep: Any = None) -> None:
        if self.fail_cancel:
            raise SlurmError(self.fail_cancel)
        self.cancelled.append((job_id, reason))
        self.jobs = {k: j for k, j in self.jobs.items() if j.task_id != job_id}


class Server:
    """A mail server that takes everything."""

    def __init__(self) -> None:
        self.took: list[email.message.Message] = []

    def send(self, message: email.message.Message, to: list[str]) -> None:
        self.took.append(message)


def deliver(box: Outbox, at: float) -> Server:
    """What waits in the outbox, taken by the mail server at `at`."""
    server = Server()
    box.deliver(server, at, 60, 1800, 86400)  # type: ignore[arg-type]
    return server


@pytest.fixture
def policy_config(tmp_path: Path) -> Config:
    return Config(idle_alert_min=10, idle_cancel_min=5, mail_spool_dir=str(tmp_path / "mail"),
                  mail_from="slurm@cluster.example", mail_domain="cluster.example", live_s=45,
                  idle_check_s=60)


def sent(box: Outbox) -> list[email.message.Message]:
    return [email.message_from_bytes((box.outbox / f"{n}.eml").read_bytes(), policy=email.policy.default)
            for n in box.names()]


def test_one_alert_a_job_run_then_a_cancel_after_its_minutes_then_nothing(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (None, 600.0)))
    assert idle.check(policy_config, store, slurm, box, NOW) == ["job 500: alerted alice (GPU idle 10.0 min)"]
    [alert] = sent(box)
    assert alert["To"] == "alice@cluster.example"
    assert alert["Subject"] == "Slurm Job_id=500 Name=train: 1 of 2 GPUs idle for 10 min"
    body = alert.get_content()
    assert "GPU 1 on gpu1 (device minor 1): idle since" in body and "scancel 500" in body
    assert "cancelled at about" in body and "gpueff:idle-ok" in body
    assert "cpu=8,mem=16G,node=2,billing=8,gres/gpu=4" in body and "time limit 4:00:00" in body
    assert deliver(box, NOW + 1).took  # the mail server took it a second later
    # the next passes: the GPU still idle, but not yet 5 min after the alert -> nothing
    store.put(running(make_summary, (None, 900.0), sampled_until=NOW + 300))
    assert idle.check(policy_config, store, slurm, box, NOW + 300) == []
    # 15 min idle and 5 min since the alert reached the server: cancelled, with the reason, and told
    store.put(running(make_summary, (None, 901.0), sampled_until=NOW + 301))
    [done] = idle.check(policy_config, store, slurm, box, NOW + 301)
    assert done.startswith(
        "job 500: cancelled (gpueff: cancelled by the idle-GPU policy: GPU 1 on gpu1")
    [(job_id, reason)] = slurm.cancelled
    assert job_id == "500" and "under 5% utilisation for 15 min since" in reason
    notice = [m for m in sent(box) if "cancelled" in m["Subject"]]
    assert [m["Subject"] for m in notice] == ["Slurm Job_id=500 Name=train cancelled: GPU idle for 15 min"]
    assert "sacct -j 500 -o JobID,State,AdminComment" in notice[0].get_content()
    # what the end mail adds
    assert idle.cancelled_note(policy_config, "gpueffdev", "500").startswith(
        "This job was cancelled by the idle-GPU policy: GPU 1 on gpu1")
    assert idle.cancelled_note(policy_config, "gpueffdev", "50") == ""  # no prefix match
    # and never again, whatever the store still says
    slurm.jobs["500"] = job()
    assert idle.check(policy_config, store, slurm, box, NOW + 900) == []
    assert len(box.names()) == 1  # the cancel's notice; the alert went out


def test_no_cancel_on_an_old_copy_and_none_once_the_alerted_stretch_ended(
    store: Store, make_summary: Factory, policy_config: Config, caplog: pytest.LogCaptureFixture,
) -> None:
    """Review of issue 20: a copy older than live_s + idle_check_s (+30 s) may be from before
    the GPU went back to work: the cancel waits for a fresh one. And a stretch other than
    the alerted one (the GPU worked, or a gap ended it) cancels nothing, said once."""
    caplog.set_level(logging.INFO, logger="gpueff.mail")
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (None, 600.0)))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    deliver(box, NOW + 1)
    # due (15 min idle, 5 min after delivery), but the copy is 140 s old: > 45 + 60 + 30
    store.put(running(make_summary, (None, 901.0), sampled_until=NOW + 301))
    assert idle.check(policy_config, store, slurm, box, NOW + 441) == [] and slurm.cancelled == []
    # a newer copy: the GPU worked meanwhile, and idles again in a stretch of its own
    store.put(running(make_summary, (None, 900.0), sampled_until=NOW + 1500))
    assert idle.check(policy_config, store, slurm, box, NOW + 1500) == [] and slurm.cancelled == []
    [said] = [m for m in warned(caplog, logging.WARNING) if "ended" in m]
    assert said.startswith("job 500: the idle stretch alerted at ") and "not cancelled" in said
    assert idle.check(policy_config, store, slurm, box, NOW + 1510) == []
    assert len([m for m in warned(caplog, logging.WARNING) if "ended" in m]) == 1  # said once


def test_a_malformed_copy_is_its_own_job_s_trouble_alone(
    store: Store, make_summary: Factory, caplog: pytest.LogCaptureFixture,
) -> None:
    bad = running(make_summary, (700.0,), job_id="501")
    bad.gpus[0].idle_now = {"seconds": 700.0}  # no "since"
    store.put(bad)
    store.put(running(make_summary, (700.0,), job_id="502"))
    assert [j.job_id for j in idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")] == ["502"]
    assert any("job 501's running summary cannot be read" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("body", [
    '{"status": "hibernating", "job_id": "501", "node": "gpu1"}',  # a newer release's status
    "{not json", "[1, 2]", "null", "[" * 100_000 + "]" * 100_000,  # nested past the decoder
    '{"status": "running", "job_id": 501, "node": "gpu1", "cluster": "gpueffdev"}',  # a number
])
def test_a_stored_body_not_ours_is_logged_and_skipped_not_the_end_of_every_alert(
    store: Store, make_summary: Factory, caplog: pytest.LogCaptureFixture, body: str,
) -> None:
    """One row a hand or a newer release left (NodeSummary.from_json: SpoolError) stops
    the alerts of no other job: before, a status unknown here raised out of idle_jobs."""
    store.put(running(make_summary, (700.0,), job_id="501"))
    store.put(running(make_summary, (700.0,), job_id="502"))
    store.db.execute("update node_summaries set body = ? where job_id = '501'", [body])  # type: ignore[attr-defined]
    store.db.conn.commit()  # type: ignore[attr-defined]
    assert [j.job_id for j in idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")] == ["502"]
    assert any("running summary the store holds cannot be read" in r.getMessage()
               for r in caplog.records)


def test_figures_past_a_float_are_their_own_job_s_trouble_alone(
    store: Store, make_summary: Factory, caplog: pytest.LogCaptureFixture,
) -> None:
    bad = running(make_summary, (700.0,), job_id="501")
    bad.gpus[0].idle_now = {"since": 1, "seconds": 10**400}  # float() of it: OverflowError
    store.put(bad)
    store.put(running(make_summary, (700.0,), job_id="502"))
    assert [j.job_id for j in idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")] == ["502"]
    assert any("job 501's running summary cannot be read: OverflowError" in r.getMessage()
               for r in caplog.records)


def test_a_watcher_that_was_away_alerts_first_and_cancels_only_minutes_later(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    """Idle far past both minutes when first seen: the user still gets the alert's minutes."""
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    assert idle.check(policy_config, store, slurm, box, NOW + 60) == []
    assert slurm.cancelled == []


def test_a_gpu_that_works_again_is_not_cancelled(store: Store, make_summary: Factory,
                                                 policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    deliver(box, NOW)
    store.put(running(make_summary, (None,), sampled_until=NOW + 600))  # busy again
    assert idle.check(policy_config, store, slurm, box, NOW + 600) == []
    store.put(running(make_summary, (620.0,), sampled_until=NOW + 1300))  # a new stretch, short of 15 min
    assert idle.check(policy_config, store, slurm, box, NOW + 1300) == []
    assert slurm.cancelled == [] and box.names() == []


def test_an_exempt_job_gets_neither_alert_nor_cancel_and_is_logged_once(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job(comment="gpueff:idle-ok")})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW) == [
        "job 500: GPU idle, no alert: its comment holds 'gpueff:idle-ok'"]
    assert idle.check(policy_config, store, slurm, box, NOW + 3600) == []
    assert box.names() == [] and slurm.cancelled == []


def test_alerts_only_when_the_site_does_not_cancel(store: Store, make_summary: Factory,
                                                   tmp_path: Path) -> None:
    config = Config(idle_alert_min=10, mail_spool_dir=str(tmp_path / "mail"))
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(config.mail_spool_dir).make()
    store.put(running(make_summary, (99_999.0,)))
    idle.check(config, store, slurm, box, NOW)
    assert idle.check(config, store, slurm, box, NOW + 86_400) == []
    [alert] = sent(box)
    assert alert["To"] == "alice"  # no [mail] domain: the mail server's local user
    assert "cancelled" not in alert.get_content()
    assert slurm.cancelled == []


def test_a_job_gone_from_slurm_and_the_policy_off_do_nothing(store: Store, make_summary: Factory,
                                                             policy_config: Config) -> None:
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(policy_config, store, FakeSlurm(), box, NOW) == []
    off = Config(mail_spool_dir=policy_config.mail_spool_dir)
    assert idle.check(off, store, FakeSlurm(**{"500": job()}), box, NOW) == []
    assert box.names() == []


def test_a_cancel_slurm_refuses_is_said_once_and_not_tried_again(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    deliver(box, NOW)
    slurm.fail_cancel = "Access/permission denied"
    store.put(running(make_summary, (1300.0,), sampled_until=NOW + 400))
    assert idle.check(policy_config, store, slurm, box, NOW + 400) == [
        "job 500: cancelling failed: Access/permission denied"]
    assert idle.check(policy_config, store, slurm, box, NOW + 500) == []
    assert idle.cancelled_note(policy_config, "gpueffdev", "500") == ""


def test_a_hostile_job_name_adds_no_header(store: Store, make_summary: Factory,
                                           policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job(name=HOSTILE)})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    [alert] = sent(box)
    assert alert["Bcc"] is None and "victim" not in str(alert["To"])
    assert "\n" not in alert["Subject"]
    assert "x?Bcc: victim@example.org <b>" in alert.get_content()  # one line in the body


def test_a_recipient_that_is_no_address_is_not_mailed(store: Store, make_summary: Factory,
                                                      policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job(user="-oQ/tmp/x")})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    assert box.names() == []


def test_a_broken_record_leaves_the_job_alone(store: Store, make_summary: Factory,
                                              policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    ledger = idle.Ledger(box).make()
    key = idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")[0].key
    (ledger.root / f"{key}.json").write_text("{not json")
    assert idle.check(policy_config, store, slurm, box, NOW) == []
    assert box.names() == []


def test_two_checkers_at_once_take_turns(store: Store, make_summary: Factory, policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    with idle.Ledger(box).make().turn() as mine:
        assert mine
        assert idle.check(policy_config, store, slurm, box, NOW) == []  # the other one holds it
    assert len(idle.check(policy_config, store, slurm, box, NOW)) == 1


# -- Slurm's side, with stand-in commands --------------------------------------------------------

def fake_command(tmp_path: Path, name: str, script: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def fake_squeue(tmp_path: Path, rows: list[list[str]]) -> str:
    """squeue printing `rows`, each field followed by the delimiter its -O argument gives
    (what it finds between JobID's and JobArrayID's names); the time format it was run
    with goes into tmp_path/time_format."""
    table = tmp_path / "squeue-rows"
    table.write_text("".join("|".join(row) + "\n" for row in rows))
    return fake_command(tmp_path, "squeue", f"""
form=$5
d=$(printf '%s' "$form" | sed 's/^JobID:0//; s/,JobArrayID:0.*//')
printf '%s' "$SLURM_TIME_FORMAT" > {tmp_path}/time_format
awk -F'|' -v d="$d" '{{for (i = 1; i <= NF; i++) printf "%s%s", $i, d; printf "\\n"}}' {table}
""")


def squeue_row(job_id: str = "500", task_id: str = "500", name: str = "train", user: str = "alice",
               nodes: str = "gpu[1-2]", start: float = NOW - 7200) -> list[str]:
    return [job_id, task_id, name, user, "physics", "gpu", "RUNNING", "1", "(null)", "4:00:00", "2:00:00",
            nodes, "cpu=1,gres/gpu=2", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))]


def test_squeue_fields_come_by_their_delimiter_so_a_name_forges_nothing(tmp_path: Path) -> None:
    guess = "evil\x1f0000000000000000\x1froot"  # a delimiter guessed ahead of time
    found = commands.job_now("500", fake_squeue(tmp_path, [squeue_row(name=guess)]))
    assert found is not None
    assert (found.user, found.batch, found.comment, found.task_id) == ("alice", True, "", "500")
    assert found.name == guess  # all of it the name
    assert found.start_at == NOW - 7200 and found.nodes == "gpu[1-2]"
    assert (tmp_path / "time_format").read_text() == "%s"  # epoch seconds, whatever the site's is
    epoch = commands.job_now("500", fake_squeue(tmp_path, [squeue_row()[:-1] + [str(int(NOW - 7200))]]))
    assert epoch is not None and epoch.start_at == NOW - 7200


def test_squeue_listing_a_whole_array_gives_the_task_whose_own_id_was_asked(tmp_path: Path) -> None:
    """Issue 20, finding 4: the array's last task keeps the array's id as its own, and
    `squeue -j` on it lists every task: the row of that id is the job, named 500_3."""
    squeue = fake_squeue(tmp_path, [squeue_row("501", "500_1", user="bob"), squeue_row("502", "500_2"),
                                     squeue_row("500", "500_3")])
    found = commands.job_now("500", squeue)
    assert found is not None and (found.job_id, found.task_id) == ("500", "500_3")
    assert commands.job_now("502", squeue).task_id == "500_2"  # type: ignore[union-attr]
    assert commands.job_now("503", squeue) is None  # not among them: gone


def test_squeue_that_no_longer_knows_the_job_means_it_ended(tmp_path: Path) -> None:
    squeue = fake_command(tmp_path, "squeue",
                          'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    assert commands.job_now("500", squeue) is None
    empty = fake_command(tmp_path, "squeue2", "exit 0\n")
    assert commands.job_now("500", empty) is None


def test_squeue_with_fields_missing_is_an_error_not_a_guess(tmp_path: Path) -> None:
    squeue = fake_command(tmp_path, "squeue", 'echo "500 train alice"\n')
    with pytest.raises(SlurmError, match="fields for job 500"):
        commands.job_now("500", squeue)


def test_the_cancel_reason_goes_into_the_field_that_holds_our_figures() -> None:
    slurm = connect(Config(comment_field="SystemComment", slurm_backend="commands"))
    assert slurm.name == "commands" and slurm.field == "SystemComment"


def test_the_cluster_is_the_one_slurmctld_names(tmp_path: Path) -> None:
    shown = "AccountingStorageType   = x\\nClusterName             = gpueffdev\\nPrivateData = jobs\\n"
    scontrol = fake_command(tmp_path, "scontrol", f'printf "{shown}"\n')
    assert commands.cluster_name(scontrol) == "gpueffdev"
    with pytest.raises(SlurmError, match="names no ClusterName"):
        commands.cluster_name(fake_command(tmp_path, "scontrol2", "echo PrivateData = jobs\n"))
    with pytest.raises(SlurmError, match="Unable to contact"):
        commands.cluster_name(fake_command(tmp_path, "scontrol3",
                                       "echo 'Unable to contact slurm controller' >&2; exit 1\n"))


def cancel_job(job_id: str, cluster: str, reason: str, commands: dict[str, str], sleep: Any,
               field: str = "AdminComment") -> None:
    """A cancel through Slurm's commands, these ones."""
    Commands(Config(**commands, comment_field=field)).cancel(job_id, cluster, reason, sleep=sleep)


# -- the service ---------------------------------------------------------------------------------

def test_the_service_pass_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = Config(idle_alert_min=1, store_url="nosuch://x", mail_spool_dir=str(tmp_path / "mail"),
                    mail_log_file=str(tmp_path / "mail.log"))
    assert prog.idle_pass(config, slurm=FakeSlurm()) == 1  # the store URL is wrong: logged
    assert "idle check failed" in caplog.text


def test_the_policy_keys_in_the_config_file(tmp_path: Path) -> None:
    path = write_config(tmp_path / "gpueff.toml", {
        "mail": {"idle_alert_min": 30, "idle_cancel_min": 0, "idle_exempt_users": "bob,carol",
                 "idle_interactive": True},
        "slurm": {"scancel": "/usr/bin/scancel"},
    })
    config = load_config(str(path))
    assert (config.idle_alert_min, config.idle_cancel_min, config.idle_interactive) == (30, 0, True)
    assert idle.Policy.from_config(config).users == {"bob", "carol"}
    assert config.scancel == "/usr/bin/scancel"


def test_the_ledger_is_the_mail_spools_and_private(tmp_path: Path) -> None:
    ledger = idle.Ledger(Outbox(str(tmp_path / "mail")).make()).make()
    ledger.put("c-1-2", {"alerted_at": 1.0})
    assert ledger.root.stat().st_mode & 0o777 == 0o700
    assert (ledger.root / "c-1-2.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((ledger.root / "c-1-2.json").read_text()) == {"alerted_at": 1.0}


def test_old_records_are_pruned(tmp_path: Path, store: Store) -> None:
    config = Config(idle_alert_min=10, mail_spool_dir=str(tmp_path / "mail"))
    box = Outbox(config.mail_spool_dir).make()
    ledger = idle.Ledger(box).make()
    ledger.put("c-1-2", {"alerted_at": 1.0})
    ledger.put("c-3-4", {"alerted_at": 1.0})
    os.utime(ledger.root / "c-1-2.json", (NOW - idle.KEEP_S - 1,) * 2)
    os.utime(ledger.root / "c-3-4.json", (NOW - 60,) * 2)
    idle.check(config, store, FakeSlurm(), box, NOW)
    assert sorted(p.name for p in ledger.root.glob("*.json")) == ["c-3-4.json"]


# -- the reason in the AdminComment -----------------------------------------------------------------

@pytest.mark.parametrize(("current", "expected"), [
    ("", "gpueff: cancelled"),
    ("site text", "site text gpueff: cancelled"),
    ("gpueff1 status=running util=1.0", "gpueff: cancelled gpueff1 status=running util=1.0"),
    ("site gpueff1 status=running", "site gpueff: cancelled gpueff1 status=running"),
    ("site gpueff: cancelled gpueff1 status=running", "site gpueff: cancelled gpueff1 status=running"),
])
def test_the_note_goes_before_our_line_once(current: str, expected: str) -> None:
    from slurm_gpu_eff.mirror import with_note, with_site_text

    assert with_note(current, "gpueff: cancelled") == expected
    site = expected.split(" gpueff1 ")[0]  # and the next mirror, replacing our line, keeps it
    assert with_site_text(expected, "gpueff1 status=complete") == f"{site} gpueff1 status=complete"


def test_cancelling_writes_the_reason_then_cancels_then_looks_again(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    admin = tmp_path / "admin"
    admin.write_text("gpueff1 status=running util=1.0")
    sacct = fake_command(tmp_path, "sacct", f'''echo "sacct $*" >> {calls}
d=$(printf '%s\\n' "$@" | sed -n 's/^--delimiter=//p')
printf '%s%s%s%s500%s500\\n' "$(cat {admin})" "$d" "cpu=1" "$d" "$d"
''')
    sacctmgr = fake_command(tmp_path, "sacctmgr", f'''echo "sacctmgr $*" >> {calls}
for a in "$@"; do case $a in AdminComment=*) printf '%s' "${{a#AdminComment=}}" > {admin};; esac; done
''')
    scancel = fake_command(tmp_path, "scancel", f'echo "scancel $*" >> {calls}\n'
                                                f'echo "gpueff1 status=running util=2.0" > {admin}\n')
    commands = {"sacct": sacct, "sacctmgr": sacctmgr, "scancel": scancel, "scontrol": "/bin/false"}
    cancel_job("500", "gpueffdev", "gpueff: cancelled by policy", commands, sleep=lambda s: None)
    said = calls.read_text().splitlines()
    assert [line.split()[0] for line in said] == ["sacct", "sacctmgr", "scancel", "sacct", "sacctmgr"]
    assert "cluster=gpueffdev" in said[1]
    # the live mirror clobbered the note after the cancel: written back, before our line
    assert admin.read_text() == "gpueff: cancelled by policy gpueff1 status=running util=2.0"


def test_a_cancel_slurm_refuses_raises(tmp_path: Path) -> None:
    sacct = fake_command(tmp_path, "sacct", "exit 0\n")
    sacctmgr = fake_command(tmp_path, "sacctmgr", "exit 0\n")
    scancel = fake_command(tmp_path, "scancel",
                           'echo "scancel: error: Access/permission denied" >&2; exit 1\n')
    with pytest.raises(SlurmError, match="Access/permission denied"):
        cancel_job("500", "c", "gpueff: x", {"sacct": sacct, "sacctmgr": sacctmgr, "scancel": scancel,
                                             "scontrol": "/bin/false"}, sleep=lambda s: None)


def test_the_alert_goes_to_the_job_s_owner_whatever_its_comment_says(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job(comment="x MailUser=victim@evil.example")})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (900.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    [alert] = sent(box)
    assert alert["To"] == "alice@cluster.example"


def test_a_suspended_job_is_neither_alerted_nor_cancelled(store: Store, make_summary: Factory,
                                                         policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job(state="SUSPENDED")})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW) == []
    assert box.names() == [] and slurm.cancelled == []


def test_a_multi_node_job_is_one_job_however_its_nodes_started(store: Store, make_summary: Factory,
                                                               policy_config: Config) -> None:
    """Two nodes' samplers started 0.2 s apart, across a second's boundary: one alert."""
    store.put(running(make_summary, (900.0,), node="gpu1", run=NOW - 7200.9))
    store.put(running(make_summary, (900.0,), node="gpu2", run=NOW - 7200.7 + 0.0))
    store.put(running(make_summary, (900.0,), node="gpu2", run=NOW - 86_400, sampled_until=NOW))  # requeued
    [found] = idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")
    assert sorted(g.node for g in found.gpus) == ["gpu1", "gpu2"] and found.run == int(NOW - 7200.9)
    box = Outbox(policy_config.mail_spool_dir).make()
    assert len(idle.check(policy_config, store, FakeSlurm(**{"500": job()}), box, NOW)) == 1
    assert len(box.names()) == 1


def test_a_later_stretch_is_not_cancelled_on_the_first_one_s_alert(store: Store, make_summary: Factory,
                                                                    policy_config: Config) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    idle.check(policy_config, store, slurm, box, NOW)  # alerted: the stretch since NOW - 600
    deliver(box, NOW)
    # the GPU worked, then idled again for 15 min: a stretch of its own, not alerted
    store.put(running(make_summary, (900.0,), sampled_until=NOW + 3600))
    assert idle.check(policy_config, store, slurm, box, NOW + 3600) == []
    assert slurm.cancelled == []


def test_a_cancel_whose_second_note_fails_is_still_a_cancel(tmp_path: Path) -> None:
    flag = tmp_path / "cancelled"
    sacct = fake_command(tmp_path, "sacct", f'[ -e {flag} ] && exit 1\n'
                                            "d=$(printf '%s\\n' \"$@\" | sed -n 's/^--delimiter=//p')\n"
                                            'printf "%s%s%s%s500%s500\\n" "" "$d" "cpu=1" "$d" "$d"\n')
    sacctmgr = fake_command(tmp_path, "sacctmgr", "exit 0\n")
    scancel = fake_command(tmp_path, "scancel", f"touch {flag}\n")
    cancel_job("500", "c", "gpueff: x", {"sacct": sacct, "sacctmgr": sacctmgr, "scancel": scancel,
                                         "scontrol": "/bin/false"}, sleep=lambda s: None)
    assert flag.exists()


# -- issue 20: a cancel only on evidence that cannot be another job's or a misreading ----------------

def warned(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpueff.mail" and r.levelno == level]


@pytest.mark.parametrize(("binding", "status"), [
    ({"status": "mismatch", "evidence": ["job 500's processes on minor 2, not its own"]}, "mismatch"),
    ({"status": "unverified", "evidence": ["no process of the job was seen on a GPU yet"]}, "unverified"),
    (None, "not checked"),  # a sampler from before the check
])
def test_a_job_whose_gpus_are_not_verified_its_own_on_every_node_is_left_alone_and_the_admins_told(
    binding: dict[str, Any] | None, status: str, store: Store, make_summary: Factory, policy_config: Config,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 1: a lying gres map makes the sampler read a GPU the job does not use, idle
    while the job works. Neither alert nor cancel: the mail log tells the admins, once."""
    caplog.set_level(logging.INFO, logger="gpueff.mail")
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,), node="gpu1"))
    store.put(running(make_summary, (3600.0,), node="gpu2", binding=binding))
    assert idle.check(policy_config, store, slurm, box, NOW) == []
    store.put(running(make_summary, (7200.0,), node="gpu1", sampled_until=NOW + 3600))
    store.put(running(make_summary, (7200.0,), node="gpu2", sampled_until=NOW + 3600, binding=binding))
    assert idle.check(policy_config, store, slurm, box, NOW + 3600) == []  # said once, the minutes grown
    assert box.names() == [] and slurm.cancelled == []
    [told] = warned(caplog, logging.ERROR)
    assert told.startswith("job 500 (alice): GPU 0 on gpu1 reads idle for 60 min, but the sampler could not "
                           f"verify that the GPUs it read are the job's: {status} on gpu2")
    assert "Neither alerted nor cancelled" in told and "gpu1" not in told.split(": ", 2)[2].split(".")[0]


def test_an_unverified_binding_whose_job_used_no_gpu_anywhere_is_no_doubt(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    """cgroup v2 lists no devices: a job that never opens its GPU stays unverified. When
    every look at the node's GPUs found none of its processes, it used no GPU, whichever
    are its own: alerted (and later cancelled) like a verified one."""
    unused = {"status": "unverified", "gpu_use": "none",
              "evidence": ["no process of the job on any GPU of the node in 600 looks at all of them"]}
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,), binding=unused))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    unknown = {**unused, "gpu_use": "unknown"}
    store.put(running(make_summary, (600.0,), node="gpu2", binding=unknown))
    assert idle.binding_doubt(idle.idle_jobs(store, NOW - 600, 600, "gpueffdev")[0]) is not None


def test_a_binding_found_wrong_after_the_alert_stops_the_cancel(
    store: Store, make_summary: Factory, policy_config: Config, caplog: pytest.LogCaptureFixture,
) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    deliver(box, NOW)
    store.put(running(make_summary, (1200.0,), sampled_until=NOW + 600,
                      binding={"status": "mismatch", "evidence": ["minor 2 is not the job's"]}))
    assert idle.check(policy_config, store, slurm, box, NOW + 600) == []
    assert slurm.cancelled == [] and box.names() == []
    assert "mismatch on gpu1 (minor 2 is not the job's)" in warned(caplog, logging.ERROR)[0]


def test_the_watch_acts_on_its_own_cluster_s_rows_only(store: Store, make_summary: Factory,
                                                       policy_config: Config) -> None:
    """Finding 2: one store for two clusters. Job 500 of cluster `other` idles; this
    cluster's job 500 is someone else's: it is not looked at."""
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,), cluster="other"))
    assert idle.check(policy_config, store, slurm, box, NOW) == []
    assert box.names() == [] and slurm.cancelled == []
    assert [j.job_id for j in idle.idle_jobs(store, NOW - 600, 600, "other")] == ["500"]
    assert idle.idle_jobs(store, NOW - 600, 600, "gpueffdev") == []


@pytest.mark.parametrize(("changes", "why"), [
    ({"user": "bob"}, "squeue's job 500 belongs to 'bob', the store's run to 'alice'"),
    ({"nodes": "gpu[3-4]"}, "squeue's job 500 runs on 'gpu[3-4]', not on gpu1"),
    ({"start_at": NOW - 600}, "squeue's job 500 started at "),  # another run of this id
    ({"start_at": NOW - 7200 + 60}, "squeue's job 500 started at "),  # after the store's run's prolog
    ({"start_at": None}, "squeue gave no start time for job 500"),
    ({"task_id": ""}, "squeue gave no id for job 500's own task"),
])
def test_a_job_squeue_shows_that_is_not_the_store_s_run_is_left_alone_and_said_why_once(
    changes: dict[str, Any], why: str, store: Store, make_summary: Factory, policy_config: Config,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 2: before it mails or cancels, the watch confirms that the job squeue
    returns is the store's run: its user, the store's nodes among its own, its start
    when the run's first prolog ran."""
    caplog.set_level(logging.INFO, logger="gpueff.mail")
    slurm = FakeSlurm(**{"500": job(**changes)})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW) == []
    assert idle.check(policy_config, store, slurm, box, NOW + 60) == []
    assert box.names() == [] and slurm.cancelled == []
    [said] = warned(caplog, logging.WARNING)
    assert said.startswith("job 500: left alone: " + why), said


def test_the_store_s_run_is_known_with_its_prolog_late_and_a_node_yet_to_report(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    """The prolog runs after the allocation (20 s on a loaded node here); squeue's start
    is whole seconds; gpu2 has not reported yet: all of that is still the store's run."""
    slurm = FakeSlurm(**{"500": job(start_at=NOW - 7220.0)})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,), run=NOW - 7200.0))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    slurm.jobs["500"] = job(start_at=NOW - 7199.0)  # prolog 0.9 s before squeue's whole second
    store.put(running(make_summary, (3600.0,), job_id="501", run=NOW - 7199.9))
    slurm.jobs["501"] = job(job_id="501", task_id="501", start_at=NOW - 7199.0)
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 501: alerted")


def test_a_job_that_is_no_longer_the_store_s_run_at_the_cancel_is_not_cancelled(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    deliver(box, NOW)
    slurm.jobs["500"] = job(user="bob", start_at=NOW + 100)  # the store's copy is stale; the id is bob's now
    store.put(running(make_summary, (1200.0,), sampled_until=NOW + 600))
    assert idle.check(policy_config, store, slurm, box, NOW + 600) == []
    assert slurm.cancelled == []


def test_one_job_s_error_stops_no_other_job_s_check(store: Store, make_summary: Factory,
                                                    policy_config: Config,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Finding 4: squeue failing on job 500 (or a bug on it) is job 500's alone."""
    slurm = FakeSlurm(**{"501": job(job_id="501", task_id="501")})
    slurm.fail_job["500"] = SlurmError("squeue failed: Socket timed out on send/recv operation")
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,), job_id="500"))
    store.put(running(make_summary, (3600.0,), job_id="501"))
    assert idle.check(policy_config, store, slurm, box, NOW) == ["job 501: alerted alice (GPU idle 60.0 min)"]
    assert "job 500: idle check failed: squeue failed: Socket timed out" in caplog.text
    slurm.fail_job["500"] = KeyError("a bug")
    store.put(running(make_summary, (3600.0,), job_id="502"))
    slurm.jobs["502"] = job(job_id="502", task_id="502")
    assert idle.check(policy_config, store, slurm, box, NOW) == ["job 502: alerted alice (GPU idle 60.0 min)"]
    assert "KeyError: 'a bug'" in caplog.text  # a bug is logged in full


def test_an_array_task_is_checked_through_squeue_and_named_by_its_own_id(
    tmp_path: Path, store: Store, make_summary: Factory,
) -> None:
    """Finding 4: job 500 is the array's last task (500_3); `squeue -j 500` lists the
    whole array. It is found, alerted, and its mail names 500_3 (`scancel 500` would end
    every task)."""
    squeue = fake_squeue(tmp_path, [squeue_row("501", "500_1", user="bob"), squeue_row("500", "500_3")])
    scontrol = fake_command(tmp_path, "scontrol", "echo 'ClusterName = gpueffdev'\n")
    config = Config(idle_alert_min=10, idle_cancel_min=5, mail_spool_dir=str(tmp_path / "mail"),
                    mail_domain="cluster.example", squeue=squeue, scontrol=scontrol)
    box = Outbox(config.mail_spool_dir).make()
    store.put(running(make_summary, (3600.0,)))
    assert idle.check(config, store, Commands(config), box, NOW) == [
        "job 500: alerted alice (GPU idle 60.0 min)"]
    [alert] = sent(box)
    assert str(alert["Subject"]).startswith("Slurm Job_id=500_3 Name=train: 1 of 1 GPUs idle")
    assert "scancel 500_3" in alert.get_content() and "scancel 500\n" not in alert.get_content()


def test_an_array_task_is_cancelled_by_its_own_id_not_the_array_s(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    slurm = FakeSlurm(**{"500": job(task_id="500_3")})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    idle.check(policy_config, store, slurm, box, NOW)
    deliver(box, NOW)
    store.put(running(make_summary, (900.0,), sampled_until=NOW + 300))
    [done] = idle.check(policy_config, store, slurm, box, NOW + 300)
    assert done.startswith("job 500: cancelled")
    assert [job_id for job_id, _ in slurm.cancelled] == ["500_3"]


def test_the_cancel_minutes_count_from_the_alert_s_delivery_not_its_queueing(
    store: Store, make_summary: Factory, policy_config: Config,
) -> None:
    """Finding 5: the mail server is away for half an hour; the alert waits in the
    outbox, and the job is not cancelled until 5 minutes after its owner could read it."""
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    assert idle.check(policy_config, store, slurm, box, NOW)[0].startswith("job 500: alerted")
    store.put(running(make_summary, (2400.0,), sampled_until=NOW + 1800))
    assert idle.check(policy_config, store, slurm, box, NOW + 1800) == []
    [waiting] = idle.idle_jobs(store, NOW, 600, "gpueffdev")
    assert slurm.cancelled == [] and box.holds(idle.alert_name(waiting))
    deliver(box, NOW + 1800)  # the server is back
    store.put(running(make_summary, (2699.0,), sampled_until=NOW + 2099))
    assert idle.check(policy_config, store, slurm, box, NOW + 2099) == []
    store.put(running(make_summary, (2700.0,), sampled_until=NOW + 2100))
    assert idle.check(policy_config, store, slurm, box, NOW + 2100)[0].startswith("job 500: cancelled")


def test_an_alert_that_never_went_out_cancels_nothing(store: Store, make_summary: Factory,
                                                      policy_config: Config,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    slurm = FakeSlurm(**{"500": job()})
    box = Outbox(policy_config.mail_spool_dir).make()
    store.put(running(make_summary, (600.0,)))
    idle.check(policy_config, store, slurm, box, NOW)

    class Refusing:
        def send(self, message: Any, to: list[str]) -> None:
            raise MailError("550 no such user", permanent=True)

    assert box.deliver(Refusing(), NOW + 10, 60, 1800, 86400).given_up  # type: ignore[arg-type]
    for at in (NOW + 600, NOW + 7200):
        store.put(running(make_summary, (600.0 + at - NOW,), sampled_until=at))
        assert idle.check(policy_config, store, slurm, box, at) == []
    assert slurm.cancelled == []
    assert warned(caplog, logging.ERROR) == [
        "job 500: the idle alert was never delivered (given up: the spool's failed/): the job will not "
        "be cancelled"]
