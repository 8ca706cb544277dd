"""Idle-GPU alerts on running jobs (issue 11, part 5) on the development cluster: the
samplers report an idle stretch, `gpueff-mail --watch` (started by `make cluster`) mails
the user once at the configured minute, cancels the job at the next with the reason in
sacct, and the end-of-job mail says so; an exempt job gets neither. The policy is turned
on here, in the cluster's gpueff.toml ($GPUEFF_CONFIG), for this module's jobs only (minutes shrunk to
seconds: the cluster's clock is the wall clock)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.smtp import Server

from .conftest import Cluster, with_settings

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # the idle policy is on for every job meanwhile
DOMAIN = "gpueffdev.invalid"
ALERT_S = 15.0  # idle_alert_min = 0.25
CANCEL_S = 15.0  # idle_cancel_min = 0.25
BUSY_S = 4


@pytest.fixture(scope="module")
def idle_policy(cluster: Cluster) -> Iterator[None]:
    conf = cluster.config_file
    before = conf.read_text()
    policy = {"idle_alert_min": ALERT_S / 60, "idle_cancel_min": CANCEL_S / 60,
              "idle_opt_out_word": "gpueff:idle-ok"}
    conf.write_text(with_settings(before, "mail", policy))
    try:
        yield
    finally:
        conf.write_text(before)


def idle_job(cluster: Cluster, user: str, idle_s: int, *args: str) -> str:
    profile = cluster.profile([{"seconds": BUSY_S, "gpus": {"0": {"util": 90, "power_w": 400}}},
                               {"seconds": idle_s, "gpus": {"0": {"util": 0}}}])
    return cluster.submit_profile(user, profile, "--gres=gpu:1", "--mail-type=END", *args)


def start_of(cluster: Cluster, job: str) -> float:
    out = cluster.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=Start"]).out.strip()
    return time.mktime(time.strptime(out, "%Y-%m-%dT%H:%M:%S"))


def test_an_idle_gpu_job_is_alerted_once_then_cancelled_and_its_end_mail_says_so(
    cluster: Cluster, smtp: Server, idle_policy: None,
) -> None:
    job = idle_job(cluster, "alice", 120)
    exempt = idle_job(cluster, "bob", 40, "--comment=please keep gpueff:idle-ok")
    # the alert: once, at the configured minute of idleness
    alert = smtp.inbox.wait(job, timeout=90, settle=0)
    arrived = time.time()
    (to, message), = alert
    assert to == [f"alice@{DOMAIN}"]
    subject = str(message["Subject"])
    assert subject.startswith(f"Slurm Job_id={job} Name=") and ": 1 of 1 GPUs idle for 1" in subject, subject
    body = message.get_content()
    assert f"scancel {job}" in body and "will be cancelled at about" in body
    idle_from = start_of(cluster, job) + BUSY_S
    assert ALERT_S - 2 <= arrived - idle_from <= ALERT_S + 20, arrived - idle_from
    # cancelled, the reason in sacct
    state = cluster.wait_done(job, timeout=120)
    assert state.startswith("CANCELLED"), state
    messages = smtp.inbox.wait(job, timeout=90, settle=3, subject=" Ended, ")  # the last to come
    subjects = sorted(str(m["Subject"]) for _, m in messages)
    assert len(messages) == 3, subjects  # the alert, the cancelling, Slurm's end mail with the report
    [cancelled] = [m for _, m in messages if " cancelled: GPU idle for " in str(m["Subject"])]
    assert f"sacct -j {job}" in cancelled.get_content()
    [end] = [m for _, m in messages if " Ended, " in str(m["Subject"])]
    assert end.is_multipart()
    assert "This job was cancelled by the idle-GPU policy" in end.get_payload()[0].get_content()  # type: ignore[index]
    # the reason in sacct, before the figures' line the job's final mirror wrote
    cluster.wait_mirrored(job)
    comment = cluster.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=AdminComment"]).out.lower()
    assert comment.startswith("gpueff: cancelled by the idle-gpu policy: gpu 0 on"), comment
    assert " gpueff1 status=complete " in comment, comment
    # cancelled not long after the cancel minute (the policy's two minutes plus a check)
    ended = time.mktime(time.strptime(cluster.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=End"])
                                      .out.strip(), "%Y-%m-%dT%H:%M:%S"))
    assert ALERT_S + CANCEL_S - 2 <= ended - idle_from <= ALERT_S + CANCEL_S + 25, ended - idle_from
    # the exempt job: idle as long, neither alerted nor cancelled
    assert cluster.wait_done(exempt, timeout=120) == "COMPLETED"
    (to, message), = smtp.inbox.wait(exempt, timeout=90, settle=4)
    assert " Ended, " in str(message["Subject"]) and "cancelled" not in message.get_payload()[0].get_content()  # type: ignore[index]


def test_a_job_that_never_opens_its_gpu_is_alerted_and_cancelled_on_every_release(
    cluster: Cluster, smtp: Server, idle_policy: None,
) -> None:
    """No process of the job ever on a GPU: on cgroup v2 (no device list) its binding stays
    unverified, yet every look at the node's GPUs found none of its processes: the job used
    no GPU, whichever are its own. Alerted, then cancelled (issue 20's open decision)."""
    job = cluster.submit("alice", "sleep 150", "--gres=gpu:1", "--mail-type=END")
    (to, message), = smtp.inbox.wait(job, timeout=90, settle=0)
    assert to == [f"alice@{DOMAIN}"] and ": 1 of 1 GPUs idle for " in str(message["Subject"])
    assert cluster.wait_done(job, timeout=120).startswith("CANCELLED")
    cluster.wait_mirrored(job)  # the final summary is stored
    summary, = cluster.summaries(job).values()
    binding = summary["binding"]
    assert binding["status"] == "verified" or binding.get("gpu_use") == "none", binding
