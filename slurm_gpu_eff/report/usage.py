"""Usage reports (`gpueff report`): where a period's GPU-hours went, who wasted them, what
they cost, how far the monitoring covers them, and whether advice changed anything.

Two steps. `sync` brings the store's usage tables up to date for the period: Slurm's
accounting (one sacct call) names every GPU job run, so runs the monitoring missed still
count; each gets the figures `gpueff JOBID` gives it (the same report, built by job.py).
`usage_report` then asks the store for sums per group (store/usage.py: whole days from
the daily rollup, the period's part days from the runs) and makes them hours,
percentages, medians, cost and CO2.

Efficiency is used over allocated GPU-hours *of the GPUs measured* (never a mean of job
means): a run the monitoring missed would otherwise pass for an idle one. How much of
the allocation that is, is the coverage columns' job.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import NoGpus, NoSummary, UsageError
from ..hostlist import expand_hostlist
from ..model import IDLE_UTIL
from ..slurm.records import SlurmJob, local_epoch, parse_tres, sacct_time
from ..store.base import HINT_BITS, Store
from ..store.usage import (
    GROUPINGS,
    Selection,
    before_after,
    existing,
    first_warnings,
    grouped,
    top_jobs,
    unmade,
)
from .figures import gather
from .hints import HintSettings
from .job import build_report
from .shapes import JobReport

HOUR = 3600.0
SEVERE = ("critical", "warning")  # the hints counted, and followed up by the trend
SETTLE_S = 2 * 86400.0  # a run ended this long ago with no complete figures will get none
TOP_HINTS = 3

_RELATIVE = re.compile(r"^now(?:([+-])(\d+)(seconds?|minutes?|hours?|days?|weeks?)?)?$")
_UNIT_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def parse_when(text: str, now: float) -> float:
    """A time as sacct's -S/-E take it: 2026-11-01, 2026-11-01T08:00[:00], now, now-7days."""
    value = text.strip()
    match = _RELATIVE.match(value.lower())
    if match:
        sign, count, unit = match.groups()
        if sign is None:
            return now
        seconds = int(count) * _UNIT_S[(unit or "seconds").rstrip("s")]
        return now - seconds if sign == "-" else now + seconds
    for form in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(value, form))
        except (ValueError, OverflowError):
            continue
    raise UsageError(f"{text!r} is not a time: say 2026-11-01, 2026-11-01T08:00:00 or now-7days")


@dataclass(frozen=True)
class Period:
    since: float
    until: float

    @classmethod
    def parse(cls, since: str, until: str, now: float) -> Period:
        period = cls(parse_when(since, now), parse_when(until, now))
        if period.until <= period.since:
            raise UsageError(f"the period ends ({until}) before it starts ({since})")
        return period

    def to_dict(self) -> dict[str, str]:
        return {"since": sacct_time(self.since), "until": sacct_time(self.until)}


@dataclass(frozen=True)
class UsageQuery:
    period: Period
    by: tuple[str, ...] = ("user",)
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    min_gpu_hours: float = 0.0
    top: int = 0
    trend: bool = False
    charts: bool = False  # what the HTML page draws besides the tables
    price_per_kwh: float | None = None
    currency: str = ""
    co2_g_per_kwh: float | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.by if name not in GROUPINGS]
        if unknown:
            raise UsageError(f"cannot group by {', '.join(unknown)}: say one or more of "
                             f"{', '.join(GROUPINGS)}")

    @property
    def selection(self) -> Selection:
        return Selection(self.period.since, self.period.until, self.users, self.accounts, self.partitions)


# -- sync: Slurm's accounting and the summaries into the usage tables ----------------------


@dataclass
class Synced:
    jobs: int = 0  # GPU job runs in the period, from sacct
    updated: int = 0  # of those, rows (re)written
    notes: list[str] = field(default_factory=list)


def gpu_jobs(jobs: Iterable[SlurmJob]) -> list[SlurmJob]:
    """Runs that had GPUs and started (a pending job or array range has no allocation)."""
    return [j for j in jobs if j.gpus > 0 and j.state != "PENDING" and local_epoch(j.start) is not None]


