"""Delivery: the node outbox into the store. Run by the epilog (in a child, bounded),
by the sampler for live figures, and by `gpueff deliver` for anything left behind.

A file is claimed by renaming it before it is read, so a summary posted while a
delivery runs is never deleted unread; a claim whose deliverer died is taken over.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from ..config import load_config
from ..errors import GpuEffError, SpoolError
from ..node.spool import SUMMARY, Spool, is_sampler, read_summary, sampler_pid
from .sqlite import Store

CLAIM = ".claim-"


@dataclass
class Delivery:
    delivered: int = 0
    skipped: int = 0  # older than what the store has
    set_aside: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # abandoned job directories posted


def claim(path: str) -> str | None:
    target = f"{path}{CLAIM}{os.getpid()}"
    try:
        os.replace(path, target)
        return target
    except FileNotFoundError:
        return None  # another deliverer took it


def stale_claims(spool: Spool) -> list[str]:
    """Claims whose deliverer is gone, put back under their own name."""
    found = []
    try:
        names = os.listdir(spool.outbox)
    except OSError:
        return []
    for name in names:
        base, sep, pid = name.rpartition(CLAIM)
        if sep and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            original = os.path.join(spool.outbox, base)
            if put_back(os.path.join(spool.outbox, name), original):
                found.append(original)
    return found


def put_back(claimed: str, path: str) -> bool:
    """Return a claimed file to its name, unless a newer summary was posted there since:
    link() never replaces, so the newer one always wins."""
    try:
        os.link(claimed, path)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        os.unlink(claimed)
    except OSError:
        pass
    return True


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
    """Deliver every pending summary; raises StoreError when the store fails (files stay)."""
    result = Delivery()
    result.swept = sweep_abandoned(spool)
    stale_claims(spool)
    for path in spool.pending():
        claimed = claim(path)
        if claimed is None:
            continue
        try:
            summary = read_summary(claimed)
        except SpoolError:
            result.set_aside.append(spool.set_aside(claimed, os.path.basename(path)))
            continue
        try:
            stored = store.put(summary)
        except GpuEffError:
            _unclaim(claimed, path)
            raise
        result.delivered += stored
        result.skipped += not stored
        os.unlink(claimed)
    return result


def _unclaim(claimed: str, path: str) -> None:
    """Give a file back after a failed delivery, unless a newer one was posted meanwhile."""
    put_back(claimed, path)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m slurm_gpu_eff.store.deliver SPOOL_DIR", file=sys.stderr)
        return 2
    try:
        store = Store(load_config().store_path)
        result = deliver(Spool(argv[0]), store)
    except GpuEffError as exc:
        print(f"delivery failed: {exc}", file=sys.stderr)
        return 1
    for path in result.set_aside:
        print(f"not a summary, set aside: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
