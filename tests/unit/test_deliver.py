"""store/deliver.py: the node outbox into the store, losing nothing and mixing nothing up
(issue 8: findings 1-3, the dead-letter folder, one deliverer under a lock, retries that
need no new job, `gpueff spool status|flush`)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.cli import main as cli_main
from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import StoreError, StoreRejected
from slurm_gpu_eff.model import COMPLETE, RUNNING
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.spool import Spool, write_json
from slurm_gpu_eff.store.deliver import Busy, deliver, deliver_until_done, locked, spool_status
from slurm_gpu_eff.store.sqlite import SqliteStore
from tests.configfile import write_config
from tests.unit.conftest import wait_delivered

Factory = Callable[..., Any]


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(str(tmp_path / "spool"))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(str(tmp_path / "gpueff.db"))
    yield opened
    opened.close()


def outbox(spool: Spool) -> list[str]:
    """What is left to deliver: the outbox's summaries and what sits in flight."""
    return sorted(os.path.basename(p) for p in spool.pending() + spool.taken())


def test_deliver_moves_every_pending_summary(spool: Spool, store: SqliteStore, make_summary: Factory) -> None:
    a, b = make_summary(node="gpu1"), make_summary(node="gpu2", utils=(1.0, 2.0))
    spool.post(a)
    spool.post(b)
    result = deliver(spool, store)
    assert (result.delivered, result.skipped, result.set_aside, result.dead) == (2, 0, [], [])
    assert outbox(spool) == []
    assert store.node_summaries("4242") == [a, b]


def test_an_older_summary_is_skipped_and_removed(
    spool: Spool, store: SqliteStore, make_summary: Factory
) -> None:
    store.put(make_summary(status=COMPLETE))
    spool.post(make_summary(status=RUNNING, utils=(1.0,)))
    result = deliver(spool, store)
    assert (result.delivered, result.skipped) == (0, 1)
    assert outbox(spool) == []
    assert store.node_summaries("4242")[0].status == COMPLETE


def test_a_corrupt_file_is_set_aside_and_the_rest_delivered(
    spool: Spool, store: SqliteStore, make_summary: Factory,
) -> None:
    spool.post(make_summary())
    Path(spool.outbox, "aaa-torn.json").write_text('{"cluster": "gpueffdev", "job_')
    Path(spool.outbox, "bbb-list.json").write_text("[]")
    result = deliver(spool, store)
    assert result.delivered == 1
    kept = sorted(Path(spool.outbox, "corrupt").iterdir())
    assert [p.name.split("-", 1)[1] for p in kept] == ["aaa-torn.json", "bbb-list.json"]
    assert [p.read_text() for p in kept] == ['{"cluster": "gpueffdev", "job_', "[]"]
    assert outbox(spool) == [] and len(store.node_summaries("4242")) == 1