def sync(store: Store, jobs: list[SlurmJob], period: Period, read_store: Callable[[], Store],
         settings: HintSettings | None = None, now: float | None = None,
         progress: Callable[[int, int], None] | None = None, batch: int = 2000,
         node_shares: dict[str, dict[str, int]] | None = None) -> Synced:
    """Write each run's usage rows, except runs whose rows can no longer change (ended, and
    with complete figures or ended SETTLE_S ago). `jobs`: sacct's rows for the period;
    `node_shares`: each node's share from Slurm (the hints that weigh a job against it)."""
    now = time.time() if now is None else now
    jobs = gpu_jobs(jobs)
    done = existing(store, Selection(period.since, period.until))
    todo = [j for j in jobs if not _settled(j, done.get((j.cluster, j.job_id_raw, _start(j))), now)]
    result = Synced(jobs=len(jobs))
    for first in range(0, len(todo), batch) if todo else [0]:
        part = todo[first:first + batch]
        job_rows: list[dict[str, Any]] = []
        node_rows: list[dict[str, Any]] = []
        for found in gather(part, read_store) if part else []:
            report = _report(found.job, found.summaries, settings, found.unavailable, node_shares)
            row, nodes = usage_rows(found.job, report, now)
            job_rows.append(row)
            node_rows.extend(nodes)
        store.put_usage(job_rows, node_rows, {"cluster": jobs[0].cluster if jobs else "",
                                               "since": period.since, "until": min(period.until, now),
                                               "at": now, "jobs": len(job_rows)})
        result.updated += len(job_rows)
        if progress:
            progress(min(first + batch, len(todo)), len(todo))
    days = unmade(store, period.since, min(period.until, now))
    if days:  # a store from before the daily rollup: its days are made once
        store.refresh_usage_days(*days)
    return result


def _settled(job: SlurmJob, stored: tuple[str, int, str] | None, now: float) -> bool:
    if stored is None or job.running or stored[1]:
        return False
    state, _, figures = stored
    ended = (local_epoch(job.start) or now) + job.elapsed_s
    return state == job.state and (figures == "complete" or now - ended > SETTLE_S)


def _report(job: SlurmJob, summaries: list[Any], settings: HintSettings | None,
            unavailable: str, node_shares: dict[str, dict[str, int]] | None = None) -> JobReport | None:
    try:
        return build_report(job, summaries, settings, unavailable, node_shares)
    except (NoGpus, NoSummary):
        return None


Row = dict[str, Any]


def usage_rows(job: SlurmJob, report: JobReport | None, now: float) -> tuple[Row, list[Row]]:
    """A run's row (whole job) and its rows per node, from its accounting and its report."""
    start = _start(job)
    common = {
        "cluster": job.cluster, "job_id": job.job_id_raw, "start_at": start,
        "end_at": float(start + job.elapsed_s) if not job.running else max(float(start), now),
        "running": int(job.running), "user": job.user, "account": job.account,
        "partition": job.partition, "state": job.state, "gpu_model": _model(job, report),
    }
    gpus = report.gpus if report else []
    hints = report.hints if report else []
    severe = [h for h in hints if h.severity in SEVERE]
    mask = sum(1 << HINT_BITS.index(h.id) for h in {h.id: h for h in severe}.values() if h.id in HINT_BITS)
    # The user's first hint: a hardware fault is the site's, and never the job's to fix.
    main = next((h for h in hints if h.audience == "user"), hints[0] if hints else None)
    judged = {"hint_mask": mask, "main_hint": main.id if main else None,
              "main_severity": main.severity if main else None,
              "main_message": main.message if main else None}
    status = report.status if report else "none"
    row = {**common, "gpus": job.gpus, "figures": status, **_figures(gpus, job.elapsed_s), **judged}
    nodes = []
    listed = job.nodelist.strip()
    names = expand_hostlist(listed) if listed and listed != "None assigned" else []
    share = _gpus_per_node(names, gpus, job.gpus)
    for node in names:
        mine = [g for g in gpus if g.node == node]
        seen = status if mine or status == "none" else "missing"
        nodes.append({**common, "gpus": share[node], "figures": seen, **_figures(mine, job.elapsed_s),
                      **judged, "node": node})
    return row, nodes


