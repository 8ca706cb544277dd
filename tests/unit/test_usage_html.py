"""The usage report's HTML page (`gpueff report --format html`): one self-contained page
that parses, fetches nothing, runs nothing, escapes the users' names, says "-" for what
was not measured and "no ..." for what is empty, and draws its charts (report/charts.py)."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from slurm_gpu_eff.report import charts
from slurm_gpu_eff.report.render import render_usage
from slurm_gpu_eff.report.usage import Period, UsageQuery, usage_report
from tests.unit.test_usage import DATA, S, U, stored

HOSTILE = "<img src=x onerror=alert(1)>"
# Void elements: no end tag to balance.
VOID = {"meta", "br", "hr", "img", "input", "link", "rect", "line", "circle", "polyline", "path", "col",
        "wbr"}
EXTERNAL = re.compile(r"^\s*(https?:|//|ftp:|file:)", re.I)


def hint(rule: str, severity: str, message: str) -> dict[str, str]:
    return {"rule": rule, "severity": severity, "message": message}


def group(user: str, jobs: int, allocated: float, used: float | None, **more: Any) -> dict[str, Any]:
    """A group's row as usage_report makes it (figures: hours, percentages)."""
    measured = more.pop("measured", allocated)
    eff = None if used is None or not measured else 100 * used / measured
    row: dict[str, Any] = {
        "user": user, "jobs": jobs, "gpu_hours_allocated": allocated, "gpu_hours_measured": measured,
        "gpu_hours_used": used, "efficiency_pct": eff,
        "gpu_hours_wasted": None if used is None else measured - used, "gpu_hours_idle_gpus": 0.0,
        "jobs_with_idle_gpu": 0, "sm_efficiency_pct": None, "mem_peak_median_pct": 40, "mem_peak_p90_pct": 80,
        "energy_kwh": allocated * 0.4, "cost": allocated * 0.08, "co2_kg": allocated * 0.16,
        "coverage_pct": 100.0 * measured / allocated if allocated else None, "partial_pct": 0.0,
        "missing_pct": 100.0 * (allocated - measured) / allocated if allocated else None,
        "sampled_pct": 99.0, "top_hints": [],
    }
    row.update(more)
    return row


