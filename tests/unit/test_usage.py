"""Usage reports (issue 10) on a small hand-made data set, on both store engines: every
column against values computed by hand in the comments, jobs across the period's edges,
partial and missing figures, jobs the monitoring never saw, and the before/after split."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from slurm_gpu_eff.errors import UsageError
from slurm_gpu_eff.model import COMPLETE, PARTIAL
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.render import render_usage
from slurm_gpu_eff.report.usage import (
    Period,
    UsageQuery,
    parse_when,
    percentile,
    sync,
    usage_report,
    usage_rows,
)
from slurm_gpu_eff.store import open_store
from slurm_gpu_eff.store.base import HINT_BITS, USAGE_COLUMNS, Store

H = 3600.0
S = time.mktime((2026, 11, 2, 0, 0, 0, 0, 0, -1))  # a Monday, local time
U = S + 7 * 86400
IDLE, LOW = 1 << HINT_BITS.index("idle_gpus"), 1 << HINT_BITS.index("low_util")


def run(job_id: str, user: str, start: float, hours: float, utils: list[float | None], *,
        account: str = "physics", partition: str = "gpu", figures: str = COMPLETE,
        mem: float | None = None, energy_j: float | None = None, sm: float | None = None,
        mask: int = 0, gpus: int | None = None, node: str = "gpu1") -> dict[str, Any]:
    """One run's row: utils has one value per measured GPU (None: not measured)."""
    elapsed = hours * H
    measured = [u for u in utils if u is not None]
    main = [rule for bit, rule in enumerate(HINT_BITS) if mask & (1 << bit)]
    row: dict[str, Any] = {
        "cluster": "c", "job_id": job_id, "start_at": int(start), "end_at": start + elapsed,
        "running": 0, "user": user, "account": account, "partition": partition, "state": "COMPLETED",
        "gpu_model": "NVIDIA H100", "gpus": len(utils) if gpus is None else gpus, "figures": figures,
        "measured_gpus": len(measured), "used_gpu_s": sum(u / 100 * elapsed for u in measured),
        "idle_gpus": sum(1 for u in measured if u < 5), "sm_gpus": 0 if sm is None else len(measured),
        "sm_used_gpu_s": 0.0 if sm is None else sm / 100 * elapsed * len(measured),
        "mem_peak_pct": mem, "energy_j": energy_j, "sampled_gpu_s": elapsed * len(measured),
        **{f"util_h{i}": 0.0 for i in range(10)},
        "hint_mask": mask, "main_hint": main[0] if main else None,
        "main_severity": "warning" if main else None,
        "main_message": f"{main[0]} on {job_id}" if main else None,
    }
    for u in measured:
        row[f"util_h{min(9, int(u // 10))}"] += elapsed
    assert set(row) == set(USAGE_COLUMNS)
    return row


def stored(url: str, rows: list[dict[str, Any]]) -> Store:
    store = open_store(url)
    store.put_usage(rows, [{**r, "node": "gpu1"} for r in rows],
                    {"cluster": "c", "since": S, "until": U, "at": U, "jobs": len(rows)})
    return store


# The period is S to U (a week). By hand:
#   1 alice: inside, 2 h, 2 GPUs at 80% and 2% (idle)   alloc 4, used 1.6+0.04 = 1.64
#   2 alice: from S-1h, 4 h, 1 GPU at 50%, SM 40%       3 h of 4 inside: alloc 3, used 1.5
#   3 bob:   from U-1h, 2 h, 1 GPU at 100%, partial     1 h of 2 inside: alloc 1, used 1
#   4 bob:   2 GPUs, 1 h, no summary at all             alloc 2, measured 0
#   6 bob:   1 GPU, 1 h, the node said why (missing)    alloc 1, measured 0
#   5 carol: ten days before: not in the period
DATA = [
    run("1", "alice", S + H, 2, [80, 2], mem=40, energy_j=7.2e6, mask=IDLE),
    run("2", "alice", S - H, 4, [50], mem=20, energy_j=3.6e6, sm=40),
    run("3", "bob", U - H, 2, [100], account="chem", figures=PARTIAL, mem=90),
    run("4", "bob", S + 86400, 1, [], account="chem", figures="none", gpus=2),
    run("6", "bob", S + 2 * 86400, 1, [], account="chem", figures="missing", gpus=1),
    run("5", "carol", S - 10 * 86400, 1, [90], mem=50),
]