def _figures(gpus: Sequence[Any], elapsed_s: int) -> dict[str, Any]:
    measured = [g for g in gpus if g.util_mean is not None]
    sm = [g.metric("sm_active") for g in gpus if g.metric("sm_active") is not None]
    peaks = [100.0 * g.mem_used_max_bytes / g.mem_total_bytes for g in gpus
             if g.mem_used_max_bytes is not None and g.mem_total_bytes]
    energy = [g.energy_j for g in gpus if g.energy_j is not None]
    hist = [0.0] * 10
    for g in gpus:
        for i, seconds in enumerate((g.summary.util_histogram_s or [])[:10] if g.summary else []):
            hist[i] += seconds
    return {
        "measured_gpus": len(measured),
        "used_gpu_s": sum(g.util_mean / 100.0 * elapsed_s for g in measured),
        "idle_gpus": sum(1 for g in measured if g.util_mean < IDLE_UTIL),
        "sm_gpus": len(sm), "sm_used_gpu_s": sum(v / 100.0 * elapsed_s for v in sm),
        "mem_peak_pct": max(peaks) if peaks else None,
        "energy_j": sum(energy) if energy else None,
        "sampled_gpu_s": sum(g.sampled_s for g in gpus),
        **{f"util_h{i}": hist[i] for i in range(10)},
    }


def _gpus_per_node(nodes: list[str], gpus: Sequence[Any], allocated: int) -> dict[str, int]:
    """Each node's GPUs: those measured there; the rest of the allocation spread evenly over
    the nodes with none measured (Slurm's accounting gives only the job's total)."""
    share = {node: sum(1 for g in gpus if g.node == node) for node in nodes}
    unseen = [node for node in nodes if not share[node]]
    left = max(0, allocated - sum(share.values()))
    for i, node in enumerate(unseen):
        share[node] = left // len(unseen) + (1 if i < left % len(unseen) else 0)
    return share


def _model(job: SlurmJob, report: JobReport | None) -> str:
    names = [g.name for g in (report.gpus if report else []) if g.name]
    if names:
        return max(set(names), key=names.count)
    typed = [key.split(":", 1)[1] for key in parse_tres(job.alloc_tres)
             if key.startswith("gres/gpu:")]
    return typed[0] if typed else "unknown"


def _start(job: SlurmJob) -> int:
    return int(local_epoch(job.start) or 0)


# -- the report ------------------------------------------------------------------------------


def usage_report(store: Store, query: UsageQuery) -> dict[str, Any]:
    """The report as one JSON-ready object: period, groups, totals, top, and what the page
    draws (utilisation buckets, days, users, trend)."""
    selection = query.selection
    rows = _grouped(store, selection, query.by)
    groups = [_finish(g, query) for g in rows]
    everything = _sum(rows)
    if "node" in query.by:  # a job on two nodes is one job in the totals
        everything = _sum(_grouped(store, selection, ()))
    totals = _finish(everything, query)
    kept = [g for g in groups if g["gpu_hours_allocated"] >= query.min_gpu_hours]
    kept.sort(key=lambda g: (-(g["gpu_hours_wasted"] or 0.0), -g["gpu_hours_allocated"],
                             [str(g[k]) for k in _keys(query.by)]))
    out: dict[str, Any] = {
        "period": query.period.to_dict(), "by": [k.replace("-", "_") for k in query.by],
        "groups": kept, "totals": totals, "top": [],
        "util_buckets": [{"bucket": f"{10 * i}-{10 * i + 10}%",
                          "gpu_hours": everything.get(f"util_h{i}", 0.0) / HOUR} for i in range(10)],
    }
    if query.top:
        out["top"] = [_top(row) for row in top_jobs(store, selection, query.top)]
    if query.charts:
        out["days"] = [_finish(g, query) for g in _grouped(store, selection, ("day",))]
        users = groups if query.by == ("user",) else [
            _finish(g, query) for g in _grouped(store, selection, ("user",))]
        out["users"] = [{"user": u["user"], "gpu_hours_allocated": u["gpu_hours_allocated"],
                         "efficiency_pct": u["efficiency_pct"]} for u in users]
    if query.trend:
        out["trend"] = trend(store, query)
    return out


