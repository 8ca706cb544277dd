"""Issue 8, finding 5: a requeued job keeps its id, and Slurm may give an id out again.
Summaries carry their run (when its prolog ran), are stored apart, and the report counts
only the run that sacct reports, naming the earlier ones."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import NoSummary
from slurm_gpu_eff.model import COMPLETE
from slurm_gpu_eff.node import hooks
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.store.sqlite import SqliteStore

Factory = Callable[..., Any]
START = "2026-11-20T10:00:00"  # sacct's Start of the run it reports (local time)
T = time.mktime(time.strptime(START, "%Y-%m-%dT%H:%M:%S"))


def test_two_runs_of_one_job_id_on_one_node_are_stored_apart(
    tmp_path: Path, make_summary: Factory,
) -> None:
    store = SqliteStore(str(tmp_path / "gpueff.db"))
    first = make_summary(run_started_at=T - 3600, utils=(90.0, 90.0))
    second = make_summary(run_started_at=T + 2, utils=(10.0,))
    assert store.put(first) and store.put(second)
    assert store.node_summaries("4242") == [first, second]  # neither replaced the other
    gpu_rows = store.db.execute("select run, count(*) from gpus group by run order by run").fetchall()
    assert gpu_rows == [(int(T - 3600), 2), (int(T + 2), 1)]


def test_two_runs_wait_in_the_outbox_apart(tmp_path: Path, make_summary: Factory) -> None:
    spool = Spool(str(tmp_path / "spool"))
    a = spool.post(make_summary(run_started_at=T - 3600))
    b = spool.post(make_summary(run_started_at=T + 2))
    assert a != b and len(spool.pending()) == 2


def test_the_report_counts_the_run_sacct_reports_and_names_the_earlier_one(
    make_job: Factory, make_summary: Factory,
) -> None:
    """Before: a job preempted on gpu1 and rerun on gpu2 reported 2 GPUs for 1 allocated,
    with a false "idle" verdict; a rerun on the same node showed the earlier figures."""
    job = make_job(start=START, gpus=1, nodelist="gpu2")
    earlier = make_summary(node="gpu1", run_started_at=T - 3600, utils=(0.0,))
    now = make_summary(node="gpu2", run_started_at=T + 1, utils=(75.0,))
    report = build_report(job, [earlier, now])
    assert [(g.node, g.util_mean) for g in report.gpus] == [("gpu2", 75.0)]
    assert report.missing_nodes == [] and report.idle_gpus == []
    assert any("earlier runs of job id 4242" in n and "gpu1 from" in n for n in report.notes)


def test_a_rerun_on_the_same_node_shows_its_own_figures(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(start=START, gpus=1)
    report = build_report(job, [make_summary(run_started_at=T - 600, utils=(5.0,)),
                                make_summary(run_started_at=T + 1, utils=(65.0,))])
    assert [g.util_mean for g in report.gpus] == [65.0]


def test_a_run_not_yet_delivered_is_not_shown_as_the_earlier_one(
    make_job: Factory, make_summary: Factory,
) -> None:
    with pytest.raises(NoSummary, match="job 4242 has no GPU figures stored yet .earlier runs: gpu1"):
        build_report(make_job(start=START), [make_summary(run_started_at=T - 600)])
    with pytest.raises(NoSummary, match="this run of job 4242 is pending again .earlier runs: gpu1"):
        build_report(make_job(start="Unknown", state="PENDING"), [make_summary(run_started_at=T - 600)])


def test_without_a_start_time_each_node_shows_its_latest_run(
    make_job: Factory, make_summary: Factory,
) -> None:
    job = make_job(start="Unknown", gpus=1)
    report = build_report(job, [make_summary(run_started_at=T - 600, utils=(5.0,)),
                                make_summary(run_started_at=T + 1, utils=(65.0,))])
    assert [g.util_mean for g in report.gpus] == [65.0]


def test_the_prolog_gives_the_run_its_identity(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env())
    before = time.time()
    hooks.main(["prolog"], env)
    hook_site.wait_for(hook_site.job_dir() / "summary.json")
    pid_file = (hook_site.job_dir() / "sampler.pid").read_text().split()
    hooks.main(["epilog"], env)
    (stored,) = hook_site.stored()
    assert stored.status == COMPLETE
    assert stored.run_started_at == float(pid_file[1])
    assert before - 0.001 <= stored.run_started_at <= time.time()  # kept to the millisecond
