"""The store engines (SQLite and PostgreSQL): the same rules on both. Idempotent, a final
summary is never replaced by a live snapshot that arrives late, runs and MIG slices are
kept apart, a store newer than the code is refused. Then what is each engine's own."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import StoreError, StoreRejected
from slurm_gpu_eff.model import COMPLETE, MISSING, PARTIAL, RUNNING
from slurm_gpu_eff.store import Store, open_store
from slurm_gpu_eff.store.sqlite import SqliteStore
from tests.unit.conftest import store_rows

Factory = Callable[..., Any]


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


def node_rows(url: str) -> list[tuple[Any, ...]]:
    return store_rows(url, "select job_id, node, status, sampled_until, gpu_count "
                           "from node_summaries order by job_id, node")


def gpu_rows(url: str) -> list[tuple[Any, ...]]:
    return store_rows(url, "select node, minor, status, util_mean from gpus order by node, minor")


def test_put_stores_a_summary_and_its_gpus(
    store: Store, store_url: str, make_summary: Factory) -> None:
    summary = make_summary(utils=(90.0, 30.0))
    assert store.put(summary) is True
    assert node_rows(store_url) == [("4242", "gpu1", COMPLETE, summary.sampled_until, 2)]
    assert gpu_rows(store_url) == [("gpu1", 0, COMPLETE, 90.0), ("gpu1", 1, COMPLETE, 30.0)]
    assert store.node_summaries("4242") == [summary]


def test_put_is_idempotent(
    store: Store, store_url: str, make_summary: Factory) -> None:
    summary = make_summary(utils=(90.0, 30.0))
    store.put(summary)
    store.put(summary)
    store.put(summary)
    assert len(node_rows(store_url)) == 1
    assert gpu_rows(store_url) == [("gpu1", 0, COMPLETE, 90.0), ("gpu1", 1, COMPLETE, 30.0)]
    assert store.node_summaries("4242") == [summary]


def test_a_late_running_snapshot_never_replaces_a_complete_one(
    store: Store, store_url: str, make_summary: Factory,
) -> None:
    final = make_summary(status=COMPLETE, sampled_until=1000.0, utils=(70.0,))
    late = make_summary(status=RUNNING, sampled_until=2000.0, utils=(10.0,))  # newer clock
    assert store.put(final) is True
    assert store.put(late) is False
    assert store.node_summaries("4242") == [final]
    assert gpu_rows(store_url) == [("gpu1", 0, COMPLETE, 70.0)]


@pytest.mark.parametrize("final_status", [COMPLETE, PARTIAL, MISSING])
def test_a_final_summary_replaces_a_running_one_even_if_older(
    store: Store, store_url: str, make_summary: Factory, final_status: str,
) -> None:
    store.put(make_summary(status=RUNNING, sampled_until=2000.0, utils=(10.0, 10.0)))
    final = make_summary(status=final_status, sampled_until=None, utils=())
    assert store.put(final) is True
    assert store.node_summaries("4242") == [final]
    assert gpu_rows(store_url) == []  # the live snapshot's GPU rows are gone too


def test_newer_running_replaces_older_running_and_not_the_reverse(
    store: Store, store_url: str, make_summary: Factory,
) -> None:
    older = make_summary(status=RUNNING, sampled_until=1000.0, utils=(20.0,))
    newer = make_summary(status=RUNNING, sampled_until=1300.0, utils=(40.0,))
    assert store.put(older) is True
    assert store.put(newer) is True
    assert store.put(older) is False  # reordered delivery
    assert store.node_summaries("4242") == [newer]
    assert gpu_rows(store_url) == [("gpu1", 0, RUNNING, 40.0)]


def test_gpu_rows_are_replaced_not_duplicated(
    store: Store, store_url: str, make_summary: Factory) -> None:
    store.put(make_summary(status=RUNNING, sampled_until=100.0, utils=(5.0, 6.0, 7.0)))
    store.put(make_summary(status=RUNNING, sampled_until=200.0, utils=(15.0, 16.0)))
    store.put(make_summary(status=COMPLETE, sampled_until=300.0, utils=(25.0, 26.0)))
    assert gpu_rows(store_url) == [("gpu1", 0, COMPLETE, 25.0), ("gpu1", 1, COMPLETE, 26.0)]


def test_nodes_and_jobs_and_clusters_are_kept_apart(store: Store, make_summary: Factory) -> None:
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


def test_a_gpu_without_minor_has_no_gpu_row(
    store: Store, store_url: str, make_summary: Factory) -> None:
    summary = make_summary(utils=(50.0, 60.0))
    summary.gpus[1].minor = None
    store.put(summary)
    assert gpu_rows(store_url) == [("gpu1", 0, COMPLETE, 50.0)]
    assert store.node_summaries("4242") == [summary]


def test_reopening_keeps_the_data_and_a_reader_cannot_write(store_url: str, make_summary: Factory) -> None:
    with open_store(store_url) as first:
        first.put(make_summary())
    with open_store(store_url) as again:  # migrations are not applied twice
        assert again.node_summaries("4242") == [make_summary()]
    with open_store(store_url, readonly=True) as reader:
        assert reader.node_summaries("4242") == [make_summary()]
        with pytest.raises(StoreError, match="cannot write to store .*read-only"):
            reader.put(make_summary(job_id="1"))


def test_two_runs_and_two_mig_slices_are_kept_apart(
    store: Store, store_url: str, make_summary: Factory, make_gpu: Factory,
) -> None:
    first = make_summary(run_started_at=1000.0, utils=(90.0, 90.0))
    slices = [make_gpu(minor=0, util=u, mig_gi_id=gi, uuid=f"MIG-{gi}") for gi, u in ((1, 10.0), (2, 20.0))]
    second = make_summary(run_started_at=5000.5, gpus=slices)
    assert store.put(first) and store.put(second)
    assert store.node_summaries("4242") == [first, second]  # neither replaced the other
    assert store_rows(store_url, "select run, minor, mig_gi_id from gpus order by run, minor, mig_gi_id") == [
        (1000, 0, -1), (1000, 1, -1), (5000, 0, 1), (5000, 0, 2)]


def add_future_migration(url: str) -> None:
    """What a newer slurm-gpu-eff leaves in a store it migrated."""
    if url.startswith("sqlite://"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            db.execute("insert into _sqlite_migrations (migration_set, name, applied_at) "
                       "values ('slurm-gpu-eff', 'm099_from_the_future', '2030-01-01')")
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("insert into gpueff_migrations (migration_set, name) "
                     "values ('slurm-gpu-eff', 'm099_from_the_future')")


def test_a_store_newer_than_the_code_is_refused_for_reading_and_writing(store_url: str) -> None:
    open_store(store_url).close()
    add_future_migration(store_url)
    for readonly in (False, True):
        with pytest.raises(StoreError, match=r"upgraded by a newer slurm-gpu-eff \(schema m099_from"):
            open_store(store_url, readonly=readonly)


def test_many_deliverers_open_a_new_store_at_once(store_url: str, make_summary: Factory) -> None:
    """Hundreds of nodes' first deliveries may meet a store nobody has migrated yet: one
    migrates, the others wait and find nothing to do; no error, every summary kept."""
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def deliver(n: int) -> None:
        try:
            start.wait()
            with open_store(store_url) as store:
                store.put(make_summary(node=f"gpu{n}"))
        except BaseException as exc:  # noqa: BLE001 - the test reports any
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(open_store(store_url, readonly=True).node_summaries("4242")) == 8


def test_a_final_summary_wins_every_race_with_a_live_one(store_url: str, make_summary: Factory) -> None:
    """The sampler's last live copy and the epilog's final summary, delivered at the same
    moment through two connections, 20 times over: the final one is always what stays."""
    open_store(store_url).close()
    jobs = [str(n) for n in range(20)]

    def put_all(status: str, sampled_until: float) -> None:
        with open_store(store_url) as store:
            for job in jobs:
                store.put(make_summary(job_id=job, status=status, sampled_until=sampled_until))

    live = threading.Thread(target=put_all, args=(RUNNING, 9e9))  # a later clock, even
    live.start()
    put_all(COMPLETE, 100.0)
    live.join(60)
    with open_store(store_url, readonly=True) as reader:
        assert {reader.node_summaries(job)[0].status for job in jobs} == {COMPLETE}


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


# --- PostgreSQL's own ---------------------------------------------------------------------

@pytest.fixture
def pg_url(pg_server: Any) -> str:
    from tests.unit.conftest import fresh_schema

    return fresh_schema(pg_server.url)


def test_postgresql_rejects_what_it_cannot_hold_and_takes_the_rest(
    pg_url: str, make_summary: Factory,
) -> None:
    with open_store(pg_url) as store:
        with pytest.raises(StoreRejected, match="the store rejects 4242 on gpu1: .*NUL"):
            store.put(make_summary(user="al\x00ice"))  # PostgreSQL text holds no NUL
        assert store.put(make_summary(node="gpu2")) is True  # the connection goes on


def test_postgresql_down_is_an_outage_and_the_password_is_never_shown() -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(StoreError) as raised:
        open_store(f"postgresql://gpueff:s3cret@127.0.0.1:{port}/gpueff?connect_timeout=2")
    message = str(raised.value)
    assert message.startswith(f"cannot reach store postgresql://gpueff@127.0.0.1:{port}/gpueff:")
    assert "s3cret" not in message


def test_postgresql_reader_of_an_empty_database_is_told_so(pg_url: str) -> None:
    with open_store(pg_url, readonly=True) as reader:
        with pytest.raises(StoreError, match="no GPU data has been stored yet"):
            reader.node_summaries("4242")


def test_postgresql_integrity_error_is_a_rejection_not_an_outage(pg_url: str, make_summary: Factory) -> None:
    import psycopg

    open_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("alter table node_summaries add constraint no_gpu9 check (node <> 'gpu9')")
    with open_store(pg_url) as store, pytest.raises(StoreRejected, match="no_gpu9"):
        store.put(make_summary(node="gpu9"))


def test_an_unknown_store_url_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match=r"unknown store URL 'mysql://root@db/x'"):
        open_store("mysql://root:pw@db/x")


def test_postgresql_reader_session_is_read_only_even_for_the_writers_role(
    pg_url: str, make_summary: Factory,
) -> None:
    import psycopg

    open_store(pg_url).close()
    with open_store(pg_url, readonly=True) as reader:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            reader.conn.execute("delete from node_summaries")  # type: ignore[attr-defined]


def test_both_engines_have_every_schema_version_in_order() -> None:
    from slurm_gpu_eff.store.base import SCHEMA
    from slurm_gpu_eff.store.postgres import MIGRATIONS
    from slurm_gpu_eff.store.sqlite_schema import migrations

    assert tuple(m.name for m in migrations._migrations) == SCHEMA
    assert tuple(name for name, _ in MIGRATIONS) == SCHEMA


def test_reading_the_sqlite_store_loads_no_sqlite_utils(tmp_path: Path, make_summary: Factory) -> None:
    """`gpueff JOBID` reads the store: its start-up must not pay for sqlite-utils (68 ms)."""
    import subprocess
    import sys

    path = tmp_path / "gpueff.db"
    with open_store(f"sqlite://{path}") as store:
        store.put(make_summary())
    code = ("import sys; from slurm_gpu_eff.store import open_store; "
            f"s = open_store('sqlite://{path}', readonly=True); "
            "assert len(s.node_summaries('4242')) == 1; "
            "print(sorted(m for m in sys.modules if 'sqlite_utils' in m))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", None, "a metric as text"])
def test_a_stored_body_not_a_summary_is_a_store_error_on_either_engine(
    store: Store, store_url: str, make_summary: Factory, body: str | None,
) -> None:
    """A row edited by hand, truncated or NULLed: the store says it holds a corrupt summary
    (StoreError, which `gpueff JOBID` names as why the job's GPU figures are missing), never
    a TypeError (PostgreSQL's store let a NULL's through before), nor the report's internal
    error on a figure it cannot format."""
    import json

    from tests import pg

    summary = make_summary(utils=(90.0,))
    store.put(summary)
    if body == "a metric as text":
        edited = summary.to_dict()
        edited["gpus"][0]["metrics"]["util"]["mean"] = "90"
        body = json.dumps(edited)
    pg.execute(store_url, "update node_summaries set body = ?", [body])
    with pytest.raises(StoreError, match="corrupt summary of job 4242: not a node summary"):
        store.node_summaries("4242")
