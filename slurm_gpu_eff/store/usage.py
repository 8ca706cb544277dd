"""The usage tables' SQL: what `gpueff report` asks the store (both engines).

A report over a period is one grouped scan of `usage` (`usage_nodes` when grouped by
node): each job run's allocated GPU-seconds are clipped to the period, and its figures
scaled by the same fraction (a job half inside the period counts half its GPU-hours,
used, energy); and a narrow one counting runs per group and peak-memory percent (whole
percents), from which the caller gets the medians (report/usage.py).

SQL is written once, with `:name` parameters and quoted identifiers ("user" is a word
PostgreSQL keeps); the few differences between the engines are in DIALECTS.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import HINT_BITS, USAGE_COLUMNS, USAGE_KEY, USAGE_NODE_KEY, Store

# How each engine says: the smaller / larger of two, and an epoch as a local date key.
DIALECTS: dict[str, dict[str, str]] = {
    "sqlite": {
        "least": "min({a}, {b})", "greatest": "max({a}, {b})",
        "day": "date({t}, 'unixepoch', 'localtime')",
        "week": "date({t}, 'unixepoch', 'localtime', 'weekday 0', '-6 days')",
        "month": "strftime('%Y-%m', {t}, 'unixepoch', 'localtime')",
    },
    "postgresql": {
        "least": "least({a}, {b})", "greatest": "greatest({a}, {b})",
        "day": "to_char(to_timestamp({t}), 'YYYY-MM-DD')",
        "week": "to_char(date_trunc('week', to_timestamp({t})), 'YYYY-MM-DD')",
        "month": "to_char(to_timestamp({t}), 'YYYY-MM')",
    },
}
PLAIN_KEYS = {"user": '"user"', "account": "account", "partition": '"partition"', "node": "node",
              "gpu-model": "gpu_model", "cluster": "cluster"}
TIME_KEYS = ("day", "week", "month")
GROUPINGS = (*PLAIN_KEYS, *TIME_KEYS)

# name -> SQL over the period's rows (`ov`: seconds inside the period, `f`: that share
# of the run). Seconds throughout: report/usage.py makes hours.
SUMS = {
    "jobs": "count(*)",
    "alloc_gpu_s": "sum(gpus * ov)",
    "measured_gpu_s": "sum(measured_gpus * ov)",
    "used_gpu_s": "sum(used_gpu_s * f)",
    "idle_gpu_s": "sum(idle_gpus * ov)",
    "jobs_idle": "sum(case when idle_gpus > 0 then 1 else 0 end)",
    "sm_gpu_s": "sum(sm_gpus * ov)",
    "sm_used_gpu_s": "sum(sm_used_gpu_s * f)",
    "energy_j": "sum(coalesce(energy_j, 0) * f)",
    "energy_gpu_s": "sum(case when energy_j is null then 0 else gpus * ov end)",
    "sampled_gpu_s": "sum(sampled_gpu_s * f)",
    "complete_gpu_s": "sum(case when figures = 'complete' then gpus * ov else 0 end)",
    "partial_gpu_s": "sum(case when figures in ('partial', 'running') then gpus * ov else 0 end)",
    "missing_gpu_s": "sum(case when figures in ('missing', 'none') then gpus * ov else 0 end)",
    **{f"util_h{i}": f"sum(util_h{i} * f)" for i in range(10)},
    # integer, not bigint: PostgreSQL sums a bigint as numeric (slow, and Decimal in Python)
    **{f"hint_{rule}": f"sum(cast((hint_mask >> {bit}) & 1 as integer))"
       for bit, rule in enumerate(HINT_BITS)},
}


@dataclass(frozen=True)
class Selection:
    """Which runs: those inside [since, until) for at least a moment, filtered."""

    since: float
    until: float
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()


def grouped(store: Store, selection: Selection, by: Sequence[str]) -> list[dict[str, Any]]:
    """One row per group with SUMS."""
    dialect = DIALECTS[store.dialect]
    keys = [_key(dialect, name) for name in by]
    columns = [f"{sql} as {_alias(name)}" for name, sql in zip(by, keys, strict=True)]
    sums = [f"{sql} as {name}" for name, sql in SUMS.items()]
    inner, args = _period(store.dialect, selection, "usage_nodes" if "node" in by else "usage")
    text = f"select {', '.join([*columns, *sums])} from ({inner}) as runs"
    return store.read(text + (f" group by {', '.join(keys)}" if keys else ""), args)


def memory_peaks(store: Store, selection: Selection, by: Sequence[str]) -> list[dict[str, Any]]:
    """Per group, how many runs peaked at each whole percent of GPU memory (the medians
    come from these counts: a narrow scan, not a wide one per percent)."""
    dialect = DIALECTS[store.dialect]
    keys = [_key(dialect, name) for name in by]
    columns = [f"{sql} as {_alias(name)}" for name, sql in zip(by, keys, strict=True)]
    mem = "cast(round(mem_peak_pct) as integer)"
    inner, args = _period(store.dialect, selection, "usage_nodes" if "node" in by else "usage")
    text = (f"select {', '.join([*columns, f'{mem} as mem_pct', 'count(*) as runs'])} from ({inner}) as runs "
            f"where mem_peak_pct is not null group by {', '.join([*keys, mem])}")
    return store.read(text, args)


def top_jobs(store: Store, selection: Selection, limit: int) -> list[dict[str, Any]]:
    """The runs that wasted the most GPU-hours inside the period (measured, not used)."""
    inner, args = _period(store.dialect, selection, "usage")
    wasted = "(measured_gpus * ov - used_gpu_s * f)"
    text = (f'select cluster, job_id, start_at, end_at, running, "user", account, "partition", '
            f"gpus, gpu_model, figures, gpus * ov as alloc_gpu_s, measured_gpus * ov as measured_gpu_s, "
            f"used_gpu_s * f as used_gpu_s, idle_gpus, main_hint, main_severity, main_message, "
            f"{wasted} as wasted_gpu_s from ({inner}) as runs "
            f"order by {wasted} desc, job_id limit {int(limit)}")
    return store.read(text, args)


def first_warnings(store: Store, selection: Selection) -> list[dict[str, Any]]:
    """Per user and warning rule, the first run in the period that got it (by its end)."""
    inner, args = _period(store.dialect, selection, "usage")
    firsts = ", ".join(f"min(case when ((hint_mask >> {bit}) & 1) = 1 then end_at end) as first_{rule}"
                       for bit, rule in enumerate(HINT_BITS))
    rows = store.read(f'select "user", {firsts} from ({inner}) as runs where hint_mask > 0 group by "user"',
                      args)
    found = []
    for row in rows:
        for rule in HINT_BITS:
            if row[f"first_{rule}"] is not None:
                found.append({"user": row["user"], "rule": rule, "at": row[f"first_{rule}"]})
    return found


def before_after(store: Store, selection: Selection, firsts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (user, rule, at): the user's runs that ended by `at` (the first warned run
    among them) and those that started after it, with their sums."""
    if not firsts:
        return []
    inner, args = _period(store.dialect, selection, "usage")
    values = ", ".join(f"(:fu{i}, :fr{i}, :fa{i})" for i in range(len(firsts)))
    for i, first in enumerate(firsts):
        args |= {f"fu{i}": first["user"], f"fr{i}": first["rule"], f"fa{i}": first["at"]}
    parts = []
    for side, test in (("before", "runs.end_at <= f.at"), ("after", "runs.start_at >= f.at")):
        parts += [f"sum(case when {test} then 1 else 0 end) as {side}_jobs",
                  f"sum(case when {test} then measured_gpus * ov else 0 end) as {side}_measured_gpu_s",
                  f"sum(case when {test} then used_gpu_s * f else 0 end) as {side}_used_gpu_s"]
    text = (f"with f(fuser, rule, at) as (values {values}) "
            f"select f.fuser as \"user\", f.rule as rule, f.at as at, {', '.join(parts)} "
            f'from ({inner}) as runs join f on runs."user" = f.fuser group by f.fuser, f.rule, f.at')
    return store.read(text, args)


