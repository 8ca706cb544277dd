"""Usage reports after a demo of short jobs (issue 20, finding 10): every GPU-hour figure
read 0.0 beside a 48% efficiency. Text and HTML show an amount to two significant digits
(never 0.0 when it is not), aligned on its decimal point; CSV and JSON keep the numbers."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest

from slurm_gpu_eff.report.render import aligned, amount, render_mine, render_usage
from slurm_gpu_eff.report.usage import Period, UsageQuery, usage_report
from tests.unit.test_usage import S, U, run, stored

H = 3600.0
# Minutes, as `make demo` runs them. By hand (GPU-hours):
#   alice 101: 2 min, 1 GPU at 48%          alloc 2/60 = 0.0333, used 0.016
#   alice 102: 3 min, 2 GPUs at 96% and 0%  alloc 6/60 = 0.1,    used 0.048
#   bob   103: 1 min, 1 GPU at 48%          alloc 1/60 = 0.0167, used 0.008
DEMO = [
    run("101", "alice", S + H, 2 / 60, [48], energy_j=7.2e3),
    run("102", "alice", S + 2 * H, 3 / 60, [96, 0], energy_j=2.7e4),
    run("103", "bob", S + 3 * H, 1 / 60, [48], energy_j=3.6e3),
]


@pytest.fixture
def demo(store_url: str) -> dict[str, Any]:
    store = stored(store_url, DEMO)
    return usage_report(store, UsageQuery(Period(S, U), by=("user",), top=3, price_per_kwh=0.2,
                                          co2_g_per_kwh=400))


def columns(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("USER"))
    return lines[head:head + 4], [line.split() for line in lines[head:head + 4]]


def test_short_jobs_gpu_hours_are_not_zero_in_the_text(demo: dict[str, Any]) -> None:
    lines, cells = columns(render_usage(demo, "text"))
    heading = cells[0]
    table = {row[0]: dict(zip(heading, row, strict=False)) for row in cells[1:]}
    assert table["alice"]["GPU-H"] == "0.13" and table["alice"]["USED"] == "0.064"
    assert table["bob"]["GPU-H"] == "0.017" and table["bob"]["USED"] == "0.0080"
    assert table["TOTAL"]["GPU-H"] == "0.15" and table["TOTAL"]["USED"] == "0.072"
    assert table["TOTAL"]["EFF%"] == "48.0" and table["TOTAL"]["WASTED"] == "0.078"
    assert table["TOTAL"]["KWH"] == "0.011" and table["TOTAL"]["COST"] == "0.0021"
    assert table["bob"]["IDLE-GPU-H"] == "0.0"  # a zero is still 0.0: no GPU of bob's idle
    for column in ("GPU-H", "USED", "WASTED", "KWH"):
        assert all(row[column] not in ("0.0", "0.00") for row in table.values()), column


def test_the_text_columns_stay_aligned_on_the_decimal_point(demo: dict[str, Any]) -> None:
    lines, _ = columns(render_usage(demo, "text"))
    assert len({len(line) for line in lines}) <= 2  # the last cell (the hints) varies
    start = lines[0].index("GPU-H")
    points = {line.index(".", start) for line in lines[1:]}
    assert len(points) == 1, lines  # 0.13, 0.017 and 0.15 on one decimal point


def test_the_html_shows_the_same_figures(demo: dict[str, Any]) -> None:
    html = render_usage(demo, "html")
    words = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "GPU-hours allocated 0.15" in words and "GPU-hours used 0.072" in words
    assert "of 0.15 measured" in words and "GPU-hours wasted 0.078" in words
    cells = re.findall(r'<td class="num">([^<]*)</td>', html)
    assert cells[1:4] == ["0.13", "0.064", "0.069"]  # alice: GPU-h, used, wasted
    assert cells[15:18] == ["0.017", "0.0080", "0.0087"]  # bob
    assert cells[29:32] == ["0.15", "0.072", "0.078"]  # the totals
    assert "0.033" in cells  # job 101 among the most wasteful


def test_csv_and_json_keep_the_numbers(demo: dict[str, Any]) -> None:
    data = json.loads(render_usage(demo, "json"))
    assert data["totals"]["gpu_hours_allocated"] == pytest.approx(0.15)
    rows = list(csv.DictReader(io.StringIO(render_usage(demo, "csv"))))
    assert [float(r["gpu_hours_allocated"]) for r in rows] == pytest.approx([0.1333, 0.0167])


def test_a_user_s_own_short_jobs_are_not_zero_either() -> None:
    """`gpueff report --mine`: its jobs had 2 decimals, its totals 1 (0.0 GPU-hours)."""
    jobs = [{"job_id": "101", "name": "demo", "state": "COMPLETED", "start": "2026-11-02T01:00:00", "gpus": 1,
             "gpu_hours_allocated": 2 / 60, "efficiency_pct": 48.0, "figures": "complete",
             "verdict": "fair", "main_hint": None},
            {"job_id": "103", "name": "demo", "state": "COMPLETED", "start": "2026-11-02T03:00:00", "gpus": 1,
             "gpu_hours_allocated": 0.4 / 60, "efficiency_pct": 48.0, "figures": "complete",
             "verdict": "fair", "main_hint": None}]
    data = {"period": {"since": "2026-11-02T00:00:00", "until": "2026-11-09T00:00:00"}, "jobs": jobs,
            "totals": {"jobs": 2, "gpu_hours_allocated": 2.4 / 60, "gpu_hours_measured": 2.4 / 60,
                       "gpu_hours_used": 0.48 * 2.4 / 60, "efficiency_pct": 48.0},
            "cluster_median": None}
    text = render_mine(data)
    assert "2 jobs, 0.040 GPU-hours allocated, 0.019 used: efficiency 48.0%" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("10")]
    assert [row[5] for row in rows] == ["0.033", "0.0067"]


@pytest.mark.parametrize(("value", "digits", "shown"), [
    (0.0333, 1, "0.033"), (0.15, 1, "0.15"), (1.5, 1, "1.5"), (1234.56, 1, "1,234.6"), (0.0, 1, "0.0"),
    (None, 1, "-"), (3, 0, "3"), (1e-6, 1, "<0.0001"), (0.004, 2, "0.0040"), (2.75, 2, "2.75"),
])
def test_an_amount_keeps_two_significant_digits(value: Any, digits: int, shown: str) -> None:
    assert amount(value, digits) == shown


def test_aligned_lines_figures_up_on_their_point_and_leaves_the_rest() -> None:
    assert aligned([["NAME", "H", "NOTE"], ["a", "12.3", "x"], ["b", "0.017", "-"], ["c", "-", "y"]]) == [
        "NAME       H  NOTE",
        "a     12.3       x",
        "b      0.017     -",
        "c          -     y",
    ]