def sample_data() -> dict[str, Any]:
    """A week by user, with everything the page draws, a hostile user, account, job name,
    hint message and note, and figures that were not measured (None)."""
    groups = [
        group("alice", 12, 96.0, 30.0, gpu_hours_idle_gpus=24.0, jobs_with_idle_gpu=3, sm_efficiency_pct=22.5,
              top_hints=[{"rule": "idle_gpus", "jobs": 3}, {"rule": "low_util", "jobs": 2}]),
        group(HOSTILE, 7, 40.0, 12.0, measured=30.0, top_hints=[{"rule": "short_job", "jobs": 5}]),
        group("bob", 20, 64.0, 51.2, sm_efficiency_pct=70.1),
        group("carol", 2, 8.0, None, measured=0.0, mem_peak_median_pct=None, mem_peak_p90_pct=None,
              energy_kwh=None, cost=None, co2_kg=None),
    ]
    totals = group("", 41, 208.0, 93.2, measured=190.0, top_hints=[{"rule": "idle_gpus", "jobs": 3}])
    del totals["user"]
    days = [{"day": f"2026-11-{d:02d}", "gpu_hours_allocated": 20.0 + 7 * (d % 3),
             "gpu_hours_used": 8.0 + 3 * (d % 4), "efficiency_pct": 40.0} for d in range(2, 9)]
    return {
        "period": {"since": "2026-11-02T00:00:00", "until": "2026-11-09T00:00:00"},
        "by": ["user"], "groups": groups, "totals": totals,
        "util_buckets": [{"bucket": f"{10 * i}-{10 * i + 10}%", "gpu_hours": h}
                         for i, h in enumerate([60.0, 8, 4, 6, 10, 12, 18, 22, 30, 20])],
        "days": days,
        "users": [{"user": g["user"], "gpu_hours_allocated": g["gpu_hours_allocated"],
                   "efficiency_pct": g["efficiency_pct"]} for g in groups],
        "trend": [
            {"user": "alice", "weeks": [
                {"week": "2026-10-19", "jobs": 4, "gpu_hours_allocated": 30.0, "efficiency_pct": 20.0},
                {"week": "2026-10-26", "jobs": 3, "gpu_hours_allocated": 20.0, "efficiency_pct": None},
                {"week": "2026-11-02", "jobs": 5, "gpu_hours_allocated": 46.0, "efficiency_pct": 55.0}],
             "advice": [{"rule": "idle_gpus", "first_at": "2026-10-20T09:00:00",
                         "before": {"jobs": 2, "gpu_hours_measured": 12.0, "efficiency_pct": 18.0},
                         "after": {"jobs": 10, "gpu_hours_measured": 70.0, "efficiency_pct": 41.5}}]},
            {"user": HOSTILE, "weeks": [
                {"week": "2026-11-02", "jobs": 7, "gpu_hours_allocated": 40.0, "efficiency_pct": 40.0}],
             "advice": [{"rule": "short_job", "first_at": "2026-11-03T10:00:00",
                         "before": {"jobs": 0, "gpu_hours_measured": 0.0, "efficiency_pct": None},
                         "after": {"jobs": 7, "gpu_hours_measured": 30.0, "efficiency_pct": 40.0}}]},
        ],
        "top": [
            {"job_id": "4242", "cluster": "c", "user": "alice", "account": "physics", "partition": "gpu",
             "gpus": 4, "gpu_model": "NVIDIA H100", "start": "2026-11-03T08:00:00", "running": False,
             "figures": "complete", "gpu_hours_allocated": 48.0, "gpu_hours_used": 12.0,
             "gpu_hours_wasted": 36.0, "efficiency_pct": 25.0, "idle_gpus": 3,
             "main_hint": hint("idle_gpus", "warning", "3 of 4 GPUs sat idle")},
            {"job_id": "4243_7", "cluster": "c", "user": HOSTILE, "account": "<b>chem</b>",
             "partition": "gpu", "gpus": 1, "gpu_model": None, "start": "2026-11-04T08:00:00",
             "running": True,
             "figures": "partial", "gpu_hours_allocated": 10.0, "gpu_hours_used": None,
             "gpu_hours_wasted": None, "efficiency_pct": None, "idle_gpus": None,
             "main_hint": hint("short_job", "info", f"named {HOSTILE}")},
            {"job_id": "4244", "cluster": "c", "user": "bob", "account": "chem", "partition": "gpu",
             "gpus": 2, "gpu_model": "NVIDIA A100", "start": "2026-11-05T08:00:00", "running": False,
             "figures": "none", "gpu_hours_allocated": 6.0, "gpu_hours_used": 0.0,
             "gpu_hours_wasted": 0.0, "efficiency_pct": None, "idle_gpus": 0, "main_hint": None},
        ],
        "notes": [f"a note about {HOSTILE}"],
    }


def empty_data() -> dict[str, Any]:
    """A period with no GPU job: every list empty, every figure None or 0."""
    data = sample_data()
    totals: dict[str, Any] = {
        k: (0 if k in ("jobs", "jobs_with_idle_gpu") else [] if k == "top_hints" else None)
        for k in data["totals"]}
    return {**data, "groups": [], "totals": {**totals, "gpu_hours_allocated": 0.0},
            "util_buckets": [{**b, "gpu_hours": 0.0} for b in data["util_buckets"]],
            "days": [], "users": [], "trend": [], "top": [], "notes": []}


