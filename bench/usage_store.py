"""A synthetic store of GPU job runs for the usage-report benchmark (issue 10, "Scale").

    .venv/bin/python bench/usage_store.py                    # 1,000,000 runs in build/bench/
    .venv/bin/python bench/usage_store.py --jobs 50000 --url sqlite:///tmp/u.db --seed 7

Writes straight into the usage tables (`usage`, and `usage_nodes`: one row per run and
node) of a store opened with `open_store(url)`, so the migrations make the tables and
their indexes exactly as on a site; rows go in by the engine's bulk path (executemany in
one transaction on SQLite, COPY on PostgreSQL), in start order, as successive syncs
would leave them. The same seed and size give the same rows, relative to `now` (the end
of the 60 days; the running runs' end_at, so `max(end_at)` gives it back). A store that
already holds that many runs is left as it is (`ensure`).

The mix: 400 users in 40 accounts, activity Zipf-like (a few users run most jobs);
partitions gpu, gpu-long, gpu-debug, gpu-large; 1, 2, 4 or 8 GPUs (mostly 1-2) and
multi-node 16 and 32; H100, A100 (8 per node) and L40S (4 per node) by each user's
preference; lengths log-normal from a minute to 2 days (TIMEOUTs at the limits);
efficiency bimodal (a wasteful mode whose share is each user's own), idle GPUs and low
memory peaks in that mode, the hint bits correlated with them; runs still going at the
end are running (about 0.2%, some 2,000: a busy cluster's running jobs); figures
complete for most, some partial, missing or none (the monitoring never saw the run).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_gpu_eff.store import Store, open_store  # noqa: E402
from slurm_gpu_eff.store.base import HINT_BITS, USAGE_COLUMNS  # noqa: E402
from slurm_gpu_eff.store.usage import day_windows  # noqa: E402

DAY = 86400.0
SPAN_S = 60 * DAY
CLUSTER = "bench"
DEFAULT_JOBS = 1_000_000
DEFAULT_DIR = REPO / "build" / "bench"
VERSION = 4  # of the rows and the rollup: a cached store of another version is made anew

# model: (NVML name, gres type, GPUs per node, nodes, idle W, max W, has GPM)
MODELS = {
    "H100": ("NVIDIA H100 80GB HBM3", "h100", 8, 48, 70.0, 700.0, True),
    "A100": ("NVIDIA A100-SXM4-80GB", "a100", 8, 64, 55.0, 400.0, False),
    "L40S": ("NVIDIA L40S", "l40s", 4, 40, 35.0, 350.0, False),
}
GPU_COUNTS = (1, 2, 4, 8, 16, 32)
GPU_WEIGHTS = (0.6, 0.2, 0.1, 0.07, 0.02, 0.01)
FIELDS = ("astro", "bio", "chem", "climate", "cs", "econ", "geo", "ling", "math", "med", "neuro",
          "phys", "robot", "stats")
# Severe hints (what hint_mask holds), the order a report would put them first in.
MESSAGES = {
    "hardware": ("critical", "GPU {g} reported an XID error; the admins have been told."),
    "idle_gpus": ("warning", "{n} of {gpus} GPUs sat idle."),
    "low_util": ("warning", "GPU utilisation averaged {u}%: most of the allocation did nothing."),
    "falsely_busy": ("warning", "GPUs looked busy ({u}%) while their SMs were mostly idle."),
    "time_limit": ("warning", "The job hit its time limit; its last checkpoint may be lost."),
    "gpu_memory": ("warning", "Peak GPU memory was {m}% of the device: a smaller GPU would do."),
    "memory_bound": ("warning", "The job waited on GPU memory bandwidth most of the time."),
    "tensor_cores_unused": ("warning", "Tensor cores stayed unused: use mixed precision."),
    "cpu_side": ("warning", "The GPUs waited on the CPU side (data loading)."),
    "spread_nodes": ("warning", "{gpus} GPUs were spread over {nodes} nodes."),
    "pcie_bound": ("warning", "PCIe traffic bounded the job."),
    "nvlink_bound": ("warning", "NVLink traffic bounded the job."),
    "short_job": ("warning", "Very short GPU job: start-up cost as much as the work."),
}
ORDER = [rule for rule in MESSAGES if rule in HINT_BITS]
BIT = {rule: 1 << HINT_BITS.index(rule) for rule in ORDER}
COLUMNS = list(USAGE_COLUMNS)
NODE_COLUMNS = [*COLUMNS, "node"]
JOB_ROW, NODE_ROW = itemgetter(*COLUMNS), itemgetter(*NODE_COLUMNS)  # a row dict -> its tuple

Row = tuple[Any, ...]


class People:
    """Users, their accounts and habits: drawn first, from the seed alone."""

    def __init__(self, rng: random.Random, users: int = 400, accounts: int = 40) -> None:
        self.accounts = [f"{FIELDS[i % len(FIELDS)]}-{chr(97 + i // len(FIELDS))}{i:02d}"
                         for i in range(accounts)]
        account_weights = [1 / (j + 1) ** 0.8 for j in range(accounts)]
        self.users = [f"u{i:03d}" for i in range(users)]
        self.activity = [1 / (i + 1) ** 1.1 for i in range(users)]  # Zipf-like, user 0 busiest
        self.account_of = rng.choices(self.accounts, account_weights, k=users)
        self.p_low = [rng.betavariate(1.4, 2.6) for _ in range(users)]  # share of wasteful runs
        names = list(MODELS)
        self.models = [rng.choices(names, [rng.random() * w for w in (3, 4, 2)], k=1)[0]
                       for _ in range(users)]
        self.big = [rng.random() ** 2 for _ in range(users)]  # how far one runs multi-GPU
        self.length = [rng.lognormvariate(0, 0.6) for _ in range(users)]


def plan(rng: random.Random, jobs: int, now: float) -> tuple[array, array, array]:
    """Each run's start, elapsed and whether it is running, in start order (job ids are
    given in that order, as Slurm's grow with time)."""
    starts, lengths, running = array("d"), array("d"), array("b")
    for _ in range(jobs):
        elapsed = length(rng, 1.0)
        started = int(now - rng.random() * SPAN_S)
        starts.append(started)
        if started + elapsed > now:  # still running: about a 500th of the runs, as a busy
            lengths.append(now - started)  # cluster's running jobs are to its 60 days' jobs
            running.append(1)
        else:
            lengths.append(elapsed)
            running.append(0)
    order = sorted(range(jobs), key=starts.__getitem__)
    return (array("d", (starts[i] for i in order)), array("d", (lengths[i] for i in order)),
            array("b", (running[i] for i in order)))