def trend(store: Store, query: UsageQuery) -> list[dict[str, Any]]:
    """Per user: efficiency per week, and before / after the first run of the period that
    got each warning (the runs that ended by it, and those that started after it)."""
    selection = query.selection
    weeks: dict[str, list[dict[str, Any]]] = {}
    for g in _grouped(store, selection, ("user", "week")):
        done = _finish(g, query)
        weeks.setdefault(done["user"], []).append(
            {"week": done["week"], "jobs": done["jobs"], "gpu_hours_allocated": done["gpu_hours_allocated"],
             "efficiency_pct": done["efficiency_pct"]})
    advice: dict[str, list[dict[str, Any]]] = {}
    for row in before_after(store, selection, first_warnings(store, selection)):
        sides = {side: {"jobs": int(row[f"{side}_jobs"] or 0),
                        "gpu_hours_measured": (row[f"{side}_measured_gpu_s"] or 0.0) / HOUR,
                        "efficiency_pct": _pct(row[f"{side}_used_gpu_s"], row[f"{side}_measured_gpu_s"])}
                 for side in ("before", "after")}
        advice.setdefault(row["user"], []).append(
            {"rule": row["rule"], "first_at": sacct_time(row["at"]), **sides})
    users = sorted(set(weeks) | set(advice))
    return [{"user": u, "weeks": sorted(weeks.get(u, []), key=lambda w: w["week"]),
             "advice": sorted(advice.get(u, []), key=lambda a: (a["first_at"], a["rule"]))} for u in users]


def _keys(by: Sequence[str]) -> list[str]:
    return [k.replace("-", "_") for k in by]


def _grouped(store: Store, selection: Selection, by: Sequence[str]) -> list[Row]:
    """The store's rows per group, each `mem` as how many runs peaked at each whole percent."""
    return [{**row, "mem": dict(Counter(map(int, (row.get("mem") or "").split())))}
            for row in grouped(store, selection, by)]


def _sum(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"mem": {}}
    for row in rows:
        for name, value in row.items():
            if name == "mem":
                for pct, n in value.items():
                    total["mem"][pct] = total["mem"].get(pct, 0) + n
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[name] = total.get(name, 0) + value
            elif name not in total:
                total[name] = value
    return total


