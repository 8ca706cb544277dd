"""report.py: Slurm's accounting joined with node summaries (pure data in, data out)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from slurm_gpu_eff.errors import NoGpus, NoSummary
from slurm_gpu_eff.hostlist import expand_hostlist
from slurm_gpu_eff.model import COMPLETE, MISSING, PARTIAL, RUNNING
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.shapes import clock

Factory = Callable[..., Any]


def test_gpu_hours_and_mean_utilisation(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(gpus=2, elapsed_s=5400)  # 1.5 h
    report = build_report(job, [make_summary(utils=(90.0, 30.0))])
    assert report.status == COMPLETE
    assert report.gpu_hours_allocated == 3.0  # 2 GPUs * 1.5 h
    assert report.gpu_util_mean == pytest.approx(60.0, abs=1e-12)
    assert report.gpu_hours_used == pytest.approx(0.9 * 1.5 + 0.3 * 1.5, abs=1e-12)  # 1.8
    assert report.energy_j == 2 * 900_000.0
    assert report.missing_nodes == [] and report.notes == []
    assert report.idle_gpus == []


def test_gpus_across_nodes(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(gpus=4, nnodes=2, nodelist="gpu[1-2]", elapsed_s=3600)
    report = build_report(job, [make_summary(node="gpu1", utils=(100.0, 80.0)),
                                make_summary(node="gpu2", utils=(60.0, 40.0))])
    assert [(g.node, g.minor) for g in report.gpus] == [
        ("gpu1", 0), ("gpu1", 1), ("gpu2", 0), ("gpu2", 1)]
    assert report.gpu_util_mean == pytest.approx(70.0, abs=1e-12)
    assert report.gpu_hours_used == pytest.approx(2.8, abs=1e-12)
    assert report.status == COMPLETE


def test_idle_gpu_is_one_averaging_under_5_percent(make_job: Factory, make_summary: Factory) -> None:
    report = build_report(make_job(gpus=3), [make_summary(utils=(4.99, 5.0, 0.0))])
    assert [g.minor for g in report.idle_gpus] == [0, 2]
    assert [g.idle for g in report.gpus] == [True, False, True]


def test_unmeasured_utilisation_is_not_idle_nor_counted(
    make_job: Factory, make_summary: Factory,
) -> None:
    report = build_report(make_job(gpus=2), [make_summary(utils=(None, 80.0))])
    assert report.gpus[0].util_mean is None
    assert report.idle_gpus == []
    assert report.gpu_util_mean == 80.0  # the mean of what was measured, not (0 + 80) / 2
    assert report.gpu_hours_used == pytest.approx(0.8, abs=1e-12)


def test_no_measured_utilisation_at_all(make_job: Factory, make_summary: Factory) -> None:
    report = build_report(make_job(gpus=1), [make_summary(utils=(None,))])
    assert report.gpu_util_mean is None
    assert report.gpu_hours_used is None


def test_a_node_without_summary_is_listed_missing(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(gpus=6, nnodes=3, nodelist="gpu[1-3]")
    report = build_report(job, [make_summary(node="gpu1"), make_summary(node="gpu2")])
    assert report.missing_nodes == ["gpu3"]
    assert report.status == PARTIAL
    assert report.notes == ["no summary from node(s) gpu3: their figures are missing"]


def test_a_running_job_does_not_call_a_late_node_missing_yet(
    make_job: Factory, make_summary: Factory,
) -> None:
    job = make_job(state="RUNNING", nnodes=2, nodelist="gpu[1-2]")
    report = build_report(job, [make_summary(node="gpu1", status=RUNNING)])
    assert report.status == RUNNING
    assert report.missing_nodes == ["gpu2"]
    assert report.notes == []


def test_partial_summary_gives_partial_status_and_its_reason(
    make_job: Factory, make_summary: Factory,
) -> None:
    reason = "the sampler stopped unexpectedly; figures up to 10:59:58 (last checkpoint)"
    report = build_report(make_job(), [make_summary(status=PARTIAL, reason=reason)])
    assert report.status == PARTIAL
    assert report.notes == [f"gpu1: partial: {reason}"]


def test_all_missing_is_missing(make_job: Factory, make_summary: Factory) -> None:
    summary = make_summary(status=MISSING, utils=(), reason="no sampler record on this node")
    report = build_report(make_job(), [summary])
    assert report.status == MISSING
    assert report.gpus == []
    assert report.notes == ["gpu1: missing: no sampler record on this node"]
    assert report.gpu_util_mean is None


def test_a_live_snapshot_of_a_finished_job_is_partial(
    make_job: Factory, make_summary: Factory,
) -> None:
    summary = make_summary(status=RUNNING, sampled_until=1_700_003_600.0)
    report = build_report(make_job(state="COMPLETED"), [summary])
    assert report.status == PARTIAL
    assert report.notes == [
        "gpu1: the final summary has not been delivered yet; figures up to "
        f"{clock(1_700_003_600.0)} from a live snapshot"
    ]


def test_gpu_errors_become_notes(make_job: Factory, make_summary: Factory) -> None:
    summary = make_summary(utils=(50.0, 50.0))
    summary.gpus[1].errors = ["nvmlDeviceGetPowerUsage: Unknown Error"]
    report = build_report(make_job(), [summary])
    assert report.notes == ["gpu1 GPU 1: nvmlDeviceGetPowerUsage: Unknown Error"]


def test_sampled_until_is_the_latest_node(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(nnodes=2, nodelist="gpu1,gpu2")
    report = build_report(job, [make_summary(node="gpu1", sampled_until=100.0),
                                make_summary(node="gpu2", sampled_until=250.0)])
    assert report.sampled_until == 250.0


def test_no_gpus_and_no_summaries_is_nogpus(make_job: Factory) -> None:
    with pytest.raises(NoGpus) as raised:
        build_report(make_job(gpus=0), [])
    assert str(raised.value) == (
        "job 4242 has no GPUs: nothing to report here (seff covers CPU jobs)")
    assert raised.value.exit_code == 4


def test_gpus_but_no_summaries_is_nosummary(make_job: Factory) -> None:
    with pytest.raises(NoSummary, match="no GPU figures stored for job 4242") as raised:
        build_report(make_job(gpus=2), [])
    assert raised.value.exit_code == 5
    with pytest.raises(NoSummary, match="job 4242 has not started yet"):
        build_report(make_job(gpus=2, state="PENDING"), [])


def test_to_dict_holds_the_figures(make_job: Factory, make_summary: Factory) -> None:
    data = build_report(make_job(), [make_summary(utils=(90.0, 30.0))]).to_dict()
    assert data["gpu_hours_allocated"] == 2.0
    assert data["gpu_hours_used"] == pytest.approx(1.2, abs=1e-12)
    assert data["gpu_util_mean"] == pytest.approx(60.0, abs=1e-12)
    assert data["cpu_efficiency"] == pytest.approx(50.0, abs=1e-12)  # 7200 / (3600 * 4)
    assert data["mem_efficiency"] == pytest.approx(25.0, abs=1e-12)  # 1000M of 4000M
    assert (data["gpu_status"], data["idle_gpus"], data["gpus_allocated"]) == ("complete", 0, 2)
    assert [g["util_mean"] for g in data["gpus"]] == [90.0, 30.0]


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("gpu[1-3]", ["gpu1", "gpu2", "gpu3"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),  # zero padding kept
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a[1,3],b", ["a1", "a3", "b"]),
        ("gpu[1-2,5],login01", ["gpu1", "gpu2", "gpu5", "login01"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("gpu1", ["gpu1"]),
        ("None assigned", []),
        ("(null)", []),
        ("", []),
    ],
)
def test_expand_hostlist(hostlist: str, names: list[str]) -> None:
    assert expand_hostlist(hostlist) == names
