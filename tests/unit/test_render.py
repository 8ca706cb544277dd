"""render.py: the text report people read and the JSON scripts read."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest

from slurm_gpu_eff.model import PARTIAL, RUNNING
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.render import clean, render_json, render_text
from slurm_gpu_eff.report.shapes import JobReport, clock

Factory = Callable[..., Any]
GIB = 1024**3
HOSTILE_NAME = "evil\nBcc: root@example.org\x1b[31m\rred\x07\x00\x7f"


def two_gpu_report(make_job: Factory, make_summary: Factory, **job: Any) -> JobReport:
    summary = make_summary(utils=(90.0, 2.0))
    summary.gpus[1].metrics.pop("power_w")
    summary.gpus[1].energy_j = None
    return build_report(make_job(**job), [summary])


def lines(text: str) -> list[str]:
    return text.split("\n")


def test_text_report_key_lines(make_job: Factory, make_summary: Factory) -> None:
    text = render_text(two_gpu_report(make_job, make_summary))
    assert lines(text)[0] == "Job ID: 4242"
    for line in [
        "Job name: train",
        "User/Account: alice/physics",
        "State: COMPLETED (exit code 0:0)",
        "Nodes: 1 (gpu1)",
        "Cores: 4",
        "Elapsed: 01:00:00 of 02:00:00 time limit",
        "CPU Efficiency: 50.0% of 04:00:00 core-walltime",  # 7200 s of 4 x 3600 s
        "GPU-hours: 2.000 allocated, 0.920 used",  # (0.90 + 0.02) x 1 h
        "GPU Utilisation: 46.0% mean over 2 measured GPU(s)",
        "GPU Energy: 900.0 kJ",
        "Idle GPUs: 1 of 2 averaged under 5% utilisation (gpu1 GPU 1)",
    ]:
        assert line in lines(text), line
    memory = [x for x in lines(text) if x.startswith("Memory Efficiency: ")]
    assert len(memory) == 1 and memory[0].startswith("Memory Efficiency: 25.0% of ")
    assert text.endswith("\n")


def test_text_report_has_one_row_per_gpu(make_job: Factory, make_summary: Factory) -> None:
    text = render_text(two_gpu_report(make_job, make_summary))
    rows = [x for x in lines(text) if x.startswith("gpu1 ")]
    assert len(rows) == 2
    busy, idle = rows
    assert busy.split()[:3] == ["gpu1", "0", "90.0%"]
    for cell in ("20.0 / 80.0", "250 W (700 W)", "900.0 kJ"):
        assert cell in busy, cell
    assert idle.split()[:3] == ["gpu1", "1", "2.0%"]
    assert "n/a (700 W)" in idle  # power not measured: n/a, never 0 W
    assert idle.split()[-1] == "n/a"  # no energy
    header = [x for x in lines(text) if x.startswith("NODE ")]
    assert len(header) == 1 and header[0].split()[:3] == ["NODE", "GPU", "UTIL"]


def test_text_report_of_a_running_job(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(state="RUNNING", gpus=1)
    report = build_report(job, [make_summary(status=RUNNING, sampled_until=1_700_000_500.0)])
    text = render_text(report)
    assert "CPU Efficiency: n/a (job still running)" in lines(text)
    assert f"GPUs: 1 allocated, figures running (up to {clock(1_700_000_500.0)[-8:]})" in lines(text)


def test_text_report_notes(make_job: Factory, make_summary: Factory) -> None:
    summary = make_summary(status=PARTIAL, reason="the sampler stopped unexpectedly")
    text = render_text(build_report(make_job(), [summary]))
    assert "GPUs: 2 allocated, figures partial" in lines(text)
    assert lines(text)[-3:] == ["Notes:", "  - gpu1: partial: the sampler stopped unexpectedly", ""]


def control_characters(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) == "Cc" and c != "\n"]


def test_a_hostile_job_name_puts_no_control_character_in_the_text(
    make_job: Factory, make_summary: Factory,
) -> None:
    job = make_job(name=HOSTILE_NAME, account="phys\x1b]0;pwned\x07", nodelist="gpu1\n")
    summary = make_summary(status=PARTIAL, reason="oops\n\x1b[2J")
    text = render_text(build_report(job, [summary]))
    assert control_characters(text) == []
    assert not any(x.startswith("Bcc:") for x in lines(text))
    names = [x for x in lines(text) if x.startswith("Job name: ")]
    assert names == ["Job name: evil?Bcc: root@example.org?[31m?red???"]
    assert "  - gpu1: partial: oops??[2J" in lines(text)


def test_c1_control_characters_are_cleaned_too(make_job: Factory, make_summary: Factory) -> None:
    job = make_job(name="evil\u009b31m\u0085Bcc: root")
    text = render_text(build_report(job, [make_summary()]))
    assert control_characters(text) == []


def test_clean_replaces_each_control_character() -> None:
    assert clean("a\tb\nc\x1bd\x7fe") == "a?b?c?d?e"
    assert clean("naïve – ok") == "naïve – ok"  # printable non-ASCII stays
    assert clean(42) == "42"


def test_json_round_trips_with_the_documented_keys(make_job: Factory, make_summary: Factory) -> None:
    report = two_gpu_report(make_job, make_summary, name=HOSTILE_NAME)
    text = render_json(report)
    assert control_characters(text) == []  # JSON escapes them
    data = json.loads(text)
    assert data["job_name"] == HOSTILE_NAME  # escaped, not lost
    assert {k: data[k] for k in ("job_id", "user", "state", "elapsed_s")} == {
        "job_id": "4242", "user": "alice", "state": "COMPLETED", "elapsed_s": 3600,
    }
    assert data["cpu_efficiency"] == pytest.approx(50.0, abs=1e-12)
    assert data["mem_efficiency"] == pytest.approx(25.0, abs=1e-12)
    assert data["gpu_hours_allocated"] == 2.0
    assert data["gpu_hours_used"] == pytest.approx(0.92, abs=1e-12)
    assert data["gpu_util_mean"] == pytest.approx(46.0, abs=1e-12)
    wanted = ("node", "minor", "uuid", "util_mean", "mem_used_max_bytes", "mem_total_bytes",
              "power_mean_w", "energy_j", "samples")
    assert [{k: g[k] for k in wanted} for g in data["gpus"]] == [
        {"node": "gpu1", "minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000",
         "util_mean": 90.0, "mem_used_max_bytes": 20 * GIB, "mem_total_bytes": 80 * GIB,
         "power_mean_w": 250.0, "energy_j": 900_000.0, "samples": 3600},
        {"node": "gpu1", "minor": 1, "uuid": "GPU-00000000-0000-0000-0000-000000000001",
         "util_mean": 2.0, "mem_used_max_bytes": 20 * GIB, "mem_total_bytes": 80 * GIB,
         "power_mean_w": None, "energy_j": None, "samples": 3600},
    ]
    assert json.loads(render_json(report)) == report.to_dict()
    assert text.endswith("}\n")
