"""Which hints fired, as the usage store keeps them: every rule has a bit in hint_mask and
a column in the daily rollup (m006 adds issue 23's), and a store whose rollup m005 made
reads as before once migrated, on both engines."""

from __future__ import annotations

import time
from typing import Any

import pytest

from slurm_gpu_eff.report.hints import RULE_BY_ID
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.report.shapes import Hint
from slurm_gpu_eff.report.usage import Period, UsageQuery, usage_report, usage_rows
from slurm_gpu_eff.store import open_store
from slurm_gpu_eff.store import usage as usage_sql
from slurm_gpu_eff.store.base import HINT_BITS, HINTS_M005, SCHEMA

H = 3600.0
S = time.mktime((2026, 11, 2, 0, 0, 0, 0, 0, -1))  # a Monday, local time
U = S + 7 * 86400
BEFORE_ISSUE_23 = ("idle_gpus", "low_util", "falsely_busy", "tensor_cores_unused", "memory_bound",
                   "gpu_memory", "pcie_bound", "nvlink_bound", "spread_nodes", "cpu_side", "time_limit",
                   "short_job", "hardware", "idle_stretch")


def test_every_rule_has_a_bit_and_the_old_bits_keep_their_place() -> None:
    assert set(RULE_BY_ID) <= set(HINT_BITS)
    assert HINT_BITS[:len(BEFORE_ISSUE_23)] == BEFORE_ISSUE_23 == HINTS_M005
    assert len(set(HINT_BITS)) == len(HINT_BITS)


def warned(make_job: Any, make_summary: Any, job_id: str, rule: str, start: float) -> tuple[Any, Any]:
    """A run's usage rows with one warning of `rule`."""
    job = make_job(job_id=job_id, job_id_raw=job_id, elapsed_s=7200,
                   start=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)))
    report = build_report(job, [make_summary()])
    report.hints = [Hint(rule, "warning", "user", f"{rule} on {job_id}", {}, "fix it", None)]
    return usage_rows(job, report, now=U)


@pytest.mark.parametrize("rule", ["imbalance", "low_sm", "main_loading", "idle_interactive", "idle_mig"])
def test_a_new_rules_warning_is_counted(store_url: str, make_job: Any, make_summary: Any, rule: str) -> None:
    row, nodes = warned(make_job, make_summary, "31", rule, S + H)
    assert row["hint_mask"] == 1 << HINT_BITS.index(rule)
    store = open_store(store_url)
    store.put_usage([row], nodes, {"cluster": row["cluster"], "since": S, "until": U, "at": U, "jobs": 1})
    data = usage_report(store, UsageQuery(Period(S, U)))
    assert data["totals"]["top_hints"] == [{"rule": rule, "jobs": 1}]


def test_a_store_whose_rollup_m005_made_reads_as_before(
    store_url: str, make_job: Any, make_summary: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs put and days rolled up by a slurm-gpu-eff before m006, then the store opened
    by this one: migrated, and the old days (null in the new columns) read as the runs."""
    old, _ = warned(make_job, make_summary, "41", "low_util", S + H)
    with monkeypatch.context() as before:  # the code before m006: its migrations, its sums
        before.setattr(usage_sql, "SUMS", {k: v for k, v in usage_sql.SUMS.items()
                                           if not k.startswith("hint_") or k[5:] in HINTS_M005})
        if store_url.startswith("sqlite://"):
            import sqlite_utils

            from slurm_gpu_eff.store import sqlite as engine
            from slurm_gpu_eff.store.sqlite_schema import migrations

            path = store_url.removeprefix("sqlite://")
            open_store(store_url).close()  # the file, with the rights a store gets
            (done := sqlite_utils.Database(path)).conn.execute("drop table _sqlite_migrations")
            for table in list(done.table_names()):
                done[table].drop()
            migrations.apply(done, stop_before="m006_usage_days_hints")
            done.close()
            before.setattr(engine.SqliteStore, "_migrate", lambda self: None)
        else:
            from slurm_gpu_eff.store import postgres

            before.setattr(postgres, "MIGRATIONS", postgres.MIGRATIONS[:5])
        store = open_store(store_url)
        assert store.schema() == list(SCHEMA[:5])
        store.put_usage([old], [{**old, "node": "gpu1"}],
                        {"cluster": old["cluster"], "since": S, "until": U, "at": U, "jobs": 1})
        store.close()
    store = open_store(store_url)
    assert store.schema() == list(SCHEMA)
    new, nodes = warned(make_job, make_summary, "42", "imbalance", S + 3 * 86400)
    store.put_usage([new], nodes, {"cluster": new["cluster"], "since": S, "until": U, "at": U, "jobs": 1})
    query = UsageQuery(Period(S, U), by=("day",))
    fast = usage_report(store, query)
    assert any(p.rollup for p in usage_sql.plan(store, query.selection, ()))
    monkeypatch.setattr(usage_sql, "_made_days", lambda store, s: set())
    assert usage_report(store, query) == fast  # the rollup, old days and new, gives what the runs give
    assert fast["totals"]["top_hints"] == [{"rule": "imbalance", "jobs": 1}, {"rule": "low_util", "jobs": 1}]