class Page(HTMLParser):
    """The tags, attributes and text of a page, and whether its elements are balanced."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self.open: list[str] = []
        self.unbalanced: list[str] = []
        self._in_style = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False
        if tag in VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.unbalanced.append(f"</{tag}> closes <{self.open[-1] if self.open else 'nothing'}>")
            return
        self.open.pop()

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.text).append(data)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


def page(data: dict[str, Any]) -> tuple[str, Page]:
    html = render_usage(data, "html")
    return html, Page(html)


def self_contained(html: str, parsed: Page) -> None:
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert not parsed.unbalanced and parsed.open == [], (parsed.unbalanced, parsed.open)
    assert not parsed.named("script") and not parsed.named("link") and not parsed.named("iframe")
    assert not parsed.named("img") and not parsed.named("object") and not parsed.named("embed")
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name, value)  # no event handler
            if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
                assert not EXTERNAL.match(value or ""), (tag, name, value)
    style = " ".join(parsed.styles)
    assert "@import" not in style and "url(" not in style and "@font-face" not in style


def test_the_page_parses_and_fetches_nothing() -> None:
    html, parsed = page(sample_data())
    self_contained(html, parsed)
    assert len(parsed.named("style")) == 1
    assert parsed.named("title") and "2026-11-02 00:00:00 to 2026-11-09 00:00:00" in parsed.words
    # the charts: buckets, groups, days, users, and one small chart per user of the trend
    assert len(parsed.named("svg")) == 4 + 2
    for svg in parsed.named("svg"):
        assert svg.get("viewbox") and svg.get("role") == "img" and svg.get("aria-label")


def test_totals_columns_and_tables() -> None:
    html, parsed = page(sample_data())
    words = parsed.words
    for label in ("GPU-hours allocated", "GPU-hours used", "Efficiency", "GPU-hours wasted",
                  "Monitoring coverage", "GPU energy", "Energy cost", "CO\u2082"):
        assert label in words
    assert "208.0" in words and "93.2" in words and "49.1%" in words  # totals: used over measured
    table = html.split("<table>")[1].split("</thead>")[0]  # the groups table: every column
    headings = [re.sub(r"<[^>]+>", "", h).replace("\u2011", "-")  # non-breaking hyphens
                for h in re.findall(r"<th[^>]*>(.*?)</th>", table)]
    assert headings == ["User", "Jobs", "GPU-h", "Used", "Eff.", "Wasted", "Idle GPU-h", "Idle jobs", "SM",
                        "Mem p50", "Mem p90", "kWh", "Cost", "CO₂ kg", "Cover", "Partial", "Missing",
                        "Top hints"]
    assert "31.2%" in words  # alice: 30 of 96 measured GPU-hours
    assert "idle_gpus 3" in words and "low_util 2" in words  # top hints
    assert "3 of 4 GPUs sat idle" in words and "4243_7" in words  # the top-N table
    assert "Before" in words and "After" in words and "+23.5 pts" in words  # the trend


def test_hostile_names_are_escaped() -> None:
    html, parsed = page(sample_data())
    assert HOSTILE not in html and "<b>chem</b>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;b&gt;chem&lt;/b&gt;" in html and not parsed.named("img")
    assert HOSTILE in parsed.words  # shown, as text


def test_not_measured_is_a_dash_never_none() -> None:
    html, parsed = page(sample_data())
    assert "None" not in parsed.words and "nan" not in parsed.words.lower()
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)
    carol = next(r for r in rows if ">carol<" in r)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", carol, re.S)]
    # jobs, GPU-h, then used and efficiency not measured; no energy, cost or CO2 either
    assert cells[1:3] == ["2", "8.0"] and cells[3] == "-" and cells[4] == "-"
    assert cells.count("-") >= 8
    running = next(r for r in rows if "4243_7" in r)
    assert "running" in running and ">-<" in running


def test_an_empty_period_says_so_and_draws_no_chart() -> None:
    html, parsed = page(empty_data())
    self_contained(html, parsed)
    assert not parsed.named("svg")
    words = parsed.words
    assert "No GPU jobs in this period" in words
    assert "No utilisation figures in this period." in words
    assert "No jobs listed" in words
    assert "None" not in words and "nan" not in words.lower()


def test_without_the_optional_parts() -> None:
    """usage_report leaves out days, users and trend unless asked; notes may be absent."""
    data = sample_data()
    for key in ("days", "users", "trend", "notes"):
        del data[key]
    html, parsed = page(data)
    self_contained(html, parsed)
    assert len(parsed.named("svg")) == 2 and "Trend" not in parsed.words


def test_several_keys_and_long_names() -> None:
    data = copy.deepcopy(sample_data())
    data["by"] = ["account", "gpu_model"]
    for i, g in enumerate(data["groups"]):
        g.update(account="a" * 80 if i == 0 else f"acct{i}", gpu_model=None if i == 1 else "NVIDIA H100")
    html, parsed = page(data)
    self_contained(html, parsed)
    assert "GPU model" in parsed.words and "By account, gpu model" in parsed.words


def test_a_report_from_the_store_renders(store_url: str) -> None:
    """The page over what usage_report really returns (tests/unit/test_usage.py's data set)."""
    store = stored(store_url, DATA)
    data = usage_report(store, UsageQuery(Period(S, U), top=3, trend=True, charts=True,
                                          price_per_kwh=0.2, co2_g_per_kwh=400))
    html, parsed = page(data)
    self_contained(html, parsed)
    assert "alice" in parsed.words and "bob" in parsed.words and "None" not in parsed.words
    assert len(parsed.named("svg")) >= 4


# -- charts.py -----------------------------------------------------------------------------


@pytest.mark.parametrize(("top", "ticks"), [
    (0, [0.0, 1.0]), (1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]), (7, [0, 2, 4, 6, 8]),
    (1250, [0, 250, 500, 750, 1000, 1250]), (0.03, [0, 0.01, 0.02, 0.03]),
])
def test_nice_ticks(top: float, ticks: list[float]) -> None:
    assert charts.nice_ticks(top) == pytest.approx(ticks)