def percentile(counts: dict[int, int], p: float) -> int | None:
    """Nearest-rank percentile of values given as value -> how many."""
    n = sum(counts.values())
    if not n:
        return None
    rank, seen = max(1, -(-p * n // 100)), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return value
    return None


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if not whole else 100.0 * (part or 0.0) / whole


def _finish(g: dict[str, Any], query: UsageQuery) -> dict[str, Any]:
    """Seconds to hours, sums to the columns a person reads."""
    def h(name: str) -> float:
        return float(g.get(name) or 0.0) / HOUR

    measured, used = h("measured_gpu_s"), h("used_gpu_s")
    kwh = float(g.get("energy_j") or 0.0) / 3.6e6 if g.get("energy_gpu_s") else None
    hints = sorted(((rule, int(g.get(f"hint_{rule}") or 0)) for rule in HINT_BITS),
                   key=lambda x: (-x[1], x[0]))
    out = {k: g[k] for k in g if k in ("user", "account", "partition", "node", "gpu_model", "day", "week",
                                         "month", "cluster")}
    out.update({
        "jobs": int(g.get("jobs") or 0),
        "gpu_hours_allocated": h("alloc_gpu_s"), "gpu_hours_measured": measured,
        "gpu_hours_used": used, "efficiency_pct": _pct(used, measured),
        "gpu_hours_wasted": measured - used if measured else None,
        "gpu_hours_idle_gpus": h("idle_gpu_s"), "jobs_with_idle_gpu": int(g.get("jobs_idle") or 0),
        "sm_efficiency_pct": _pct(g.get("sm_used_gpu_s"), g.get("sm_gpu_s")),
        "mem_peak_median_pct": percentile(g.get("mem", {}), 50),
        "mem_peak_p90_pct": percentile(g.get("mem", {}), 90),
        "energy_kwh": kwh,
        "cost": None if kwh is None or query.price_per_kwh is None else kwh * query.price_per_kwh,
        "co2_kg": None if kwh is None or query.co2_g_per_kwh is None else kwh * query.co2_g_per_kwh / 1000.0,
        "coverage_pct": _pct(g.get("complete_gpu_s"), g.get("alloc_gpu_s")),
        "partial_pct": _pct(g.get("partial_gpu_s"), g.get("alloc_gpu_s")),
        "missing_pct": _pct(g.get("missing_gpu_s"), g.get("alloc_gpu_s")),
        "sampled_pct": _pct(g.get("sampled_gpu_s"), g.get("alloc_gpu_s")),
        "top_hints": [{"rule": rule, "jobs": n} for rule, n in hints[:TOP_HINTS] if n],
    })
    return out


def _top(row: dict[str, Any]) -> dict[str, Any]:
    measured = (row["measured_gpu_s"] or 0.0) / HOUR
    used = (row["used_gpu_s"] or 0.0) / HOUR
    return {
        "job_id": row["job_id"], "cluster": row["cluster"], "user": row["user"], "account": row["account"],
        "partition": row["partition"], "gpus": row["gpus"], "gpu_model": row["gpu_model"],
        "start": sacct_time(row["start_at"]), "running": bool(row["running"]), "figures": row["figures"],
        "gpu_hours_allocated": (row["alloc_gpu_s"] or 0.0) / HOUR, "gpu_hours_used": used,
        "gpu_hours_wasted": measured - used, "efficiency_pct": _pct(used, measured),
        "idle_gpus": row["idle_gpus"],
        "main_hint": None if not row["main_hint"] else {
            "rule": row["main_hint"], "severity": row["main_severity"], "message": row["main_message"]},
    }


# -- a user's own: through Slurm's accounting, under its rules ---------------------------


def my_report(jobs: list[SlurmJob], period: Period, read_store: Callable[[], Store],
              settings: HintSettings | None = None, median: dict[str, Any] | None = None) -> dict[str, Any]:
    """A user's own runs of the period (sacct gave them: Slurm's rules), each with its
    efficiency, verdict and main hint, and their totals next to the cluster's median."""
    rows, used, measured, allocated = [], 0.0, 0.0, 0.0
    for found in gather(gpu_jobs(jobs), read_store):
        job = found.job
        report = _report(job, found.summaries, settings, found.unavailable)
        start = local_epoch(job.start) or period.since
        end = start + job.elapsed_s
        share = _share(start, end, period)
        job_alloc = job.gpus * job.elapsed_s / HOUR * share
        allocated += job_alloc
        line: dict[str, Any] = {"job_id": job.job_id, "name": job.name, "state": job.state,
                                "start": job.start, "gpus": job.gpus, "gpu_hours_allocated": job_alloc,
                                "efficiency_pct": None, "verdict": "", "main_hint": None,
                                "figures": report.status if report else "none"}
        if report is not None:
            fig = _figures(report.gpus, job.elapsed_s)
            job_used = fig["used_gpu_s"] / HOUR * share
            job_measured = fig["measured_gpus"] * job.elapsed_s / HOUR * share
            used, measured = used + job_used, measured + job_measured
            line.update(efficiency_pct=_pct(job_used, job_measured), verdict=report.verdict,
                        main_hint=next((h.message for h in report.hints if h.audience == "user"), None))
        rows.append(line)
    rows.sort(key=lambda r: r["start"])
    return {
        "period": period.to_dict(), "jobs": rows,
        "totals": {"jobs": len(rows), "gpu_hours_allocated": allocated, "gpu_hours_measured": measured,
                   "gpu_hours_used": used, "efficiency_pct": _pct(used, measured)},
        "cluster_median": median,
    }


def _share(start: float, end: float, period: Period) -> float:
    if end <= start:
        return 1.0
    return max(0.0, min(end, period.until) - max(start, period.since)) / (end - start)


def cluster_median(store: Store, period: Period) -> dict[str, Any]:
    """What a user's totals are set against: the median user's efficiency in the period
    (an aggregate: no user's own figures)."""
    rows = _grouped(store, Selection(period.since, period.until), ("user",))
    users = [_finish(g, UsageQuery(period)) for g in rows]
    values = sorted(u["efficiency_pct"] for u in users if u["efficiency_pct"] is not None)
    median = None
    if values:
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"period": period.to_dict(), "users": len(values), "efficiency_pct": median,
            "at": sacct_time(time.time())}