def length(rng: random.Random, scale: float) -> float:
    """Log-normal, median 40 min, from a minute to 2 days."""
    return float(int(min(2 * DAY, max(60.0, rng.lognormvariate(math.log(2400 * scale), 1.6)))))


def rows(jobs: int, seed: int, now: float, chunk: int = 20000) -> Iterator[tuple[list[Row], list[Row]]]:
    """The store's rows, `chunk` runs at a time: (usage rows, usage_nodes rows), each a
    tuple in COLUMNS (NODE_COLUMNS) order."""
    rng = random.Random(seed)
    people = People(rng)
    starts, lengths, running = plan(rng, jobs, now)
    first_id = 10 ** max(6, len(str(jobs)))  # fixed width: text order is number order
    cum = list(_accumulate(people.activity))
    job_rows: list[Row] = []
    node_rows: list[Row] = []
    for k in range(jobs):
        user = rng.choices(range(len(people.users)), cum_weights=cum, k=1)[0]
        run, nodes = one_run(rng, people, user, str(first_id + k), int(starts[k]), lengths[k],
                             bool(running[k]), now)
        job_rows.append(run)
        node_rows.extend(nodes)
        if len(job_rows) == chunk:
            yield job_rows, node_rows
            job_rows, node_rows = [], []
    if job_rows:
        yield job_rows, node_rows


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for v in values:
        total += v
        yield total


