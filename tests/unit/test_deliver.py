"""deliver.py: the node outbox into the store, with claims that survive crashes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import StoreError
from slurm_gpu_eff.model import COMPLETE, RUNNING
from slurm_gpu_eff.node.spool import Spool, write_json
from slurm_gpu_eff.store.deliver import CLAIM, deliver
from slurm_gpu_eff.store.sqlite import Store

Factory = Callable[..., Any]


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(str(tmp_path / "spool"))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(str(tmp_path / "gpueff.db"))
    yield opened
    opened.close()


def outbox(spool: Spool) -> list[str]:
    return sorted(os.listdir(spool.outbox)) if os.path.isdir(spool.outbox) else []


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    pid = int(child.stdout)
    assert not os.path.exists(f"/proc/{pid}")
    return pid


def test_deliver_moves_every_pending_summary(
    spool: Spool, store: Store, make_summary: Factory,
) -> None:
    a, b = make_summary(node="gpu1"), make_summary(node="gpu2", utils=(1.0, 2.0))
    spool.post(a)
    spool.post(b)
    result = deliver(spool, store)
    assert (result.delivered, result.skipped, result.set_aside) == (2, 0, [])
    assert outbox(spool) == []
    assert store.node_summaries("4242") == [a, b]


def test_an_older_summary_is_skipped_and_removed(
    spool: Spool, store: Store, make_summary: Factory,
) -> None:
    store.put(make_summary(status=COMPLETE))
    spool.post(make_summary(status=RUNNING, utils=(1.0,)))
    result = deliver(spool, store)
    assert (result.delivered, result.skipped) == (0, 1)
    assert outbox(spool) == []
    assert store.node_summaries("4242")[0].status == COMPLETE


def test_a_corrupt_file_is_set_aside_and_the_rest_delivered(
    spool: Spool, store: Store, make_summary: Factory,
) -> None:
    spool.post(make_summary())
    os.makedirs(spool.outbox, exist_ok=True)
    Path(spool.outbox, "aaa-torn.json").write_text('{"cluster": "gpueffdev", "job_')
    Path(spool.outbox, "bbb-list.json").write_text("[]")
    result = deliver(spool, store)
    assert result.delivered == 1
    corrupt = Path(spool.outbox, "corrupt")
    assert [Path(p).parent for p in result.set_aside] == [corrupt, corrupt]
    kept = sorted(corrupt.iterdir())
    assert [p.name.split(CLAIM)[0] for p in kept] == ["aaa-torn.json", "bbb-list.json"]
    assert [p.read_text() for p in kept] == ['{"cluster": "gpueffdev", "job_', "[]"]
    assert outbox(spool) == ["corrupt"]
    assert len(store.node_summaries("4242")) == 1


def test_a_failing_store_leaves_the_file_in_the_outbox(
    spool: Spool, store: Store, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = spool.post(make_summary())
    content = Path(path).read_bytes()

    def store_down(self: Store, summary: Any) -> bool:
        raise StoreError("cannot write to store: database is locked")

    monkeypatch.setattr(Store, "put", store_down)
    with pytest.raises(StoreError, match="database is locked"):
        deliver(spool, store)
    assert outbox(spool) == [os.path.basename(path)]  # under its own name, not a claim
    assert Path(path).read_bytes() == content
    monkeypatch.undo()
    assert deliver(spool, store).delivered == 1  # the next delivery takes it
    assert outbox(spool) == []


def test_a_stale_claim_is_taken_over(spool: Spool, store: Store, make_summary: Factory) -> None:
    path = spool.post(make_summary())
    claimed = f"{path}{CLAIM}{dead_pid()}"
    os.replace(path, claimed)  # a deliverer that died mid-way
    result = deliver(spool, store)
    assert result.delivered == 1
    assert outbox(spool) == []
    assert store.node_summaries("4242") == [make_summary()]


def test_a_live_claim_is_left_to_its_deliverer(
    spool: Spool, store: Store, make_summary: Factory,
) -> None:
    path = spool.post(make_summary())
    claimed = f"{path}{CLAIM}{os.getpid()}"  # a deliverer that is alive: this process
    os.replace(path, claimed)
    assert deliver(spool, store).delivered == 0
    assert outbox(spool) == [os.path.basename(claimed)]
    assert store.node_summaries("4242") == []


def test_deliver_with_no_outbox(spool: Spool, store: Store) -> None:
    result = deliver(spool, store)
    assert (result.delivered, result.skipped, result.set_aside) == (0, 0, [])


def test_deliver_main_as_the_epilog_runs_it(
    tmp_path: Path, spool: Spool, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "gpueff.conf"
    config.write_text(f"[store]\npath = {tmp_path / 'main.db'}\n")
    monkeypatch.setenv("GPUEFF_CONFIG", str(config))
    spool.post(make_summary())
    write_json(os.path.join(spool.outbox, "junk.json"), "not a summary")
    done = subprocess.run([sys.executable, "-I", "-m", "slurm_gpu_eff.store.deliver", spool.root],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("not a summary, set aside: ")
    reader = Store(str(tmp_path / "main.db"), readonly=True)
    assert reader.node_summaries("4242") == [make_summary()]
    reader.close()
