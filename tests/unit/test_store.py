"""store.py: node summaries in SQLite; idempotent, and a final summary is never replaced
by a live snapshot that arrives late."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import StoreError
from slurm_gpu_eff.model import COMPLETE, MISSING, PARTIAL, RUNNING
from slurm_gpu_eff.store.sqlite import SqliteStore

Factory = Callable[..., Any]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(str(tmp_path / "db" / "gpueff.db"))
    yield opened
    opened.close()


def node_rows(store: SqliteStore) -> list[dict[str, Any]]:
    return list(store.db.query(
        "select job_id, node, status, sampled_until, gpu_count from node_summaries "
        "order by job_id, node"))


def gpu_rows(store: SqliteStore) -> list[tuple[Any, ...]]:
    return [(r["node"], r["minor"], r["status"], r["util_mean"]) for r in store.db.query(
        "select node, minor, status, util_mean from gpus order by node, minor")]


def test_put_stores_a_summary_and_its_gpus(store: SqliteStore, make_summary: Factory) -> None:
    summary = make_summary(utils=(90.0, 30.0))
    assert store.put(summary) is True
    assert node_rows(store) == [{"job_id": "4242", "node": "gpu1", "status": COMPLETE,
                                 "sampled_until": summary.sampled_until, "gpu_count": 2}]
    assert gpu_rows(store) == [("gpu1", 0, COMPLETE, 90.0), ("gpu1", 1, COMPLETE, 30.0)]
    assert store.node_summaries("4242") == [summary]


def test_put_is_idempotent(store: SqliteStore, make_summary: Factory) -> None:
    summary = make_summary(utils=(90.0, 30.0))
    store.put(summary)
    store.put(summary)
    store.put(summary)
    assert len(node_rows(store)) == 1
    assert gpu_rows(store) == [("gpu1", 0, COMPLETE, 90.0), ("gpu1", 1, COMPLETE, 30.0)]
    assert store.node_summaries("4242") == [summary]


def test_a_late_running_snapshot_never_replaces_a_complete_one(
    store: SqliteStore, make_summary: Factory,
) -> None:
    final = make_summary(status=COMPLETE, sampled_until=1000.0, utils=(70.0,))
    late = make_summary(status=RUNNING, sampled_until=2000.0, utils=(10.0,))  # newer clock
    assert store.put(final) is True
    assert store.put(late) is False
    assert store.node_summaries("4242") == [final]
    assert gpu_rows(store) == [("gpu1", 0, COMPLETE, 70.0)]


@pytest.mark.parametrize("final_status", [COMPLETE, PARTIAL, MISSING])
def test_a_final_summary_replaces_a_running_one_even_if_older(
    store: SqliteStore, make_summary: Factory, final_status: str,
) -> None:
    store.put(make_summary(status=RUNNING, sampled_until=2000.0, utils=(10.0, 10.0)))
    final = make_summary(status=final_status, sampled_until=None, utils=())
    assert store.put(final) is True
    assert store.node_summaries("4242") == [final]
    assert gpu_rows(store) == []  # the live snapshot's GPU rows are gone too


def test_newer_running_replaces_older_running_and_not_the_reverse(
    store: SqliteStore, make_summary: Factory,
) -> None:
    older = make_summary(status=RUNNING, sampled_until=1000.0, utils=(20.0,))
    newer = make_summary(status=RUNNING, sampled_until=1300.0, utils=(40.0,))
    assert store.put(older) is True
    assert store.put(newer) is True
    assert store.put(older) is False  # reordered delivery
    assert store.node_summaries("4242") == [newer]
    assert gpu_rows(store) == [("gpu1", 0, RUNNING, 40.0)]


def test_gpu_rows_are_replaced_not_duplicated(store: SqliteStore, make_summary: Factory) -> None:
    store.put(make_summary(status=RUNNING, sampled_until=100.0, utils=(5.0, 6.0, 7.0)))
    store.put(make_summary(status=RUNNING, sampled_until=200.0, utils=(15.0, 16.0)))
    store.put(make_summary(status=COMPLETE, sampled_until=300.0, utils=(25.0, 26.0)))
    assert gpu_rows(store) == [("gpu1", 0, COMPLETE, 25.0), ("gpu1", 1, COMPLETE, 26.0)]


def test_nodes_and_jobs_and_clusters_are_kept_apart(store: SqliteStore, make_summary: Factory) -> None:
    a = make_summary(node="gpu1")
    b = make_summary(node="gpu2", status=PARTIAL, reason="killed")
    other_job = make_summary(job_id="4243")
    other_cluster = make_summary(cluster="prod")
    for summary in (b, a, other_job, other_cluster):
        store.put(summary)
    assert store.node_summaries("4242", "gpueffdev") == [a, b]  # ordered by node
    assert store.node_summaries("4243") == [other_job]
    assert store.node_summaries("4242", "prod") == [other_cluster]
    assert len(store.node_summaries("4242")) == 3
    assert store.node_summaries("9999") == []


def test_a_gpu_without_minor_has_no_gpu_row(store: SqliteStore, make_summary: Factory) -> None:
    summary = make_summary(utils=(50.0, 60.0))
    summary.gpus[1].minor = None
    store.put(summary)
    assert gpu_rows(store) == [("gpu1", 0, COMPLETE, 50.0)]
    assert store.node_summaries("4242") == [summary]


def test_reopening_keeps_the_data(tmp_path: Path, make_summary: Factory) -> None:
    path = str(tmp_path / "gpueff.db")
    first = SqliteStore(path)
    first.put(make_summary())
    first.close()
    again = SqliteStore(path)  # migrations are not applied twice
    assert again.node_summaries("4242") == [make_summary()]
    again.close()
    readonly = SqliteStore(path, readonly=True)
    assert readonly.node_summaries("4242") == [make_summary()]
    with pytest.raises(StoreError, match="cannot write to store"):
        readonly.put(make_summary(job_id="1"))
    readonly.close()


def test_a_readonly_store_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as raised:
        SqliteStore(str(tmp_path / "absent.db"), readonly=True)
    assert str(raised.value) == (
        f"no GPU data has been stored yet ({tmp_path / 'absent.db'} does not exist)")


def test_a_store_that_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    with pytest.raises(StoreError, match="cannot open store"):
        SqliteStore(str(tmp_path / "db"))  # a directory, not a database


def test_writers_queue_for_the_store_and_give_up_after_their_wait(tmp_path: Path) -> None:
    from slurm_gpu_eff.store.sqlite import _flock_within
    lock = tmp_path / "gpueff.db.lock"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiter = os.open(lock, os.O_RDWR)
    assert _flock_within(waiter, 0.2) is False  # held: it gives up
    os.close(waiter)
    threading.Timer(0.3, os.close, [holder]).start()  # lets go while the next one waits
    queued = os.open(lock, os.O_RDWR)
    assert _flock_within(queued, 30) is True
    third = os.open(lock, os.O_RDWR)
    with pytest.raises(BlockingIOError):  # granted means held
        fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(queued)
    # The one that gave up may be granted in its turn: it lets go at once, holding nothing.
    assert _flock_within(third, 30) is True
    os.close(third)


def test_a_writer_that_waits_too_long_says_so(tmp_path: Path, make_summary: Factory,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu_eff.store import sqlite as engine
    path = str(tmp_path / "gpueff.db")
    store = SqliteStore(path)
    assert os.stat(f"{path}.lock").st_mode & 0o777 == 0o600  # no user can hold the queue
    holder = os.open(f"{path}.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(engine, "WRITE_WAIT_S", 0.2)
    with pytest.raises(StoreError, match="stayed busy for 0.2 s"):
        store.put(make_summary())
    os.close(holder)
    assert store.put(make_summary()) is True
