"""Delivery: the node outbox into the store, losing nothing and mixing nothing up.

- One deliverer per spool at a time: an flock on OUTBOX/deliver.lock (the kernel lets go
  of it when its holder dies, so no claim is ever stale).
- A summary is moved into OUTBOX/inflight/ under a name of its own before it is read; a
  summary posted meanwhile under the same name is a new file, never touched. What a
  deliverer took and did not finish waits in inflight/ for the next one, which delivers
  it first.
- Every summary is offered to the store, none is judged against its neighbours here: the
  store keeps the final one and the newest (its writes are idempotent and ordered), so a
  late live copy can neither replace nor delete a final summary.
- A summary the store rejects goes to OUTBOX/dead/ with the reason beside it, and the
  others go on; one bad summary never holds up a node's outbox.
- When the store is unreachable the summaries stay, and one retrier per spool (an flock on
  OUTBOX/retry.lock) tries again, waiting `retry_s`, doubling up to `retry_max_s`, for
  `retry_for_s`: no new job on the node and no command is needed.
- Meanwhile the outbox is kept under `[spool] max_mb` (see keep_within): live copies go
  first, then final summaries lose their figures but stay as a small 'missing' record
  that says why, newest first; the oldest go last. Counted in OUTBOX/dropped.counts, logged.
The epilog and the sampler start this module as a detached process and never wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Config, load_config
from ..errors import GpuEffError, SpoolError, StoreError, StoreRejected
from ..model import MISSING, NodeSummary
from ..node.log import HookLog
from ..node.spool import (
    SUMMARY,
    Spool,
    is_sampler,
    private_dirs,
    read_json,
    read_summary,
    sampler_pid,
    write_json,
)
from . import Store, open_store
from .base import run_of

if TYPE_CHECKING:
    from ..slurm.records import Comment


@dataclass
class Delivery:
    delivered: int = 0
    skipped: int = 0  # older than what the store has
    set_aside: list[str] = field(default_factory=list)  # not summaries: outbox/corrupt/
    dead: list[str] = field(default_factory=list)  # rejected by the store: outbox/dead/
    swept: list[str] = field(default_factory=list)  # abandoned job directories posted
    finals: list[NodeSummary] = field(default_factory=list)  # final summaries stored
    lives: list[NodeSummary] = field(default_factory=list)  # live copies stored


class Busy(GpuEffError):
    """Another deliverer holds the spool."""


@contextmanager
def locked(spool: Spool, name: str = "deliver.lock", wait_s: float = 0.0) -> Iterator[None]:
    """Hold the spool's lock `name` (waiting up to wait_s for it), or raise Busy."""
    private_dirs(spool.outbox)
    fd = os.open(os.path.join(spool.outbox, name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(f"another delivery holds {spool.outbox}/{name} "
                               f"(pid {_holder(fd)})") from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
    except OSError:
        return "?"


ABANDONED_S = 600.0  # a job directory untouched this long, with no sampler, was forgotten


def sweep_abandoned(spool: Spool, now: float | None = None) -> list[str]:
    """Post what a job directory still holds when its sampler is gone and no epilog posted
    it (the epilog never ran, or failed to post): the figures are not left behind."""
    now = time.time() if now is None else now
    jobs = os.path.join(spool.root, "jobs")
    try:
        names = os.listdir(jobs)
    except OSError:
        return []
    swept = []
    for name in names:
        job_dir = os.path.join(jobs, name)
        path = os.path.join(job_dir, SUMMARY)
        try:
            if now - os.stat(path).st_mtime < ABANDONED_S:
                continue
        except OSError:
            continue
        pid = sampler_pid(job_dir)
        if pid is not None and is_sampler(pid, job_dir):
            continue
        try:
            summary = read_summary(path)
        except SpoolError:
            continue  # left for a human; the store is not the place for it
        summary.cut_short("the sampler stopped and no epilog posted its summary")
        spool.post(summary)
        shutil.rmtree(job_dir, ignore_errors=True)
        swept.append(name)
    return swept


def deliver(spool: Spool, store: Store) -> Delivery:
    """One pass over the spool, under its lock (taken by the caller: see `locked`).
    Raises StoreError when the store fails; what was not delivered stays in inflight/."""
    result = Delivery()
    result.swept = sweep_abandoned(spool)
    taken = spool.taken()  # a dead deliverer's first: they are older than what waits
    taken += [t for t in map(spool.take, spool.pending()) if t is not None]
    for path in taken:
        try:
            summary = read_summary(path)
        except SpoolError:
            result.set_aside.append(spool.set_aside(path, os.path.basename(path)))
            continue
        try:
            stored = store.put(summary)
        except StoreRejected as exc:
            result.dead.append(spool.bury(path, str(exc)))
            continue
        result.delivered += stored
        result.skipped += not stored
        if stored:
            (result.finals if summary.final else result.lives).append(summary)
        os.unlink(path)
    return result


@dataclass
class Trimmed:
    live: int = 0  # live copies dropped: a newer copy or the final summary supersedes them
    emptied: int = 0  # final summaries whose figures were dropped; a 'missing' record stays
    dropped: int = 0  # records dropped whole (nothing else was left to drop)

    def __bool__(self) -> bool:
        return bool(self.live or self.emptied or self.dropped)


DROPPED = "dropped.counts"  # what keep_within dropped, all told (JSON; not .json: not a summary)


def keep_within(spool: Spool, max_bytes: float) -> Trimmed:
    """Bring what waits under max_bytes while the store is away (a full node disk would
    stop the spool for every job). Call under the spool's lock: it takes what is pending
    into inflight/ first, so a summary posted meanwhile is never the one cut down."""
    for path in spool.pending():
        spool.take(path)
    waiting = []
    for path in spool.taken():
        try:
            info = os.stat(path)
            waiting.append((info.st_mtime_ns, info.st_size, path, read_summary(path)))
        except (OSError, SpoolError):
            continue  # gone, or for the deliverer to set aside
    total = sum(size for _, size, _, _ in waiting)
    result = Trimmed()
    if total <= max_bytes:
        return result
    newest_first = sorted(waiting, key=lambda w: w[0], reverse=True)
    for _, size, path, summary in newest_first:  # live copies: nothing is lost
        if total > max_bytes and not summary.final:
            os.unlink(path)
            total, result.live = total - size, result.live + 1
    for _, size, path, summary in newest_first:  # then the figures of final summaries
        if total > max_bytes and summary.final and summary.gpus:
            record = emptied(summary, max_bytes)
            write_json(path, record.to_dict())
            total, result.emptied = total - size + os.path.getsize(path), result.emptied + 1
    for _, _, path, _ in newest_first:  # then the records themselves: the oldest go last
        if total <= max_bytes:
            break
        try:
            size = os.path.getsize(path)
            os.unlink(path)
        except OSError:
            continue
        total, result.dropped = total - size, result.dropped + 1
    _count(spool, result)
    return result


def emptied(summary: NodeSummary, max_bytes: float) -> NodeSummary:
    """What stays of a final summary the spool had no room for: who, where, when, and why
    the figures are missing, so the report says so instead of waiting for them."""
    return NodeSummary(
        cluster=summary.cluster, job_id=summary.job_id, node=summary.node, status=MISSING,
        reason=(f"its figures were dropped on {summary.node}: the spool outbox reached its "
                f"{max_bytes / 1e6:g} MB bound while the store was unreachable"),
        user=summary.user, account=summary.account, partition=summary.partition,
        job_gpus=summary.job_gpus, started_at=summary.started_at, ended_at=summary.ended_at,
        run_started_at=summary.run_started_at, binding=summary.binding,
    )


def _count(spool: Spool, trimmed: Trimmed) -> None:
    counts = dropped_counts(spool)
    for name in ("live", "emptied", "dropped"):
        counts[name] = counts.get(name, 0) + getattr(trimmed, name)
    write_json(os.path.join(spool.outbox, DROPPED), counts)


def dropped_counts(spool: Spool) -> dict[str, int]:
    try:
        data = read_json(os.path.join(spool.outbox, DROPPED))
    except SpoolError:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def waiting(spool: Spool) -> int:
    return len(spool.pending()) + len(spool.taken())


def deliver_until_done(
    spool: Spool, open_store: Callable[[], Store], config: Config, log: HookLog,
    sleep: Callable[[float], None] = time.sleep,
) -> Delivery | None:
    """The detached deliverer: a pass now; if the store is away, become the spool's one
    retrier (or leave it to the one there is) and try again with growing waits."""
    options = attempt_options(config)
    result = _attempt(spool, open_store, log, **options)
    if result is not None or not waiting(spool):
        return result
    try:
        with locked(spool, "retry.lock"):
            wait, give_up = config.retry_s, time.monotonic() + config.retry_for_s
            while waiting(spool):
                if time.monotonic() + wait > give_up:
                    log.write(f"the store is still unreachable after {config.retry_for_s:g} s: "
                              f"{waiting(spool)} summaries wait in {spool.outbox}")
                    return None
                sleep(wait)
                wait = min(wait * 2, config.retry_max_s)
                result = _attempt(spool, open_store, log, quiet=True, **options)
                if result is not None and result.delivered:
                    log.write(f"the store is back: {result.delivered} summaries delivered")
            return result
    except Busy:
        return None  # a retrier is at work on this spool already


# A run whose part was written, to look at again: job id, cluster, run, where the write
# went ("slurmctld" or "slurmdbd"), and the run's summaries it was made from (run_state)
Written = tuple[str, str, float, str, tuple[tuple[str, str, float | None], ...]]


@dataclass(frozen=True)
class Mirror:
    """The AdminComment mirror: `after_pass` writes what one delivery pass stored and
    returns the runs it wrote to look at again; `recheck` looks at those, after the
    spool's lock is let go (see admin_comments)."""
    after_pass: Callable[[Store, Delivery, Spool, HookLog], list[Written]]
    recheck: Callable[[list[Written], HookLog, Callable[[], Store]], None]


def attempt_options(config: Config) -> dict[str, Any]:
    """What a delivery attempt takes from the config: the spool's bound, and the
    AdminComment mirror where the site turned it on."""
    return {"max_bytes": config.spool_max_mb * 1e6,
            "mirror": admin_comments(config) if config.admin_comment else None}


def _attempt(spool: Spool, open_store: Callable[[], Store], log: HookLog,
             quiet: bool = False, max_bytes: float = math.inf,
             mirror: Mirror | None = None) -> Delivery | None:
    """Deliver until nothing waits, under the lock; None when the store failed (the
    summaries stay). A deliverer that finds the lock taken leaves at once: the holder looks
    at the outbox again after it lets go, so what was posted meanwhile is never stranded."""
    total, written = Delivery(), []
    try:
        while True:
            try:
                with locked(spool):
                    try:
                        with open_store() as store:
                            now = Delivery()
                            while True:
                                _add(now, deliver(spool, store))
                                if not spool.pending():
                                    break
                            if mirror is not None:
                                written += mirror.after_pass(store, now, spool, log)
                            _add(total, now)
                    except StoreError:
                        _trim(spool, max_bytes, log)
                        raise
            except Busy:
                break  # its holder delivers what waits
            except StoreError as exc:
                if not quiet:
                    log.write(f"the store is unreachable ({exc}); the summaries wait and are retried")
                return None
            if not spool.pending():  # nothing was posted while we let go
                break
    finally:
        if written and mirror is not None:
            mirror.recheck(written, log, open_store)
    for path in total.dead:
        log.write(f"the store rejected a summary; kept in {path} with the reason")
    for path in total.set_aside:
        log.write(f"not a summary, set aside: {path}")
    return total


def _trim(spool: Spool, max_bytes: float, log: HookLog) -> None:
    try:
        trimmed = keep_within(spool, max_bytes)
    except (OSError, SpoolError) as exc:
        log.write(f"could not keep the spool within {max_bytes / 1e6:g} MB: {exc}")
        return
    if trimmed:
        log.write(f"the spool outbox outgrew {max_bytes / 1e6:g} MB while the store was "
                  f"unreachable: dropped {trimmed.live} live copies, kept {trimmed.emptied} "
                  f"final summaries without their figures, dropped {trimmed.dropped} whole")


def _add(total: Delivery, one: Delivery) -> None:
    total.delivered += one.delivered
    total.skipped += one.skipped
    total.set_aside += one.set_aside
    total.dead += one.dead
    total.swept += one.swept
    total.finals += one.finals
    total.lives += one.lives


def admin_comments(config: Config, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.time) -> Mirror:
    """Mirror each run whose final summary was just stored into the job's AdminComment (or
    the [slurm] comment_field named), from all its node summaries the store has (the last
    node to deliver writes them all), and a running job's live figures every live_mirror_s
    (from its first node only). Each write reads the field as it stands and puts our part
    into it (mirror.with_site_text): a site's own text there is kept as it is now.
    Runs in the detached deliverer: a slow slurmctld or slurmdbd costs no job anything; a
    failure is logged, and the store keeps the figures."""
    from ..mirror import MAX_CHARS, admin_comment, our_part, site_text, with_site_text
    from ..slurm.access import connect
    from ..slurm.records import allocated_gpus, parse_tres

    slurm = connect(config, use="mirror")
    comment_field = config.comment_field
    write = slurm.set_comment

    def line(job_id: str, run: float, every: list[NodeSummary]) -> tuple[str, Comment]:
        """Our part, and the field as it stands (its text; the id to write it with: an
        array task's own)."""
        now = slurm.comment(job_id, owner=True)
        summaries, others = same_job(every, run)
        check_owner(job_id, now, summaries)
        room = MAX_CHARS - len(site_text(now.text)) - 1  # a site's own text counts too
        ours = admin_comment(summaries, allocated_gpus(now.tres) if now.tres else None, room,
                             earlier=others, alloc_mem=parse_tres(now.tres).get("mem") if now.tres else None)
        return ours, now

    def put(ours: str, now: Comment, cluster: str, running: bool = False) -> str:
        """Our part into the field as it stands (`now`), by the id `now` names; where it went."""
        return write(now.task, cluster, with_site_text(now.text, ours), running=running)

    def final(store: Store, cluster: str, job_id: str, run: float, spool: Spool) -> Written | None:
        every = store.node_summaries(job_id, cluster)
        ours, now = line(job_id, run, every)
        where = put(ours, now, cluster)
        _forget(spool, cluster, job_id)
        # Looked at again (recheck) where the database took it, and wherever the job's other
        # nodes write too: through slurmctld, the last write is what the job's end record
        # carries, and its node may have read the store before another's final came.
        state = run_state(every, run)
        several = len(state) > 1 or (parse_tres(now.tres).get("node", 1) > 1 if now.tres else False)
        return (job_id, cluster, run, where, state) if where == "slurmdbd" or several else None

    def recheck(written: list[Written], log: HookLog, open_store: Callable[[], Store]) -> None:
        """A job's end record may still be on its way to slurmdbd, carrying slurmctld's
        older copy over what was written into the database; and a job's nodes deliver at
        once, each writing the field from the summaries the store had when it read them
        (the last to write may have read before another node's final came: CI saw a
        three-node job's line left with two nodes 'running'). Look again, for all the jobs
        of a delivery at once (a wait per job, under the spool's lock, made a node where a
        dozen jobs ended together mirror the last one a minute late), MIRROR_RECHECK_S
        after the write, and again after each write a look makes, up to MIRROR_RECHECKS
        looks (look_again)."""
        pending = list(written)
        for _ in range(MIRROR_RECHECKS):
            if not pending:
                return
            sleep(MIRROR_RECHECK_S)
            try:
                with open_store() as store:
                    pending = [w for w in (look_again(store, w, log) for w in pending) if w is not None]
            except StoreError as exc:
                log.write(f"the {comment_field} of {len(pending)} job(s) was not looked at again: {exc}")
                return

    def look_again(store: Store, written: Written, log: HookLog) -> Written | None:
        """Our part made again from what the store holds now, put into the field as it
        stands then (never the part written before, never over what a site's tool or an
        admin wrote since); the write to look at again, or None when none was needed.
        Through slurmctld the field cannot be read back (sacct shows the database's), so
        there a write is needed only where the store has more than the write was made
        from: a node that wrote later from less looks again itself."""
        job_id, cluster, run, where, state = written
        every = store.node_summaries(job_id, cluster)
        if where == "slurmctld" and run_state(every, run) == state:
            return None
        try:
            ours, now = line(job_id, run, every)
            if where == "slurmdbd" and (our_part(now.text) or "").lower() == ours.lower():
                return None
            where = put(ours, now, cluster)
        except GpuEffError as exc:
            log.write(f"job {job_id}: its {comment_field} was not written: {exc}")
            return None
        return job_id, cluster, run, where, run_state(every, run)

    def live(store: Store, cluster: str, job_id: str, run: float, spool: Spool, node: str) -> None:
        every = store.node_summaries(job_id, cluster)
        summaries = [s for s in every if run_of(s) == run]
        if not summaries or any(s.final for s in summaries) or min(s.node for s in summaries) != node:
            return  # the job is ending, or another of its nodes mirrors it
        if not _due(spool, cluster, job_id, config.live_mirror_s, clock()):
            return
        ours, now = line(job_id, run, every)
        put(ours, now, cluster, running=True)

    def after_pass(store: Store, now: Delivery, spool: Spool, log: HookLog) -> list[Written]:
        ended = {(s.cluster, s.job_id, run_of(s)) for s in now.finals}
        written = []
        for cluster, job_id, run in sorted(ended):
            try:
                if (done := final(store, cluster, job_id, run, spool)) is not None:
                    written.append(done)
            except GpuEffError as exc:
                log.write(f"job {job_id}: its {comment_field} was not written: {exc}")
        running = {(s.cluster, s.job_id, run_of(s), s.node) for s in now.lives}
        for cluster, job_id, run, node in sorted(running) if config.live_mirror_s > 0 else []:
            if (cluster, job_id, run) not in ended:
                try:
                    live(store, cluster, job_id, run, spool, node)
                except GpuEffError as exc:
                    log.write(f"job {job_id}: its live figures were not mirrored: {exc}")
        return written

    return Mirror(after_pass, recheck)


def same_job(every: list[NodeSummary], run: float) -> tuple[list[NodeSummary], list[NodeSummary]]:
    """This run's node summaries, and those of the same job's other runs (a requeue). The
    store keeps each run of a job id apart (cluster, job id, node, run start), and Slurm
    gives an id out again (MaxJobId wraps, a new database): a run of another user or account
    is another job, whose figures its readers must not get. Same user and account: whoever
    Slurm lets see this job (its owner, the account's coordinators, operators) may see
    that one too."""
    this = [s for s in every if run_of(s) == run]
    owners = {(s.user, s.account) for s in this}
    return this, [s for s in every if run_of(s) != run and (s.user, s.account) in owners]


def check_owner(job_id: str, now: Comment, summaries: list[NodeSummary]) -> None:
    """The job that has the id in Slurm's accounting now (the one a write reaches) must be
    this run's user's and account's: a summary delivered late (the store away for days)
    must not go into the next job that got the id. A job not (yet) there has no reader."""
    from ..mirror import MirrorError

    owners = {(s.user, s.account) for s in summaries if s.user}
    if now.user and owners and (now.user, now.account) not in owners:
        raise MirrorError(f"job {job_id} in Slurm's accounting is another user's or account's "
                          f"({now.user}/{now.account}) now: this run's figures stay in the store")


def _due(spool: Spool, cluster: str, job_id: str, every_s: float, now: float) -> bool:
    """Whether this job's live figures were last mirrored every_s ago or more; if so, the
    time is noted now (a file per running job in the spool, removed when it ends)."""
    path = _mirrored(spool, cluster, job_id)
    try:
        if now - os.stat(path).st_mtime < every_s:
            return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w"):
        pass
    os.utime(path, (now, now))
    return True


def _forget(spool: Spool, cluster: str, job_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_mirrored(spool, cluster, job_id))


def _mirrored(spool: Spool, cluster: str, job_id: str) -> str:
    return os.path.join(spool.root, "mirrored", f"{cluster}-{job_id}".replace("/", "_"))


MIRROR_RECHECK_S = 5.0
MIRROR_RECHECKS = 3  # looks at most: the first, and one after each of two writes


def run_state(every: list[NodeSummary], run: float) -> tuple[tuple[str, str, float | None], ...]:
    """What the store holds of a run, as far as our part shows it: each node's status and
    how far its figures reach."""
    return tuple(sorted((s.node, s.status, s.sampled_until) for s in every if run_of(s) == run))


@dataclass
class SpoolStatus:
    pending: list[str]  # waiting in the outbox
    inflight: list[str]  # taken by a deliverer that died or met a store that went away
    dead: list[tuple[str, str]]  # (file, why the store rejected it)
    corrupt: list[str]  # files that were not summaries
    deliverer: str | None  # pid of the deliverer at work, if any
    retrier: str | None  # pid of the retrier waiting for the store, if any
    dropped: dict[str, int] = field(default_factory=dict)  # what keep_within dropped, all told


def spool_status(spool: Spool) -> SpoolStatus:
    """What waits in a node's spool and why: for `gpueff spool status`."""
    def listed(folder: str, keep: Callable[[str], bool]) -> list[str]:
        try:
            return sorted(os.path.join(folder, n) for n in os.listdir(folder) if keep(n))
        except OSError:
            return []

    dead = []
    for path in listed(spool.dead, lambda n: n.endswith(".json")):
        try:
            with open(f"{path}.reason", encoding="utf-8") as handle:
                dead.append((path, handle.read().strip()))
        except OSError:
            dead.append((path, "no reason recorded"))
    return SpoolStatus(
        pending=spool.pending(), inflight=spool.taken(), dead=dead,
        corrupt=listed(os.path.join(spool.outbox, "corrupt"), lambda n: True),
        deliverer=_busy(spool, "deliver.lock"), retrier=_busy(spool, "retry.lock"),
        dropped=dropped_counts(spool),
    )


def _busy(spool: Spool, name: str) -> str | None:
    """The pid holding one of the spool's locks, or None when nobody does."""
    try:
        fd = os.open(os.path.join(spool.outbox, name), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)


def flush(spool: Spool, store: Callable[[], Store], wait_s: float = 30.0) -> Delivery:
    """Deliver now (`gpueff spool flush`): waits up to wait_s for a deliverer at work."""
    with locked(spool, wait_s=wait_s), store() as opened:
        return deliver(spool, opened)


def main(argv: list[str]) -> int:
    """python -m slurm_gpu_eff.store.deliver SPOOL_DIR [--once]"""
    if not argv or len(argv) > 2 or (len(argv) == 2 and argv[1] != "--once"):
        print("usage: python -m slurm_gpu_eff.store.deliver SPOOL_DIR [--once]", file=sys.stderr)
        return 2
    log: HookLog | None = None
    try:
        config = load_config()
        spool = Spool(argv[0])
        log = HookLog(config.log_for(os.environ.get("SLURMD_NODENAME", "")), "-", "deliver")

        def store() -> Store:  # opened inside the lock, at each attempt
            return open_store(config.store_url, admin_group=config.store_admin_group)

        if len(argv) == 2:
            _attempt(spool, store, log, **attempt_options(config))
        else:
            deliver_until_done(spool, store, config, log)
    except Exception as exc:  # detached: its failure goes to the log (stderr is /dev/null)
        if log is not None:
            log.write(f"delivery failed: {exc!r}; the summaries stay in the spool")
        print(f"delivery failed: {exc!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
