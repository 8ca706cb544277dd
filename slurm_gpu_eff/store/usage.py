"""The usage tables' SQL: what `gpueff report` asks the store (both engines).

A report over a period adds up pieces of it. Whole local days come from the daily rollup
(`usage_days`: base.py), which put_usage keeps in step with the runs;
the rest (the period's first and last part days, days the rollup does not hold, and any
report by node) is a grouped scan of the runs themselves (`usage`, `usage_nodes`), each
run's GPU-seconds clipped to the piece and its figures scaled by the same fraction (a job
half inside counts half its GPU-hours, used, energy). Runs are counted (jobs, hints,
memory peaks) in the piece they ended in, or the period's last when they go on after it.
So a day's GPU-hours are those used that day, and every run counts once.

Every scan of runs is bounded by end_at (indexed): a run touching [a, b) ended after a
and before b plus the longest run stored (`usage_bounds`).

SQL is written once, with `:name` parameters and quoted identifiers ("user" is a word
PostgreSQL keeps); the few differences between the engines are in DIALECTS.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import StoreError
from .base import (
    HINT_BITS,
    USAGE_COLUMNS,
    USAGE_DAY_GROUP,
    USAGE_KEY,
    USAGE_NODE_KEY,
    USAGE_SUM_COLUMNS,
    Store,
)

# How each engine says the smaller / larger of two, and joins texts (nulls left out).
DIALECTS: dict[str, dict[str, str]] = {
    "sqlite": {"least": "min({a}, {b})", "greatest": "max({a}, {b})", "concat": "group_concat({x}, ' ')"},
    "postgresql": {"least": "least({a}, {b})", "greatest": "greatest({a}, {b})",
                   "concat": "string_agg(cast({x} as text), ' ')"},
}
PLAIN_KEYS = {"user": '"user"', "account": "account", "partition": '"partition"', "node": "node",
              "gpu-model": "gpu_model", "cluster": "cluster"}
TIME_KEYS = ("day", "week", "month")
GROUPINGS = (*PLAIN_KEYS, *TIME_KEYS)

# name -> SQL over a piece's runs (`ov`: seconds inside the piece, `f`: that share of the
# run, `w`: 1 if the run is counted in this piece). Seconds throughout: report/usage.py
# makes hours.
SUMS = {
    "jobs": "sum(w)",
    "alloc_gpu_s": "sum(gpus * ov)",
    "measured_gpu_s": "sum(measured_gpus * ov)",
    "used_gpu_s": "sum(used_gpu_s * f)",
    "idle_gpu_s": "sum(idle_gpus * ov)",
    "jobs_idle": "sum(case when idle_gpus > 0 then w else 0 end)",
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
    **{f"hint_{rule}": f"sum(cast((hint_mask >> {bit}) & 1 as integer) * w)"
       for bit, rule in enumerate(HINT_BITS)},
}
assert list(SUMS) == list(USAGE_SUM_COLUMNS)
MEM_PCT = "cast(round(mem_peak_pct) as integer)"
EVER = 1e18  # count_until of the period's last piece: runs going on after it count there
# The rollup's group columns, and what a report's grouping is there.
DAY_GROUP = [PLAIN_KEYS[k.replace("_", "-")] for k in USAGE_DAY_GROUP]
Run = Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]  # a writer's statement -> rows


@dataclass(frozen=True)
class Selection:
    """Which runs: those inside [since, until) for at least a moment, filtered."""

    since: float
    until: float
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Piece:
    """A stretch of the period read one way: from the rollup (whole days it holds) or from
    the runs, counting those that ended by count_until; `label`: a moment of its day."""

    since: float
    until: float
    rollup: bool
    count_until: float = EVER
    label: float = 0.0


def grouped(store: Store, selection: Selection, by: Sequence[str]) -> list[dict[str, Any]]:
    """One row per group with SUMS, and `mem`: the memory peaks (whole percents) of the
    group's runs, space-separated (report/usage.py counts them for the medians: the
    peaks ride along in the one scan instead of a second one per percent)."""
    rows: list[dict[str, Any]] = []
    pieces = plan(store, selection, by)
    days = [p.since for p in pieces if p.rollup]
    if days:
        mem = DIALECTS[store.dialect]["concat"].format(x="mem")
        rows += _read_days(store, selection, days, by, [*(f"sum({n}) as {n}" for n in SUMS), f"{mem} as mem"])
    stretches = [p for p in pieces if not p.rollup]
    if stretches:
        columns = [*(f"{sql} as {name}" for name, sql in SUMS.items()), f"{_mem(store.dialect)} as mem"]
        longest = _longest(store)
        for piece in stretches:
            rows += _read_runs(store, selection, piece, by, columns, longest)
    # A scan with nothing to group gives one row of nulls even where no run was
    return _added([r for r in rows if r["jobs"] is not None], _aliases(by))


def _mem(dialect: str) -> str:
    """The peaks of the runs counted in a piece of runs."""
    return DIALECTS[dialect]["concat"].format(x=f"case when w = 1 then {MEM_PCT} end")


def plan(store: Store, s: Selection, by: Sequence[str]) -> list[Piece]:
    """The period cut into pieces: whole days the rollup holds, and stretches of runs
    between them (cut at local midnights too when grouped by a time)."""
    made = set() if "node" in by else _made_days(store, s)
    cuts = {s.since, s.until} | {t for day in made for t in day}
    if _timed(by):
        cuts |= set(local_midnights(s.since, s.until))
    times = sorted(cuts)
    pieces = [Piece(a, b, True) if (a, b) in made else Piece(a, b, False, b, a)
              for a, b in zip(times, times[1:], strict=False)]
    if pieces[-1].rollup:  # runs going on after the period: counted in a piece of no length
        pieces.append(Piece(s.until, s.until, False, EVER, s.until - 0.001))
    else:
        pieces[-1] = replace(pieces[-1], count_until=EVER)
    if _timed(by):
        return pieces
    joined: list[Piece] = []  # stretches of runs side by side: one scan
    for piece in pieces:
        if joined and not piece.rollup and not joined[-1].rollup and joined[-1].until == piece.since:
            joined[-1] = replace(joined[-1], until=piece.until, count_until=piece.count_until)
        else:
            joined.append(piece)
    return joined


def local_midnights(since: float, until: float) -> list[float]:
    """The local midnights strictly inside (since, until)."""
    return [d0 for d0, _, _ in day_windows(since, until) if since < d0 < until]


def day_windows(lo: float, hi: float) -> list[tuple[float, float, str]]:
    """The local days from lo's to hi's: (midnight, next midnight, date)."""
    day, last = datetime.date.fromtimestamp(lo), datetime.date.fromtimestamp(hi)
    out = []
    while day <= last:
        after = day + datetime.timedelta(days=1)
        out.append((_midnight(day), _midnight(after), day.isoformat()))
        day = after
    return out


def _midnight(day: datetime.date) -> float:
    return time.mktime((day.year, day.month, day.day, 0, 0, 0, 0, 0, -1))


def unmade(store: Store, since: float, until: float) -> tuple[float, float] | None:
    """The first and last midnight of the whole local days in [since, until) that the
    rollup does not hold (a store from before it), or None."""
    made = {d0 for d0, _ in _made_days(store, Selection(since, until))}
    missing = [d0 for d0, d1, _ in day_windows(since, until)
               if since <= d0 and d1 <= until and d0 not in made]
    return (missing[0], missing[-1]) if missing else None


def _made_days(store: Store, s: Selection) -> set[tuple[float, float]]:
    try:
        rows = store.read("select d0, d1 from usage_days_made where d0 >= :since and d1 <= :until",
                          {"since": s.since, "until": s.until})
    except StoreError:  # a store from before the rollup (m005), not yet migrated by a writer
        return set()
    return {(float(r["d0"]), float(r["d1"])) for r in rows}


def _longest(store: Store) -> float | None:
    try:
        rows = store.read("select value from usage_bounds where name = 'longest_s'", {})
    except StoreError:
        return None
    return float(rows[0]["value"]) if rows and rows[0]["value"] is not None else None


def _read_days(store: Store, s: Selection, days: list[float], by: Sequence[str],
               columns: list[str]) -> list[dict[str, Any]]:
    """Sums over these days of the rollup, per group (and day, for a time key)."""
    names = {f"d{i}": d0 for i, d0 in enumerate(days)}
    where, args = _filters(s)
    where.insert(0, f"d0 in ({', '.join(':' + n for n in names)})")
    group = [*_rollup_keys(by), *(["day"] if _timed(by) else [])]
    picked = [*(f"{k} as {_alias(n)}" for k, n in zip(_rollup_keys(by), _plain(by), strict=True)),
              *(["day"] if _timed(by) else [])]
    text = f"select {', '.join([*picked, *columns])} from usage_days where {' and '.join(where)}"
    if group:
        text += f" group by {', '.join(group)}"
    rows = store.read(text, args | names)
    for row in rows:
        if "day" in row:
            _label(row, row.pop("day"), by)
    return rows


def _read_runs(store: Store, s: Selection, piece: Piece, by: Sequence[str], columns: list[str],
               longest: float | None) -> list[dict[str, Any]]:
    """Sums over the runs of a stretch, per group (its day's, for a time key)."""
    table = "usage_nodes" if "node" in by else "usage"
    keys = [PLAIN_KEYS[k] for k in _plain(by)]
    inner, args = _period(store.dialect, replace(s, since=piece.since, until=piece.until), table,
                          piece.count_until, longest)
    picked = [f"{k} as {_alias(n)}" for k, n in zip(keys, _plain(by), strict=True)]
    text = f"select {', '.join([*picked, *columns])} from ({inner}) as runs"
    if keys:
        text += f" group by {', '.join(keys)}"
    rows = store.read(text, args)
    if _timed(by):
        day = time.strftime("%Y-%m-%d", time.localtime(piece.label))
        for row in rows:
            _label(row, day, by)
    return rows


def _label(row: dict[str, Any], day: str, by: Sequence[str]) -> None:
    """A row's time keys from the date of its day."""
    date = datetime.date.fromisoformat(day)
    for name in by:
        if name == "day":
            row["day"] = day
        elif name == "week":  # the Monday
            row["week"] = (date - datetime.timedelta(days=date.weekday())).isoformat()
        elif name == "month":
            row["month"] = day[:7]


def _added(rows: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """Rows summed per group (the pieces of a period give a group several)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        if key not in out:
            out[key] = dict(row)
            continue
        total = out[key]
        for name in SUMS:
            total[name] = (total[name] or 0) + (row[name] or 0)
        total["mem"] = " ".join(m for m in (total["mem"], row["mem"]) if m)
    return list(out.values())


def _timed(by: Sequence[str]) -> bool:
    return any(name in TIME_KEYS for name in by)


def _plain(by: Sequence[str]) -> list[str]:
    return [name for name in by if name in PLAIN_KEYS]


def _rollup_keys(by: Sequence[str]) -> list[str]:
    return [PLAIN_KEYS[name] for name in _plain(by)]


def _aliases(by: Sequence[str]) -> list[str]:
    return [name.replace("-", "_") for name in by]


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


def _period(dialect_name: str, s: Selection, table: str, count_until: float = EVER,
            longest: float | None = None) -> tuple[str, dict[str, Any]]:
    d = DIALECTS[dialect_name]
    overlap = (d["least"].format(a="end_at", b=":until") + " - "
               + d["greatest"].format(a="start_at", b=":since"))
    where = ["end_at > :since", "start_at < :until"]
    args: dict[str, Any] = {"since": s.since, "until": s.until, "count_until": count_until}
    if longest is not None:  # an index range, not every run since `since`
        where.append("end_at <= :bound")
        args["bound"] = s.until + longest + 1.0
    more, named = _filters(s)
    text = (f"select *, ({overlap}) as ov, case when end_at > start_at "
            f"then ({overlap}) / (end_at - start_at) else 1.0 end as f, "
            f"case when end_at <= :count_until then 1 else 0 end as w "
            f"from {table} where {' and '.join(where + more)}")
    return text, args | named


def _filters(s: Selection) -> tuple[list[str], dict[str, Any]]:
    where: list[str] = []
    args: dict[str, Any] = {}
    for column, values in (('"user"', s.users), ("account", s.accounts), ('"partition"', s.partitions)):
        if values:
            names = [f"{column.strip(chr(34))}{i}" for i in range(len(values))]
            where.append(f"{column} in ({', '.join(':' + n for n in names)})")
            args |= dict(zip(names, values, strict=True))
    return where, args


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


def spans_before(run: Run, job_rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Where the stored copies of these runs lay (a running one's end has moved since):
    their days are made anew too. Any run of the same job ids, to keep it one query."""
    ids: dict[str, set[str]] = {}
    for row in job_rows:
        ids.setdefault(row["cluster"], set()).add(row["job_id"])
    spans = []
    for cluster, found in ids.items():
        listed = sorted(found)
        for first in range(0, len(listed), 500):
            names = {f"j{i}": job for i, job in enumerate(listed[first:first + 500])}
            rows = run(f"select min(start_at), max(end_at) from usage where cluster = :cluster "
                       f"and job_id in ({', '.join(':' + n for n in names)})", {"cluster": cluster, **names})
            if rows and rows[0][0] is not None:
                spans.append((float(rows[0][0]), float(rows[0][1])))
    return spans


def spans_of(job_rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    if not job_rows:
        return []
    return [(min(float(r["start_at"]) for r in job_rows), max(float(r["end_at"]) for r in job_rows))]


def refresh_days(run: Run, dialect: str, spans: Iterable[tuple[float, float]],
                 longest_seen: float = 0.0) -> int:
    """Make the rollup anew for every local day the spans touch, from the runs as they
    are now (a writer calls it in the transaction that changed them). Returns the days."""
    days = sorted({window for lo, hi in spans for window in day_windows(lo, hi)})
    if not days:
        return 0
    stored = run("select value from usage_bounds where name = 'longest_s'", {})
    if stored and stored[0][0] is not None:
        longest = max(float(stored[0][0]), longest_seen)
    else:  # the first time: one scan
        longest = max(float(run("select max(end_at - start_at) from usage", {})[0][0] or 0.0), longest_seen)
    run("insert into usage_bounds (name, value) values ('longest_s', :longest) "
        "on conflict (name) do update set value = excluded.value", {"longest": longest})
    group = ", ".join(DAY_GROUP)
    for d0, d1, day in days:
        span = {"d0": d0, "d1": d1, "day": day}
        for table in ("usage_days", "usage_days_made"):
            run(f"delete from {table} where d0 < :d1 and d1 > :d0", span)
        inner, args = _period(dialect, Selection(d0, d1), "usage", d1, longest)
        run(f"insert into usage_days (d0, d1, day, {group}, {', '.join(SUMS)}, mem) "
            f"select :d0, :d1, :day, {group}, {', '.join(SUMS.values())}, {_mem(dialect)} "
            f"from ({inner}) as runs group by {group}", args | span)
        run("insert into usage_days_made (d0, d1, day) values (:d0, :d1, :day)", span)
    return len(days)


def longest_of(job_rows: list[dict[str, Any]]) -> float:
    return max((float(r["end_at"]) - float(r["start_at"]) for r in job_rows), default=0.0)
