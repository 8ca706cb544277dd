"""Issue 23's rules as a user reads them: the text report, the job-end mail's HTML and
--json, for a job that fires each new rule; savings said as measured ("would have saved")
or estimated ("up to", with how), in words a user knows, and site wording escaped."""

from __future__ import annotations

import json
import re

import pytest

from slurm_gpu_eff.report.hints import HintSettings, evaluate, verdict
from slurm_gpu_eff.report.render import render_json, render_mail_html, render_text
from slurm_gpu_eff.report.shapes import JobReport
from tests.unit.hint_jobs import GIB, Gpus, Reports
from tests.unit.test_hints_no_harm import EIGHT_GPU_NODE

HIST = [2800.0, 0, 0, 0, 0, 0, 0, 0, 0, 800.0]


def shapes(job_report: Reports, gpu: Gpus) -> dict[str, JobReport]:
    """A job for each of issue 23's rules (and the idle ones beside them)."""
    return {
        "imbalance": job_report([gpu(util=92.0, sm_active=None)] + [
            gpu(minor=i, util=8.0, sm_active=None, mem_used=60 * GIB) for i in range(1, 4)], elapsed_s=300),
        "low_sm": job_report([gpu(util=45.0, sm_active=12.0)], elapsed_s=300),
        "main_loading": job_report([gpu(util=30.0, sm_active=25.0)], ncpus=8, total_cpu_s=3600.0,
                                   frameworks=["pytorch"]),
        "node_share": job_report([gpu(), gpu(minor=1)], ncpus=32, alloc_mem_bytes=512 * GIB,
                                 total_cpu_s=32 * 3600.0, node_shares={"gpu1": EIGHT_GPU_NODE}),
        "idle_mig": job_report([gpu(util=None, power=None, mig_gi_id=1, sm_active=1.0, mem_used=GIB // 2),
                                gpu(util=None, power=None, mig_gi_id=2, sm_active=2.0, mem_used=GIB // 2)]),
        "idle_interactive": job_report([gpu(util=10.0, idle_s=5760.0, sampled_s=7200.0)], elapsed_s=7200,
                                       interactive=True),
        "too_early": job_report([gpu(util=0.0, mem_used=0)], state="FAILED", elapsed_s=20),
        "idle_gpus": job_report([gpu(), gpu(minor=1, util=1.0, mem_used=0)]),
        "idle_stretch": job_report([gpu(idle_longest={"from_s": 600.0, "seconds": 1200.0})]),
        "low_util": job_report([gpu(util=22.0, util_histogram_s=HIST)]),
    }


def judged(report: JobReport, settings: HintSettings | None = None) -> JobReport:
    report.hints = evaluate(report, settings)
    report.verdict = verdict(report, report.hints)
    return report


@pytest.mark.parametrize("rule", ["imbalance", "low_sm", "main_loading", "node_share", "idle_mig",
                                  "idle_interactive", "too_early", "idle_gpus", "idle_stretch", "low_util"])
def test_each_rule_reads_well_in_text_mail_and_json(job_report: Reports, gpu: Gpus, rule: str) -> None:
    report = judged(shapes(job_report, gpu)[rule])
    hint = next(h for h in report.hints if h.id == rule)
    text = render_text(report)
    html = render_mail_html(report, [None] * len(report.gpus))
    line = f"  [{hint.severity}] {hint.message}"
    assert line in text and hint.message.replace("'", "&#39;") in html
    saved = json.loads(render_json(report))["hints"]
    mine = next(h for h in saved if h["id"] == rule)
    if hint.savings_gpu_hours is None:
        assert mine["savings"] is None
    elif hint.savings_kind == "measured":
        assert mine["savings"]["kind"] == "measured" and "would have saved" in text and "up to" not in text
        assert "would have saved" in html
    else:
        assert mine["savings"]["kind"] == "estimated" and f"up to {hint.savings_gpu_hours:.3f}" in text
        assert "would have saved" not in text and "could save up to" in html
    # how a figure was worked out is for users: no setting or rule names in it
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", hint.savings_how or ""), hint.savings_how


def test_two_slices_of_one_gpu_are_told_apart(job_report: Reports, gpu: Gpus) -> None:
    hint = next(h for h in judged(shapes(job_report, gpu)["idle_mig"]).hints if h.id == "idle_mig")
    assert "gpu1 GPU 0/1" in hint.message and "gpu1 GPU 0/2" in hint.message


def test_a_sites_wording_is_escaped(job_report: Reports, gpu: Gpus) -> None:
    settings = HintSettings.from_config({"imbalance.message": "<b>Uneven</b>\x1b[31m {busiest_pct:.0f}%"})
    report = judged(shapes(job_report, gpu)["imbalance"], settings)
    text = render_text(report)
    html = render_mail_html(report, [None] * len(report.gpus))
    assert "\x1b" not in text and "<b>Uneven</b>?[31m 92%" in text
    assert "<b>" not in html and "&lt;b&gt;Uneven&lt;/b&gt;" in html