@pytest.fixture
def report(store_url: str) -> Callable[..., dict[str, Any]]:
    store = stored(store_url, DATA)

    def make(**options: Any) -> dict[str, Any]:
        return usage_report(store, UsageQuery(Period(S, U), price_per_kwh=0.2, co2_g_per_kwh=400, **options))

    return make


def test_totals_by_hand(report: Callable[..., dict[str, Any]]) -> None:
    t = report()["totals"]
    assert t["jobs"] == 5
    assert t["gpu_hours_allocated"] == pytest.approx(4 + 3 + 1 + 2 + 1)
    assert t["gpu_hours_measured"] == pytest.approx(4 + 3 + 1)
    assert t["gpu_hours_used"] == pytest.approx(1.64 + 1.5 + 1.0)
    assert t["efficiency_pct"] == pytest.approx(100 * 4.14 / 8)  # never a mean of job means
    assert t["gpu_hours_wasted"] == pytest.approx(8 - 4.14)
    assert t["gpu_hours_idle_gpus"] == pytest.approx(2)  # job 1's idle GPU, 2 h
    assert t["jobs_with_idle_gpu"] == 1
    assert t["sm_efficiency_pct"] == pytest.approx(40)  # only where GPM measured (job 2)
    assert t["mem_peak_median_pct"] == 40 and t["mem_peak_p90_pct"] == 90  # of 20, 40, 90
    assert t["energy_kwh"] == pytest.approx(2 + 0.75)  # job 2: 3/4 of its 1 kWh
    assert t["cost"] == pytest.approx(2.75 * 0.2) and t["co2_kg"] == pytest.approx(2.75 * 0.4)
    assert t["coverage_pct"] == pytest.approx(100 * 7 / 11)
    assert t["partial_pct"] == pytest.approx(100 * 1 / 11)
    assert t["missing_pct"] == pytest.approx(100 * 3 / 11)  # jobs 4 (never seen) and 6
    assert t["top_hints"] == [{"rule": "idle_gpus", "jobs": 1}]


def test_groups_by_user_most_wasteful_first(report: Callable[..., dict[str, Any]]) -> None:
    data = report(by=("user",))
    alice, bob = data["groups"]
    assert (alice["user"], bob["user"]) == ("alice", "bob")  # carol ran outside the period
    assert alice["jobs"] == 2 and alice["gpu_hours_allocated"] == pytest.approx(7)
    assert alice["efficiency_pct"] == pytest.approx(100 * 3.14 / 7)
    assert alice["gpu_hours_wasted"] == pytest.approx(7 - 3.14)
    assert bob["jobs"] == 3 and bob["gpu_hours_allocated"] == pytest.approx(4)
    assert bob["efficiency_pct"] == pytest.approx(100) and bob["gpu_hours_wasted"] == pytest.approx(0)
    assert bob["coverage_pct"] == pytest.approx(0) and bob["missing_pct"] == pytest.approx(75)
    assert bob["energy_kwh"] is None and bob["cost"] is None  # no energy measured at all


def test_filters_and_min_gpu_hours(report: Callable[..., dict[str, Any]]) -> None:
    assert [g["account"] for g in report(by=("account",), accounts=("chem",))["groups"]] == ["chem"]
    assert [g["user"] for g in report(by=("user",), min_gpu_hours=5)["groups"]] == ["alice"]
    assert report(by=("user",), users=("nobody",))["groups"] == []


def test_days_follow_the_end_inside_the_period(report: Callable[..., dict[str, Any]]) -> None:
    days = {g["day"]: g for g in report(by=("day",))["groups"]}
    first = time.strftime("%Y-%m-%d", time.localtime(S))
    last = time.strftime("%Y-%m-%d", time.localtime(U - 1))
    assert days[first]["jobs"] == 2  # jobs 1 and 2 ended on the first day
    assert days[last]["jobs"] == 1 and days[last]["gpu_hours_allocated"] == pytest.approx(1)  # job 3, cut


def test_top_jobs_with_their_main_hint(report: Callable[..., dict[str, Any]]) -> None:
    top = report(top=2)["top"]
    assert [t["job_id"] for t in top] == ["1", "2"]  # wasted 2.36 and 1.5 GPU-hours
    assert top[0]["gpu_hours_wasted"] == pytest.approx(4 - 1.64)
    assert top[0]["main_hint"]["rule"] == "idle_gpus" and top[1]["main_hint"] is None