def one_run(rng: random.Random, people: People, u: int, job_id: str, start: int, elapsed: float,
            running: bool, now: float) -> tuple[Row, list[Row]]:
    r = rng.random
    big = people.big[u]
    gpus = rng.choices(GPU_COUNTS, [w * (1 + big * (i > 1)) for i, w in enumerate(GPU_WEIGHTS)])[0]
    model = people.models[u] if r() < 0.85 else rng.choice(list(MODELS))
    name, gres, per_node, node_count, idle_w, max_w, gpm = MODELS[model]
    if not running:  # the user's habit stretches the plan's length; the limits cut it
        elapsed = float(int(min(2 * DAY, max(60.0, elapsed * people.length[u]))))
    state = "RUNNING" if running else rng.choices(
        ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"), (80, 8, 6, 5, 1))[0]
    if gpus >= 16:
        partition = "gpu-large"
    elif elapsed <= 1800 and gpus <= 2 and r() < 0.5:
        partition = "gpu-debug"
    elif elapsed > DAY:
        partition = "gpu-long"
    else:
        partition = "gpu-large" if gpus == 8 and r() < 0.2 else "gpu"
    if state == "TIMEOUT" and not running:
        elapsed = 2 * DAY if partition == "gpu-long" else (3600.0 if partition == "gpu-debug" else DAY)
        elapsed = min(elapsed, float(int(now) - start)) if start + elapsed > now else elapsed
    # Nodes: as few as the GPUs need, sometimes spread (a 4-GPU job on 2 nodes).
    needed = max(1, -(-gpus // per_node))
    spread = needed == 1 and gpus > 1 and r() < 0.04
    n_nodes = 2 if spread else needed
    first = rng.randrange(node_count - n_nodes + 1)
    names = [f"{gres}-{first + i + 1:03d}" for i in range(n_nodes)]
    share = [gpus // n_nodes + (1 if i < gpus % n_nodes else 0) for i in range(n_nodes)]
    # Figures: how far the monitoring saw the run.
    if running:
        figures = "running"
    else:
        figures = rng.choices(("complete", "partial", "missing", "none"),
                              (88, 4, 3, 5) if elapsed >= 120 else (70, 5, 5, 20))[0]
    seen = [figures in ("complete", "partial", "running")] * n_nodes
    if figures == "partial" and n_nodes > 1:
        seen[rng.randrange(n_nodes)] = False  # one node's summary never came
    low = r() < people.p_low[u]
    eff = rng.betavariate(1.1, 9.0) if low else rng.betavariate(7.0, 2.5)
    mem = 100 * (rng.betavariate(1.5, 5.0) if low else rng.betavariate(4.0, 2.0))
    per_node_fig = []
    for node_gpus, saw in zip(share, seen, strict=True):
        if not saw:
            per_node_fig.append(_figures(0, 0, 0.0, elapsed, 0.0, None, gpm, idle_w, max_w, figures, r))
            continue
        idle = 0
        if low and gpus > 1 and r() < 0.5:
            idle = rng.randint(1, max(1, node_gpus - 1)) if node_gpus > 1 else int(r() < 0.3)
        per_node_fig.append(_figures(node_gpus, idle, eff, elapsed, mem, rng, gpm, idle_w, max_w,
                                     figures, r))
    total = per_node_fig[0] if n_nodes == 1 else _add(per_node_fig)
    measured = total["measured_gpus"]
    util = 100 * total["used_gpu_s"] / (measured * elapsed) if measured else None
    hints = []
    if measured:
        if r() < 0.002:
            hints.append("hardware")
        if total["idle_gpus"]:
            hints.append("idle_gpus")
        if util is not None and util < 30:
            hints.append("low_util")
        if low and r() < 0.03:
            hints.append("falsely_busy")
        if state == "TIMEOUT":
            hints.append("time_limit")
        if mem < 20 and r() < 0.5:
            hints.append("gpu_memory")
        if r() < 0.05:
            hints.append("memory_bound")
        if model != "L40S" and not low and r() < 0.15:
            hints.append("tensor_cores_unused")
        if low and r() < 0.2:
            hints.append("cpu_side")
        if spread:
            hints.append("spread_nodes")
        if r() < 0.02:
            hints.append("pcie_bound")
        if gpus > 1 and r() < 0.03:
            hints.append("nvlink_bound")
        if elapsed < 300 and r() < 0.3:
            hints.append("short_job")
    hints = [rule for rule in ORDER if rule in hints]
    mask = sum(BIT[rule] for rule in hints)
    main = hints[0] if hints else None
    severity, message = None, None
    if main:
        severity, message = MESSAGES[main][0], MESSAGES[main][1].format(
            g=0, n=total["idle_gpus"], gpus=gpus, u=round(util or 0), m=round(mem), nodes=n_nodes)
    gpu_model = name if measured else gres
    end_at = float(start + elapsed) if not running else now
    common = {"cluster": CLUSTER, "job_id": job_id, "start_at": start, "end_at": end_at,
              "running": int(running), "user": people.users[u], "account": people.account_of[u],
              "partition": partition, "state": state, "gpu_model": gpu_model}
    judged = {"hint_mask": mask, "main_hint": main, "main_severity": severity, "main_message": message}
    run = {**common, "gpus": gpus, "figures": figures, **total, **judged}
    node_rows = []
    for node, node_gpus, saw, fig in zip(names, share, seen, per_node_fig, strict=True):
        node_rows.append(NODE_ROW({**common, "gpus": node_gpus, "figures": figures if saw else "missing",
                                   **fig, **judged, "node": node}))
    return JOB_ROW(run), node_rows


UNSEEN = {"measured_gpus": 0, "used_gpu_s": 0.0, "idle_gpus": 0, "sm_gpus": 0,
          "sm_used_gpu_s": 0.0, "mem_peak_pct": None, "energy_j": None, "sampled_gpu_s": 0.0,
          **{f"util_h{i}": 0.0 for i in range(10)}}


def _figures(measured: int, idle: int, eff: float, elapsed: float, mem: float, rng: random.Random | None,
             gpm: bool, idle_w: float, max_w: float, figures: str, r: Callable[[], float]) -> dict[str, Any]:
    """One node's figures, as report/usage.py's _figures gives them."""
    if not measured:
        return dict(UNSEEN)
    active = measured - idle
    # The active GPUs carry the run's efficiency over all measured ones (idle ones ~1%).
    u_active = min(1.0, eff * measured / active) if active else 0.0
    used = (active * u_active + idle * 0.01) * elapsed
    sampled_share = 0.3 + 0.6 * r() if figures == "partial" else 0.97 + 0.03 * r()
    sampled = measured * elapsed * sampled_share
    hist = [0.0] * 10
    hist[0] += idle * elapsed * sampled_share
    b = min(9, int(u_active * 10))
    active_s = active * elapsed * sampled_share
    for i, part in ((b - 1, 0.2), (b, 0.6), (b + 1, 0.2)):
        hist[min(9, max(0, i))] += part * active_s
    energy = None if figures == "partial" and r() < 0.3 else (
        (active * (idle_w + (max_w - idle_w) * u_active) + idle * idle_w) * elapsed)
    sm = measured if gpm else 0
    return {"measured_gpus": measured, "used_gpu_s": used, "idle_gpus": idle, "sm_gpus": sm,
            "sm_used_gpu_s": used * (0.5 + 0.4 * r()) if sm else 0.0,
            "mem_peak_pct": round(min(100.0, max(0.5, mem * (0.8 + 0.4 * r()))), 2),
            "energy_j": energy, "sampled_gpu_s": sampled, **{f"util_h{i}": hist[i] for i in range(10)}}


def _add(parts: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if name == "mem_peak_pct":
                total[name] = value if total.get(name) is None else max(total[name], value or 0)
            elif name == "energy_j":
                total[name] = value if total.get(name) is None else total[name] + (value or 0)
            else:
                total[name] = total.get(name, 0) + value
    return total


# -- writing --------------------------------------------------------------------------------


def count(store: Store) -> int:
    return int(store.read("select count(*) as n from usage", {})[0]["n"])


def store_now(store: Store) -> float | None:
    """The generated store's `now` (the running runs' end_at)."""
    value = store.read("select max(end_at) as now from usage", {})[0]["now"]
    return None if value is None else float(value)


def fill(store: Store, jobs: int, seed: int, now: float, progress: Callable[[int], None]) -> None:
    """Replace the store's usage rows by `jobs` synthetic runs."""
    if store.dialect == "sqlite":
        _fill_sqlite(store, jobs, seed, now, progress)
    else:
        _fill_postgresql(store, jobs, seed, now, progress)


def _fill_sqlite(store: Any, jobs: int, seed: int, now: float, progress: Callable[[int], None]) -> None:
    conn = store.conn
    conn.execute("pragma synchronous = off")  # this connection only; the file stays as made
    conn.execute("pragma cache_size = -262144")
    conn.execute("begin immediate")
    for table in ("usage", "usage_nodes", "usage_days", "usage_days_made", "usage_bounds"):
        conn.execute(f"delete from {table}")
    names = ", ".join(f'"{c}"' for c in COLUMNS)
    insert = f"insert into usage ({names}) values ({', '.join('?' * len(COLUMNS))})"
    insert_nodes = (f'insert into usage_nodes ({names}, "node") '
                    f"values ({', '.join('?' * len(NODE_COLUMNS))})")
    done = 0
    for job_rows, node_rows in rows(jobs, seed, now):
        conn.executemany(insert, job_rows)
        conn.executemany(insert_nodes, node_rows)
        done += len(job_rows)
        progress(done)
    conn.execute("commit")


def _fill_postgresql(store: Any, jobs: int, seed: int, now: float, progress: Callable[[int], None]) -> None:
    conn = store.conn
    conn.execute("set statement_timeout = 0")  # this session: COPY of a million rows
    names = ", ".join(f'"{c}"' for c in COLUMNS)
    with conn.transaction():
        conn.execute("truncate usage, usage_nodes, usage_days, usage_days_made, usage_bounds")
        with conn.cursor() as cur, cur.copy(f"copy usage ({names}) from stdin") as jobs_copy:
            nodes_buffer: list[str] = []
            done = 0
            for job_rows, node_rows in rows(jobs, seed, now):
                jobs_copy.write("".join(_copy_line(row) for row in job_rows))
                nodes_buffer.append("".join(_copy_line(row) for row in node_rows))
                done += len(job_rows)
                progress(done)
        with conn.cursor() as cur, cur.copy(f'copy usage_nodes ({names}, "node") from stdin') as copy:
            for block in nodes_buffer:
                copy.write(block)
    conn.execute("analyze usage")  # what autovacuum would do within a minute of the load
    conn.execute("analyze usage_nodes")


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_line(row: Row) -> str:
    return "\t".join("\\N" if v is None else v.translate(_ESCAPES) if isinstance(v, str) else repr(v)
                     for v in row) + "\n"


def default_url(jobs: int, seed: int) -> str:
    return f"sqlite://{DEFAULT_DIR / f'usage-{jobs}-s{seed}-v{VERSION}.db'}"


def ensure(url: str, jobs: int = DEFAULT_JOBS, seed: int = 1, now: float | None = None,
           quiet: bool | None = None) -> tuple[float, float | None]:
    """The store at `url` with `jobs` synthetic runs: made unless it holds that many
    already. Returns (its now, seconds spent generating or None when it was there)."""
    store = open_store(url)
    try:
        if count(store) == jobs:
            found = store_now(store)
            if found is not None:
                if not store.read("select d0 from usage_days_made limit 1", {}):
                    rollup(store, found - SPAN_S - 2 * DAY, found, quiet)
                return found, None
        now = float(int(time.time() if now is None else now))
        started = time.perf_counter()
        fill(store, jobs, seed, now, _progress(jobs, started, quiet))
        rollup(store, now - SPAN_S - 2 * DAY, now, quiet)
        took = time.perf_counter() - started
        if _tty(quiet):
            sys.stderr.write(f"\r\x1b[Kusage store: {jobs:,} runs in {took:.1f} s ({url})\n")
        return now, took
    finally:
        store.close()


def rollup(store: Store, since: float, until: float, quiet: bool | None) -> None:
    """The daily rollup put_usage would have kept (the rows went in by the bulk path), a
    day at a time."""
    days = day_windows(since, until)
    started = time.perf_counter()
    for i, (d0, _, _) in enumerate(days):
        store.refresh_usage_days(d0, d0)
        if _tty(quiet):
            sys.stderr.write(f"\r\x1b[Kusage store: daily rollup, {i + 1} of {len(days)} days "
                             f"({time.perf_counter() - started:.0f} s)")
            sys.stderr.flush()


def _tty(quiet: bool | None) -> bool:
    return not quiet if quiet is not None else sys.stderr.isatty()


def _progress(total: int, started: float, quiet: bool | None) -> Callable[[int], None]:
    shown = [0.0]

    def show(done: int) -> None:
        if not _tty(quiet):
            return
        at = time.perf_counter()
        if at - shown[0] < 0.25 and done < total:
            return
        shown[0] = at
        rate = done / max(1e-9, at - started)
        sys.stderr.write(f"\r\x1b[Kusage store: {done:,} of {total:,} runs "
                         f"({at - started:.0f} s, ~{(total - done) / max(rate, 1):.0f} s left)")
        sys.stderr.flush()

    return show


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="GPU job runs (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--url", help="store URL (default sqlite://build/bench/usage-JOBS-sSEED.db)")
    parser.add_argument("--now", type=float, help="the end of the 60 days, epoch s (default now)")
    args = parser.parse_args()
    url = args.url or default_url(args.jobs, args.seed)
    now, took = ensure(url, args.jobs, args.seed, args.now)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
    print(f"{url}: {args.jobs:,} runs ending {when}, "
          + (f"generated in {took:.1f} s" if took is not None else "already there"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
