"""A GPU shared with another job (issue 20, finding 9): the owner's report says so without
naming that job or giving its figures away (the whole GPU less this job's own share is the
other job's use, which PrivateData=jobs hides)."""

from __future__ import annotations

import json
from typing import Any

from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.render import render_json, render_text


def shared(make_gpu: Any, others: list[str]) -> Any:
    metrics_extra = {"own_util": {"mean": 30.0, "min": 0.0, "max": 60.0, "last": 30.0,
                                  "samples": 3600, "seconds": 3599.0}}
    gpu = make_gpu(util=80.0, shared_s=3599.0, shared_with=others)
    gpu.metrics.update(metrics_extra)
    return gpu


def test_another_job_on_the_gpu_is_neither_named_nor_given_away(
    make_job: Any, make_summary: Any, make_gpu: Any,
) -> None:
    gpu = shared(make_gpu, ["job 7781", "processes outside any job"])
    report = build_report(make_job(), [make_summary(gpus=[gpu])])
    text = render_text(report)
    assert "7781" not in text and "7781" not in render_json(report)
    assert "was shared with another job, processes outside any job 100% of the time" in text
    assert "this job's own processes kept it 30.0% busy; power and energy" in text
    assert "80.0%" not in text  # the whole GPU's: with this job's 30%, the other job's 50%
    gpu = json.loads(render_json(report))["gpus"][0]
    assert gpu["shared_with"] == ["another job", "processes outside any job"]
    assert gpu["util_whole_mean"] is None and gpu["mem_used_whole_max_bytes"] is None
    assert gpu["util_mean"] == 30.0  # what the job is charged with: its own share


def test_processes_outside_any_job_leave_the_whole_gpu_s_figures_shown(
    make_job: Any, make_summary: Any, make_gpu: Any,
) -> None:
    gpu = shared(make_gpu, ["processes outside any job"])
    report = build_report(make_job(), [make_summary(gpus=[gpu])])
    assert "kept it 30.0% busy (the whole GPU: 80.0%)" in render_text(report)
    assert json.loads(render_json(report))["gpus"][0]["util_whole_mean"] == 80.0


def test_a_job_without_any_gpu_figures_gets_no_verdict(make_job: Any, make_summary: Any) -> None:
    """Seen in the soak: a job whose prolog did not run (allocated as slurmctld restarted)
    read "No problems found; ... (MIG slices do not report it)"."""
    missing = make_summary(status="missing", reason="no sampler record on this node", gpus=[])
    text = render_text(build_report(make_job(), [missing]))
    assert "Verdict: No verdict: the GPU figures are missing (see the notes)." in text
    assert "MIG" not in text
