"""The daily rollup (store/usage.py) gives the figures a scan of every run gives: random
runs across midnights and the period's edges, put in several syncs (running runs put
again later, longer), every grouping, on both engines; and GPU-hours and jobs per user
against a count made here in Python, run by run."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from slurm_gpu_eff.report.usage import Period, UsageQuery, usage_report
from slurm_gpu_eff.store import Store, open_store
from slurm_gpu_eff.store import usage as usage_sql
from slurm_gpu_eff.store.base import HINT_BITS, USAGE_COLUMNS

DAY = 86400.0
S = time.mktime((2026, 11, 2, 0, 0, 0, 0, 0, -1))  # a Monday, local time
PERIODS = [(S + 5 * 3600, S + 6 * DAY + 3 * 3600), (S, S + 7 * DAY), (S + 9000, S + 10800),
           (S - DAY, S + 10.5 * DAY), (S + DAY + 1, S + 3 * DAY)]
GROUPINGS = [(), ("user",), ("account", "day"), ("week",), ("gpu-model", "month"), ("partition", "user")]


def runs(rng: random.Random, n: int, now: float) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        start = int(S - 3 * DAY + rng.random() * 12 * DAY)
        end = start + min(2 * DAY, max(0.0, rng.lognormvariate(8, 1.5)))
        running = end > now
        end = max(float(start), now) if running else end
        gpus = rng.choice((1, 1, 2, 4, 8))
        measured = rng.choice((0, gpus, gpus))
        util = rng.random()
        row: dict[str, Any] = {
            "cluster": "c", "job_id": str(1000 + i), "start_at": start, "end_at": end,
            "running": int(running),
            "user": rng.choice(("ann", "bo", "cy")), "account": rng.choice(("phys", "bio")),
            "partition": rng.choice(("gpu", "long")), "state": "RUNNING" if running else "COMPLETED",
            "gpu_model": rng.choice(("H100", "L40S")), "gpus": gpus,
            "figures": rng.choice(("complete", "partial", "missing", "none")),
            "measured_gpus": measured, "used_gpu_s": measured * util * (end - start),
            "idle_gpus": rng.choice((0, 0, 1)) if measured else 0, "sm_gpus": measured if util > 0.5 else 0,
            "sm_used_gpu_s": measured * util * 0.7 * (end - start) if util > 0.5 else 0.0,
            "mem_peak_pct": rng.choice((None, rng.random() * 100)),
            "energy_j": rng.choice((None, rng.random() * 1e7)),
            "sampled_gpu_s": measured * (end - start) * 0.9,
            **{f"util_h{k}": rng.random() * 100 for k in range(10)},
            "hint_mask": rng.getrandbits(len(HINT_BITS)) if rng.random() < 0.4 else 0,
            "main_hint": None, "main_severity": None, "main_message": None,
        }
        assert set(row) == set(USAGE_COLUMNS)
        out.append(row)
    return out


def put(store: Store, rows: list[dict[str, Any]]) -> None:
    store.put_usage(rows, [{**r, "node": "n1"} for r in rows],
                    {"cluster": "c", "since": S, "until": S, "at": S, "jobs": len(rows)})


@pytest.fixture
def store(store_url: str) -> Store:
    rng = random.Random(7)
    first_now = S + 5 * DAY + 3600
    rows = runs(rng, 400, first_now)
    made = open_store(store_url)
    for part in range(0, len(rows), 150):  # several syncs
        put(made, rows[part:part + 150])
    # A later sync: the running runs went on, or had ended earlier than the last sync
    # said (its days must be made anew too); and more ran since, a few of the same ids.
    later_now = S + 9 * DAY
    running = [r for r in rows if r["running"]]
    assert len(running) > 10
    early = min(running, key=lambda r: r["start_at"])
    assert early["start_at"] < S + 5 * DAY  # a day before the one it was last seen running on
    ended = [{**early, "end_at": early["start_at"] + 600.0, "running": 0, "state": "COMPLETED"}]
    running.remove(early)
    went_on = [{**r, "end_at": min(later_now, r["start_at"] + 1.5 * DAY), "running": 0, "state": "COMPLETED"}
               for r in running]
    more = [{**r, "job_id": str(int(r["job_id"]) + (0 if i < 5 else 4000))}
            for i, r in enumerate(runs(random.Random(8), 60, later_now))]
    put(made, went_on + more)
    put(made, ended)  # alone and last: only the stored copies tell which days they touched
    return made


def flat(report: dict[str, Any], by: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    keys = [k.replace("-", "_") for k in by]
    everything = {**report["totals"], **{k: "*" for k in keys}}
    return {tuple(g[k] for k in keys): g for g in [*report["groups"], everything]}


@pytest.mark.parametrize("since,until", PERIODS)
def test_the_rollup_gives_what_every_run_gives(store: Store, since: float, until: float,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    queries = [UsageQuery(Period(since, until), by=by) for by in GROUPINGS]
    fast = [usage_report(store, q) for q in queries]
    assert usage_sql.plan(store, queries[0].selection, ())[0].since == since
    if until - since > 2 * DAY:  # whole days inside: some come from the rollup
        assert any(p.rollup for p in usage_sql.plan(store, queries[0].selection, ()))
    monkeypatch.setattr(usage_sql, "_made_days", lambda store, s: set())
    slow = [usage_report(store, q) for q in queries]
    assert not any(p.rollup for p in usage_sql.plan(store, queries[0].selection, ()))
    for query, got, want in zip(queries, fast, slow, strict=True):
        got_groups, want_groups = flat(got, query.by), flat(want, query.by)
        assert got_groups.keys() == want_groups.keys(), query.by
        for key, group in want_groups.items():
            for name, value in group.items():
                if isinstance(value, float):
                    near = pytest.approx(value, rel=1e-9, abs=1e-6)
                    assert got_groups[key][name] == near, (query.by, key, name)
                else:
                    assert got_groups[key][name] == value, (query.by, key, name)


@pytest.mark.parametrize("since,until", PERIODS)
def test_gpu_hours_and_jobs_per_user_run_by_run(store: Store, since: float, until: float) -> None:
    stored = {(r["job_id"], r["start_at"]): r for r in store.read("select * from usage", {})}
    alloc: dict[str, float] = {}
    jobs: dict[str, int] = {}
    for r in stored.values():
        inside = min(r["end_at"], until) - max(r["start_at"], since)
        if r["end_at"] > since and r["start_at"] < until:
            alloc[r["user"]] = alloc.get(r["user"], 0.0) + r["gpus"] * inside / 3600
            jobs[r["user"]] = jobs.get(r["user"], 0) + 1
    report = usage_report(store, UsageQuery(Period(since, until), by=("user",)))
    got = {g["user"]: g for g in report["groups"]}
    assert set(got) == set(jobs)
    for user in jobs:
        assert got[user]["jobs"] == jobs[user]
        assert got[user]["gpu_hours_allocated"] == pytest.approx(alloc[user], rel=1e-9)


def test_days_split_a_run_at_midnight(store_url: str) -> None:
    store = open_store(store_url)
    row = {**runs(random.Random(1), 1, S)[0], "start_at": int(S + DAY - 3600), "end_at": S + DAY + 7200,
           "gpus": 2, "running": 0, "user": "dee"}
    put(store, [row])
    days = usage_report(store, UsageQuery(Period(S, S + 3 * DAY), by=("day",), users=("dee",)))["groups"]
    by_day = {g["day"]: (g["gpu_hours_allocated"], g["jobs"]) for g in days}
    first, second = (time.strftime("%Y-%m-%d", time.localtime(S + k * DAY)) for k in (0, 1))
    # GPU-hours on the day they were used; the job counted on the day it ended
    assert by_day == {first: (pytest.approx(2.0), 0), second: (pytest.approx(4.0), 1)}