def test_before_and_after_the_first_warning(store_url: str) -> None:
    day = 86400
    rows = [
        run("10", "dave", S + H, 1, [90]),  # before: efficient
        run("11", "dave", S + day, 1, [20], mask=LOW),  # the first warning: ends S+day+1h
        run("13", "dave", S + day + H / 2, 1, [10]),  # running across that moment: neither side
        run("12", "dave", S + 2 * day, 1, [70]),  # after
        run("14", "dave", S + 8 * day, 1, [5], mask=LOW),  # after the period: not counted
    ]
    store = stored(store_url, rows)
    trend = usage_report(store, UsageQuery(Period(S, U), trend=True))["trend"]
    assert [u["user"] for u in trend] == ["dave"]
    (advice,) = trend[0]["advice"]
    assert advice["rule"] == "low_util"
    assert advice["before"]["jobs"] == 2 and advice["before"]["efficiency_pct"] == pytest.approx(55)
    assert advice["after"]["jobs"] == 1 and advice["after"]["efficiency_pct"] == pytest.approx(70)
    (week,) = trend[0]["weeks"]
    assert week["week"] == time.strftime("%Y-%m-%d", time.localtime(S)) and week["jobs"] == 4
    assert week["efficiency_pct"] == pytest.approx((90 + 20 + 10 + 70) / 4)


def test_node_groups_count_a_job_once_in_the_totals(store_url: str) -> None:
    job = run("20", "erin", S + H, 1, [60, 60])
    store = open_store(store_url)
    nodes = [{**job, "node": n, "gpus": 1, "measured_gpus": 1, "used_gpu_s": 0.6 * H}
             for n in ("gpu1", "gpu2")]
    store.put_usage([job], nodes, {"cluster": "c", "since": S, "until": U, "at": U, "jobs": 1})
    data = usage_report(store, UsageQuery(Period(S, U), by=("node",)))
    assert [(g["node"], g["jobs"], g["gpu_hours_allocated"]) for g in data["groups"]] == [
        ("gpu1", 1, pytest.approx(1)), ("gpu2", 1, pytest.approx(1))]
    assert data["totals"]["jobs"] == 1 and data["totals"]["gpu_hours_used"] == pytest.approx(1.2)


def test_rows_from_a_report_count_as_gpueff_jobid(make_job: Any, make_summary: Any) -> None:
    """A 2-node job with one node's summary: the report's figures, the other node missing
    with its share of the allocation."""
    job = make_job(nodelist="gpu[1-2]", nnodes=2, gpus=4, elapsed_s=7200)
    report = build_report(job, [make_summary(utils=(80.0, 2.0), started_at=None, run_started_at=None)])
    row, nodes = usage_rows(job, report, now=U)
    assert row["used_gpu_s"] == pytest.approx(report.gpu_hours_used * H)
    assert row["measured_gpus"] == 2 and row["idle_gpus"] == 1 and row["gpus"] == 4
    assert row["figures"] == report.status and row["main_hint"] == report.hints[0].id
    assert row["hint_mask"] & IDLE
    assert row["energy_j"] == pytest.approx(report.energy_j)
    assert row["mem_peak_pct"] == pytest.approx(25)  # 20 of 80 GiB
    assert [(n["node"], n["gpus"], n["figures"], n["measured_gpus"]) for n in nodes] == [
        ("gpu1", 2, report.status, 2), ("gpu2", 2, "missing", 0)]


def test_sync_counts_runs_the_monitoring_missed_and_skips_settled_ones(
    store_url: str, make_job: Any, make_summary: Any,
) -> None:
    seen = make_job(job_id="7", job_id_raw="7", admin_comment="", start="2026-11-03T10:00:00")
    unseen = make_job(job_id="8", job_id_raw="8", admin_comment="", start="2026-11-03T12:00:00")
    store = open_store(store_url)
    store.put(make_summary(job_id="7", cluster="gpueffdev", started_at=None, run_started_at=None))
    done = sync(store, [seen, unseen, make_job(job_id="9", job_id_raw="9", gpus=0)], Period(S, U),
                lambda: open_store(store_url, readonly=True), now=S + 2 * 86400)
    assert (done.jobs, done.updated) == (2, 2)  # the CPU-only job is no GPU job
    data = usage_report(store, UsageQuery(Period(S, U)))
    assert data["totals"]["jobs"] == 2 and data["totals"]["gpu_hours_allocated"] == pytest.approx(4)
    assert data["totals"]["coverage_pct"] == pytest.approx(50)
    assert data["totals"]["missing_pct"] == pytest.approx(50)
    again = sync(store, [seen, unseen], Period(S, U), lambda: open_store(store_url, readonly=True),
                 now=S + 2 * 86400)
    assert again.updated == 1  # 7 is complete and ended: settled; 8 may still be delivered
    later = sync(store, [seen, unseen], Period(S, U), lambda: open_store(store_url, readonly=True), now=U)
    assert later.updated == 0  # 8 ended days ago: no summary will come now