@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (0, "0"), (0.25, "0.25"), (3.5, "3.5"), (42.0, "42"), (12.5, "12.5"), (1250, "1,250"),
    (12500, "12.5k"), (3.4e6, "3.4M"),
])
def test_short_figures(value: float | None, text: str) -> None:
    assert charts.short(value) == text


def test_bands() -> None:
    assert [charts.band(v) for v in (None, 0, 29.9, 30, 59.9, 60, 100)] == \
        ["none", "poor", "poor", "fair", "fair", "good", "good"]


def test_user_points_stay_inside_and_use_a_log_scale_when_spread() -> None:
    items: list[dict[str, Any]] = [
        {"user": f"u{i}", "gpu_hours_allocated": 10.0 ** i, "efficiency_pct": 20.0 * i} for i in range(5)]
    items.append({"user": "nobody", "gpu_hours_allocated": 5.0, "efficiency_pct": None})
    c = charts.users(items)
    assert c["log"] and c["unmeasured"] == ["nobody"] and not c["empty"]
    for p in c["points"]:
        assert c["x0"] <= p["cx"] <= c["x1"] and c["y0"] <= p["cy"] <= c["y1"]
    assert [p["user"] for p in c["points"]][-1] == "u4"  # the biggest drawn last, on top
    assert not charts.users([{"user": "a", "gpu_hours_allocated": 3.0, "efficiency_pct": 50.0},
                             {"user": "b", "gpu_hours_allocated": 9.0, "efficiency_pct": 10.0}])["log"]


def test_a_sparkline_breaks_where_a_week_was_not_measured() -> None:
    weeks = [{"week": f"w{i}", "jobs": 1, "gpu_hours_allocated": 1.0, "efficiency_pct": e}
             for i, e in enumerate([10.0, 20.0, None, 40.0, 50.0])]
    c = charts.sparkline(weeks)
    assert len(c["segments"]) == 2
    assert [p["y"] is None for p in c["points"]] == [False, False, True, False, False]
    assert charts.sparkline([])["empty"] and charts.sparkline(weeks[2:3])["empty"]


def test_ranked_groups_split_used_wasted_and_unmeasured() -> None:
    c = charts.ranked([group("a", 1, 10.0, 2.0, measured=6.0), group("b", 1, 0.0, None, measured=0.0)],
                      ["user"])
    (bar,) = c["bars"]
    assert [p["part"] for p in bar["parts"]] == ["used", "wasted", "without figures"]
    widths = [p["w"] for p in bar["parts"]]
    assert widths[0] * 2 == pytest.approx(widths[1], abs=0.2)
    assert widths[1] == pytest.approx(widths[2], abs=0.2)