def existing(store: Store, selection: Selection) -> dict[tuple[str, str, int], tuple[str, int, str]]:
    """The runs already stored for the period: key -> (state, running, figures)."""
    inner, args = _period(store.dialect, selection, "usage")
    text = f"select cluster, job_id, start_at, state, running, figures from ({inner}) as runs"
    rows = store.read(text, args)
    return {(r["cluster"], r["job_id"], int(r["start_at"])): (r["state"], r["running"], r["figures"])
            for r in rows}


def last_sync(store: Store) -> dict[str, Any] | None:
    rows = store.read("select cluster, since, until, at, jobs from usage_syncs order by at desc limit 1", {})
    return rows[0] if rows else None


def _period(dialect_name: str, s: Selection, table: str) -> tuple[str, dict[str, Any]]:
    d = DIALECTS[dialect_name]
    overlap = (d["least"].format(a="end_at", b=":until") + " - "
               + d["greatest"].format(a="start_at", b=":since"))
    where = ["end_at > :since", "start_at < :until"]
    args: dict[str, Any] = {"since": s.since, "until": s.until}
    for column, values in (('"user"', s.users), ("account", s.accounts), ('"partition"', s.partitions)):
        if values:
            names = [f"{column.strip(chr(34))}{i}" for i in range(len(values))]
            where.append(f"{column} in ({', '.join(':' + n for n in names)})")
            args |= dict(zip(names, values, strict=True))
    text = (f"select *, ({overlap}) as ov, case when end_at > start_at "
            f"then ({overlap}) / (end_at - start_at) else 1.0 end as f "
            f"from {table} where {' and '.join(where)}")
    return text, args


def _key(dialect: dict[str, str], name: str) -> str:
    if name in PLAIN_KEYS:
        return PLAIN_KEYS[name]
    if name in TIME_KEYS:  # a run belongs to the day (week, month) it ended in, or the
        # period's last (a moment before `until`: a period to midnight has no next day)
        return dialect[name].format(t=dialect["least"].format(a="end_at", b=":until") + " - 0.001")
    raise ValueError(f"unknown grouping {name!r}")


def _alias(name: str) -> str:
    return '"' + name.replace("-", "_") + '"'


def placeholders_for(dialect: str, text: str) -> str:
    """`:name` -> psycopg's `%(name)s` (the SQL holds no other colon nor percent sign)."""
    if dialect == "sqlite":
        return text
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", text.replace("%", "%%"))


Written = list[tuple[str, tuple[str, ...], list[dict[str, Any]]]]


def write_rows(job_rows: list[dict[str, Any]], node_rows: list[dict[str, Any]]) -> Written:
    """What put_usage writes: (table, key, rows), each row with every column."""
    for row in job_rows:
        missing = set(USAGE_COLUMNS) - set(row)
        if missing:
            raise ValueError(f"usage row without {sorted(missing)}")
    return [("usage", USAGE_KEY, job_rows), ("usage_nodes", USAGE_NODE_KEY, node_rows)]
