"""gpueff-mail as the development cluster's MailProg (issue 11): slurmctld runs it for the
jobs' mails, and a real SMTP server (aiosmtpd) on 127.0.0.1:8025, the cluster's [mail]
setting, receives what it sends."""

from __future__ import annotations

import shlex
import time

import pytest

from tests.smtp import Server

from .conftest import Cluster, with_settings

pytestmark = [pytest.mark.cluster]
DOMAIN = "gpueffdev.invalid"
HOSTILE = "x\nBcc: victim@example.org <b>"


def lines(text: str, head: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith(head)]


def gpu_job(cluster: Cluster, *args: str) -> str:
    half = cluster.profile([{"seconds": 6, "gpus": {"0": {"util": 80, "power_w": 400}, "1": {"util": 0}}}])
    return cluster.submit_profile("alice", half, "--gres=gpu:2", *args)


def test_a_gpu_job_s_end_mail_carries_its_report(cluster: Cluster, smtp: Server) -> None:
    job = cluster.wait_played(gpu_job(cluster, "--mail-type=END"))
    (to, message), = smtp.inbox.wait(job)
    assert to == [f"alice@{DOMAIN}"] and message["To"] == f"alice@{DOMAIN}"
    own = cluster.run(["gpueff", job, "--json"]).json()
    subject = str(message["Subject"])
    assert subject.startswith(f"Slurm Job_id={job} Name=") and " Ended, Run time " in subject
    assert subject.endswith(f"; GPU efficiency {own['gpu_util_mean']:.0f}%: 1 of 2 GPUs idle"), subject
    assert message.get_content_type() == "multipart/alternative"
    text, html = message.get_payload()  # type: ignore[misc]
    assert text.get_content_type() == "text/plain"
    body = text.get_content()
    assert f"Job ID: {job}" in body and "Idle GPUs: 1 of 2" in body and "Verdict:" in body
    printed = cluster.run(["gpueff", job]).out  # what gpueff JOBID prints: the same figures
    for head in ("GPU-hours:", "GPU Utilisation:", "GPU Energy:", "Idle GPUs:", "Verdict:"):
        assert lines(body, head) == lines(printed, head) != [], head
    page, *images = html.get_payload()
    assert page.get_content_type() == "text/html" and "How to do better" in page.get_content()
    assert [i.get_content_type() for i in images] == ["image/png"] * 2  # a chart per GPU


def test_begin_and_a_cpu_job_get_slurm_s_plain_notice(cluster: Cluster, smtp: Server) -> None:
    begun = gpu_job(cluster, "--mail-type=BEGIN")
    cpu = cluster.submit("alice", "sleep 1", "--mail-type=END")
    cluster.wait_played(begun)
    cluster.wait_done(cpu)
    for job, word in ((begun, " Began, Queued time "), (cpu, " Ended, Run time ")):
        (to, message), = smtp.inbox.wait(job)
        assert word in str(message["Subject"]) and "GPU efficiency" not in str(message["Subject"])
        assert not message.is_multipart() and message.get_content().strip() == ""


def test_a_hostile_job_name_adds_no_header_and_is_escaped(cluster: Cluster, smtp: Server) -> None:
    job = cluster.wait_played(gpu_job(cluster, "--mail-type=END", f"--job-name={HOSTILE}"))
    (to, message), = smtp.inbox.wait(job)
    assert to == [f"alice@{DOMAIN}"] and message["Bcc"] is None
    name = cluster.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=JobName"]).out
    assert "\nBcc: victim" in name  # Slurm kept the line break: it reached gpueff-mail
    assert "\n" not in str(message["Subject"]) and "x Bcc: victim@example.org <b>" in str(message["Subject"])
    page = message.get_payload()[1].get_payload()[0].get_content()  # type: ignore[index,union-attr]
    assert "&lt;b&gt;" in page and "<b>" not in page


def test_smtp_down_the_message_arrives_once_it_is_back(cluster: Cluster, smtp: Server) -> None:
    smtp.stop()
    try:
        job = cluster.wait_played(gpu_job(cluster, "--mail-type=END"))
        spooled: list[str] = []
        end = time.monotonic() + 60
        while not spooled and time.monotonic() < end:  # the worker makes it a few seconds on
            time.sleep(1)
            spooled = cluster.run(["sh", "-c", f"grep -l {shlex.quote('Job_id=' + job + ' ')} "
                                               f"{cluster.dir}/mail/outbox/*.eml"]).out.split()
        assert len(spooled) == 1, "the message should wait in the spool"
        assert smtp.inbox.of(job) == []
    finally:
        smtp.start()
    messages = smtp.inbox.wait(job, timeout=60, settle=8)
    assert len(messages) == 1 and messages[0][1].is_multipart()


@pytest.mark.serial  # the cluster's config, for every job's mail meanwhile
def test_one_worker_at_most_sends_every_mail_of_jobs_ending_together(cluster: Cluster, smtp: Server) -> None:
    """[mail] workers = 1: the first job's worker holds the one slot while it waits for its
    report; the others' MailProgs start none, and it takes their requests after its own."""
    before = cluster.config_file.read_text()
    cluster.config_file.write_text(with_settings(before, "mail", {"workers": 1}))
    try:
        jobs = [gpu_job(cluster, "--mail-type=END") for _ in range(4)]
        jobs = [cluster.wait_played(job) for job in jobs]  # a lost launch: the job run again
        for job in jobs:
            (to, message), = smtp.inbox.wait(job, timeout=120, settle=0)
            assert " Ended, " in str(message["Subject"]) and "; GPU efficiency " in str(message["Subject"])
    finally:
        cluster.config_file.write_text(before)