def test_sync_makes_the_days_a_store_from_before_the_rollup_lacks(store_url: str) -> None:
    store = stored(store_url, DATA)
    before = usage_report(store, UsageQuery(Period(S, U), by=("user",)))
    store.conn.execute("delete from usage_days_made")  # type: ignore[attr-defined]
    store.conn.commit()  # type: ignore[attr-defined]
    made = "select count(*) as n from usage_days_made where d0 >= :s and d1 <= :u"
    assert store.read(made, {"s": S, "u": U})[0]["n"] == 0
    assert usage_report(store, UsageQuery(Period(S, U), by=("user",))) == before  # from the runs
    sync(store, [], Period(S, U), lambda: open_store(store_url, readonly=True), now=U + 3600)
    assert store.read(made, {"s": S, "u": U})[0]["n"] == 7
    assert usage_report(store, UsageQuery(Period(S, U), by=("user",))) == before


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-02", S), ("2026-11-02T01:30", S + 5400), ("2026-11-02T01:30:10", S + 5410),
    ("now", U), ("now-7days", S), ("now-2hours", U - 7200), ("now+1week", U + 7 * 86400),
])
def test_times_as_sacct_takes_them(text: str, expected: float) -> None:
    assert parse_when(text, now=U) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "now-7 days", "now-3fortnights", ""])
def test_bad_times_are_a_clear_error(text: str) -> None:
    with pytest.raises(UsageError, match="is not a time"):
        parse_when(text, now=U)


def test_a_period_that_ends_before_it_starts() -> None:
    with pytest.raises(UsageError, match="before it starts"):
        Period.parse("now", "now-1day", now=U)


def test_unknown_grouping() -> None:
    with pytest.raises(UsageError, match="cannot group by colour"):
        UsageQuery(Period(S, U), by=("colour",))


def test_percentile_nearest_rank() -> None:
    assert percentile({}, 50) is None
    assert percentile({20: 1, 40: 1, 90: 1}, 50) == 40
    assert percentile({10: 9, 99: 1}, 90) == 10 and percentile({10: 9, 99: 1}, 91) == 99


def test_text_and_csv_are_aligned_and_safe(report: Callable[..., dict[str, Any]], store_url: str) -> None:
    data = report(by=("user",), top=1)
    text = render_usage(data, "text")
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("USER"))
    assert lines[head + 1].startswith("alice") and lines[head + 3].startswith("TOTAL")
    assert len({len(line) for line in lines[head:head + 4]}) <= 2  # aligned (the last cell varies)
    hostile = {**data, "groups": [{**data["groups"][0], "user": "=HYPERLINK(\"x\")\x1b[2J"}]}
    csv_text = render_usage(hostile, "csv")
    assert "'=HYPERLINK" in csv_text and "\x1b" not in csv_text
    assert "\x1b" not in render_usage(hostile, "text")


def test_gpueff_jobid_shows_its_own_coverage(make_job: Any, make_summary: Any, make_gpu: Any) -> None:
    """Seconds sampled over seconds allocated, per GPU: 3599 of 3600 s, and a GPU sampled
    for 10 minutes only; a report on few samples says so."""
    from slurm_gpu_eff.report.render import render_text

    job = make_job()
    summary = make_summary(utils=(50.0,))
    summary.gpus.append(make_gpu(minor=1, sampled_s=600.0))
    report = build_report(job, [summary])
    data = report.to_dict()
    assert data["coverage_pct"] == pytest.approx(100 * (3599 + 600) / 7200)
    assert [g["coverage_pct"] for g in data["gpus"]] == [pytest.approx(100 * 3599 / 3600),
                                                          pytest.approx(100 * 600 / 3600)]
    text = render_text(report)
    assert "GPU Coverage: 58.3% of the allocated GPU-time sampled; under 90%: gpu1 GPU 1 16.7%" in text
    summary.gpus[0].sampled_s = 60.0
    assert "few samples" in render_text(build_report(job, [summary]))