def test_a_failing_store_leaves_the_summary_for_the_next_delivery(
    spool: Spool, store: SqliteStore, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = spool.post(make_summary())
    content = Path(path).read_bytes()

    def store_down(self: SqliteStore, summary: Any) -> bool:
        raise StoreError("cannot write to store: database is locked")

    monkeypatch.setattr(SqliteStore, "put", store_down)
    with pytest.raises(StoreError, match="database is locked"):
        deliver(spool, store)
    (waiting,) = spool.taken()
    assert Path(waiting).read_bytes() == content
    monkeypatch.undo()
    assert deliver(spool, store).delivered == 1  # the next delivery takes it
    assert outbox(spool) == []


@pytest.mark.parametrize("order", ["final in flight, live posted", "live in flight, final posted"])
def test_finding_1_a_final_summary_is_never_lost_to_a_live_one(
    spool: Spool, store: SqliteStore, make_summary: Factory, order: str,
) -> None:
    """Before: the live delivery's claim, a dead epilog delivery's claim and a take-over
    that trusted whatever sat under the name deleted the final summary for ever. Now a
    deliverer that dies leaves its file in flight, every file is offered to the store, and
    the store keeps the final one, whatever the order."""
    live = make_summary(status=RUNNING, sampled_until=1000.0, utils=(10.0,))
    final = make_summary(status=COMPLETE, sampled_until=2000.0, utils=(80.0,))
    first, second = (final, live) if order.startswith("final") else (live, final)
    spool.take(spool.post(first))  # taken by a deliverer that died (an epilog's, killed)
    spool.post(second)  # posted under the same name afterwards
    assert len(outbox(spool)) == 2  # nothing overwrote anything
    deliver(spool, store)
    (stored,) = store.node_summaries("4242")
    assert (stored.status, stored.sampled_until) == (COMPLETE, 2000.0)
    assert outbox(spool) == []


def test_finding_2_a_job_on_two_mig_slices_of_one_gpu_is_stored(
    spool: Spool, store: SqliteStore, make_summary: Factory, make_gpu: Factory,
) -> None:
    """Before: both slices' rows had the GPU's minor as key: the store refused the summary
    at every attempt and the node's outbox stopped behind it."""
    slices = [make_gpu(minor=3, mig_gi_id=1, uuid="MIG-a"), make_gpu(minor=3, mig_gi_id=2, uuid="MIG-b")]
    spool.post(make_summary(gpus=slices))
    assert deliver(spool, store).delivered == 1
    rows = store.db.execute("select minor, mig_gi_id, uuid from gpus order by mig_gi_id").fetchall()
    assert rows == [(3, 1, "MIG-a"), (3, 2, "MIG-b")]


def test_finding_2_a_summary_the_store_rejects_goes_to_dead_and_the_rest_are_delivered(
    spool: Spool, store: SqliteStore, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = spool.post(make_summary(node="gpu1"))
    spool.post(make_summary(node="gpu2"))
    real = SqliteStore.put

    def put(self: SqliteStore, summary: Any) -> bool:
        if summary.node == "gpu1":
            raise StoreRejected("the store rejects 4242 on gpu1: UNIQUE constraint failed")
        return real(self, summary)

    monkeypatch.setattr(SqliteStore, "put", put)
    result = deliver(spool, store)
    assert result.delivered == 1 and [Path(p).parent.name for p in result.dead] == ["dead"]
    assert [s.node for s in store.node_summaries("4242")] == ["gpu2"]
    assert outbox(spool) == []
    (dead,) = spool_status(spool).dead
    assert dead[0].endswith(os.path.basename(bad)) and "UNIQUE constraint failed" in dead[1]


def test_a_real_integrity_error_is_a_rejection_not_an_outage(tmp_path: Path, make_summary: Factory) -> None:
    store = SqliteStore(str(tmp_path / "gpueff.db"))
    store.db.execute("create trigger no before insert on node_summaries begin "
                     "select raise(abort, 'refused by a trigger'); end")
    with pytest.raises(StoreRejected, match="refused by a trigger"):
        store.put(make_summary())


def test_one_deliverer_at_a_time(spool: Spool, store: SqliteStore, make_summary: Factory) -> None:
    spool.post(make_summary())
    with locked(spool):
        with pytest.raises(Busy, match=f"pid {os.getpid()}"):
            with locked(spool):
                pass
        assert spool_status(spool).deliverer == str(os.getpid())
    with locked(spool):
        assert deliver(spool, store).delivered == 1


def test_finding_3_the_retrier_delivers_when_the_store_is_back_without_a_new_job(
    tmp_path: Path, spool: Spool, make_summary: Factory,
) -> None:
    """Before: a summary the store could not take waited for the next job on the node. Now
    the deliverer that met the outage stays as the spool's one retrier, waits and tries
    again until the store is back."""
    spool.post(make_summary())
    attempts: list[float] = []
    path = str(tmp_path / "gpueff.db")

    def open_store() -> SqliteStore:
        attempts.append(time.monotonic())
        if len(attempts) < 4:
            raise StoreError("cannot open store: unable to open database file")
        return SqliteStore(path)

    waits: list[float] = []
    config = Config(retry_s=30.0, retry_max_s=100.0, retry_for_s=86400.0, admin_comment=False)
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    result = deliver_until_done(spool, open_store, config, log, sleep=waits.append)
    assert result is not None and result.delivered == 1
    assert waits == [30.0, 60.0, 100.0]  # doubling, capped
    assert outbox(spool) == []
    assert "the store is back: 1 summaries delivered" in (tmp_path / "log").read_text()


def test_there_is_one_retrier_per_spool(tmp_path: Path, spool: Spool, make_summary: Factory) -> None:
    spool.post(make_summary())

    def store_away() -> SqliteStore:
        raise StoreError("down")

    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    with locked(spool, "retry.lock"):  # a retrier is at work already
        slept: list[float] = []
        assert deliver_until_done(spool, store_away, Config(), log, sleep=slept.append) is None
        assert slept == []  # left it to that one
        assert spool_status(spool).retrier == str(os.getpid())


def test_the_retrier_gives_up_after_retry_for_s_and_says_so(
    tmp_path: Path, spool: Spool, make_summary: Factory,
) -> None:
    spool.post(make_summary())

    def store_away() -> SqliteStore:
        raise StoreError("down")

    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    config = Config(retry_s=0.01, retry_max_s=0.01, retry_for_s=0.05)
    assert deliver_until_done(spool, store_away, config, log) is None
    assert "still unreachable after 0.05 s: 1 summaries wait" in (tmp_path / "log").read_text()
    assert len(outbox(spool)) == 1  # nothing lost


def test_spool_status_and_flush_from_the_command_line(
    tmp_path: Path, spool: Spool, make_summary: Factory, capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(tmp_path / "gpueff.toml", {"spool": {"dir": str(tmp_path / "spool")},
                                                     "store": {"path": str(tmp_path / "cli.db")}})
    spool.post(make_summary())
    assert cli_main(["spool", "status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "1 waiting, 0 in flight, 0 rejected" in out and "'gpueff spool flush' delivers" in out
    assert cli_main(["spool", "flush", "--config", str(config)]) == 0
    assert "delivered 1" in capsys.readouterr().out
    assert cli_main(["deliver", "--config", str(config)]) == 0  # the older name still works
    assert outbox(spool) == []


def test_deliver_main_as_the_epilog_starts_it(
    tmp_path: Path, spool: Spool, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write_config(tmp_path / "gpueff.toml", {
        "store": {"path": str(tmp_path / "main.db")}, "log": {"file": str(tmp_path / "log")},
        "slurm": {"admin_comment": False},  # job 4242 is not Slurm's
    })
    monkeypatch.setenv("GPUEFF_CONFIG", str(config))
    spool.post(make_summary())
    write_json(os.path.join(spool.outbox, "junk.json"), "not a summary")
    done = subprocess.run([sys.executable, "-I", "-m", "slurm_gpu_eff.store.deliver", spool.root],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "not a summary, set aside: " in (tmp_path / "log").read_text()
    reader = SqliteStore(str(tmp_path / "main.db"), readonly=True)
    assert reader.node_summaries("4242") == [make_summary()]
    reader.close()


def test_a_store_held_locked_delays_nothing_and_loses_nothing(hook_site: Any) -> None:
    """The epilog posts, starts a detached deliverer and returns: it never waits on the
    store. While a reader holds the SQLite file locked, the deliverer keeps the summary
    and retries; once the lock goes, the summary arrives, with no new job or command."""
    hook_site.configure(spool={"dir": str(hook_site.root / "spool" / "%n"), "retry_s": 0.2,
                               "retry_max_s": 0.2})
    env = hook_site.export(hook_site.env())
    hook_site.store_path.parent.mkdir(parents=True, exist_ok=True)
    SqliteStore(str(hook_site.store_path)).close()  # created, then held
    holder = sqlite3.connect(hook_site.store_path, timeout=0)
    holder.execute("begin exclusive")
    try:
        from slurm_gpu_eff.node import hooks

        hooks.main(["prolog"], env)
        hook_site.wait_for(hook_site.job_dir() / "summary.json")
        hooks.main(["epilog"], env)
        assert not hook_site.job_dir().exists()  # the epilog is done with the job
        time.sleep(1.0)  # the deliverer meets the lock meanwhile
        spool = Spool(str(hook_site.spool_root))
        assert spool.pending() + spool.taken()  # kept, not delivered, not lost
    finally:
        holder.execute("rollback")
        holder.close()
    end = time.monotonic() + 30
    while not hook_site.stored():
        assert time.monotonic() < end, "the summary never reached the store"
        time.sleep(0.1)
    assert [s.status for s in hook_site.stored()] == [COMPLETE]
    assert wait_delivered([hook_site.spool_root], timeout=10)


def test_a_store_newer_than_the_code_is_a_clear_error(tmp_path: Path) -> None:
    path = str(tmp_path / "gpueff.db")
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("insert into _sqlite_migrations (migration_set, name, applied_at) "
               "values ('slurm-gpu-eff', 'm099_from_the_future', '2030-01-01')")
    db.commit()
    db.close()
    for readonly in (False, True):
        with pytest.raises(StoreError, match="upgraded by a newer slurm-gpu-eff .schema m099_from"):
            SqliteStore(path, readonly=readonly)


def post_aged(spool: Spool, summary: Any, age_s: float) -> str:
    path = spool.post(summary)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def test_a_bounded_spool_drops_live_copies_first_then_figures_newest_first(
    tmp_path: Path, spool: Spool, make_summary: Factory, capsys: pytest.CaptureFixture[str],
) -> None:
    """The store is away and the outbox outgrows [spool] max_mb: live copies go first (a
    later copy or the final one supersedes them), then final summaries lose their figures,
    newest first, and stay as 'missing' records that say why; the oldest go last. The
    counts are kept, logged and shown by `spool status`; the store gets the records."""
    oldest = make_summary(job_id="1", utils=(50.0,) * 8)
    older = make_summary(job_id="2", utils=(50.0,) * 8)
    newest = make_summary(job_id="3", utils=(50.0,) * 8)
    post_aged(spool, oldest, 300)
    post_aged(spool, older, 200)
    post_aged(spool, make_summary(job_id="4", status=RUNNING, utils=(9.0,) * 8), 250)
    post_aged(spool, newest, 100)
    sizes = {os.path.basename(p): os.path.getsize(p) for p in spool.pending()}
    # Room for the oldest and a little: the live copy must go, and then one final's figures.
    bound = sizes["gpueffdev-1-gpu1.json"] + sizes["gpueffdev-2-gpu1.json"] + 1500

    def store_away() -> SqliteStore:
        raise StoreError("cannot reach store: connection refused")

    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    config = Config(retry_s=0.01, retry_max_s=0.01, retry_for_s=0.03, spool_max_mb=bound / 1e6)
    assert deliver_until_done(spool, store_away, config, log) is None
    left = {s.job_id: s for s in map(read_back, spool.taken())}
    assert sorted(left) == ["1", "2", "3"]  # the live copy went
    assert left["1"] == oldest and left["2"] == older  # the oldest keep their figures
    assert left["3"].status == "missing" and left["3"].gpus == []
    assert left["3"].reason == ("its figures were dropped on gpu1: the spool outbox reached its "
                                f"{bound / 1e6:g} MB bound while the store was unreachable")
    assert sum(map(os.path.getsize, spool.taken())) <= bound
    assert spool_status(spool).dropped == {"live": 1, "emptied": 1, "dropped": 0}
    assert "dropped 1 live copies, kept 1 final summaries without their figures" in (
        tmp_path / "log").read_text()
    conf = write_config(tmp_path / "gpueff.toml", {"spool": {"dir": spool.root},
                                                   "store": {"path": str(tmp_path / "back.db")}})
    assert cli_main(["spool", "status", "--config", str(conf)]) == 0
    assert "1 live copies, 1 final summaries kept without their figures, 0 whole" in capsys.readouterr().out
    assert cli_main(["spool", "flush", "--config", str(conf)]) == 0  # the store is back
    with SqliteStore(str(tmp_path / "back.db"), readonly=True) as store:
        assert [s.status for s in store.node_summaries("3")] == ["missing"]  # said, not lost
        assert store.node_summaries("1") == [oldest]


def test_a_spool_within_its_bound_is_left_alone(spool: Spool, make_summary: Factory) -> None:
    from slurm_gpu_eff.store.deliver import keep_within

    spool.post(make_summary(status=RUNNING))
    spool.post(make_summary(job_id="2"))
    assert not keep_within(spool, 1e9)
    kept = sorted((read_back(p).job_id, read_back(p).status, len(read_back(p).gpus)) for p in spool.taken())
    assert kept == [("2", COMPLETE, 1), ("4242", RUNNING, 1)]
    assert spool_status(spool).dropped == {}


def test_when_only_records_are_left_the_newest_go_first(spool: Spool, make_summary: Factory) -> None:
    from slurm_gpu_eff.store.deliver import keep_within

    for n, age in (("1", 30), ("2", 20), ("3", 10)):
        post_aged(spool, make_summary(job_id=n, status="missing", reason="no sampler", utils=()), age)
    one = max(map(os.path.getsize, spool.pending()))
    trimmed = keep_within(spool, one * 1.5)
    assert (trimmed.live, trimmed.emptied, trimmed.dropped) == (0, 0, 2)
    assert [read_back(p).job_id for p in spool.taken()] == ["1"]


def read_back(path: str) -> Any:
    from slurm_gpu_eff.node.spool import read_summary

    return read_summary(path)


def test_flush_where_there_is_no_usable_spool_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "not-a-dir").write_text("")
    config = write_config(tmp_path / "gpueff.toml", {"spool": {"dir": f"{tmp_path / 'not-a-dir'}/%n"},
                                                     "store": {"path": str(tmp_path / "s.db")}})
    code = cli_main(["spool", "flush", "--node", "gpu1", "--config", str(config)])
    err = capsys.readouterr().err
    assert code not in (0, 70) and "cannot deliver from" in err and "Traceback" not in err, err
