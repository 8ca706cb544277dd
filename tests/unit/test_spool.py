"""spool.py: atomic JSON files, the outbox, corrupt files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import SpoolError
from slurm_gpu_eff.model import NodeSummary
from slurm_gpu_eff.node import spool as spool_module
from slurm_gpu_eff.node.spool import Spool, read_json, read_summary, write_json


def test_write_json_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "summary.json"
    write_json(str(path), {"a": 1})
    write_json(str(path), {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]  # no temp left


def test_a_failing_rename_leaves_the_old_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "summary.json"
    write_json(str(path), {"status": "running", "n": 1})

    def disk_trouble(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool_module.os, "replace", disk_trouble)
    with pytest.raises(SpoolError) as raised:
        write_json(str(path), {"status": "complete", "n": 2})
    monkeypatch.undo()
    assert str(raised.value) == f"cannot write {path}: No space left on device"
    assert json.loads(path.read_text()) == {"status": "running", "n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # temp file removed


def test_a_failing_write_leaves_the_old_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}')

    def fsync_fails(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(spool_module.os, "fsync", fsync_fails)
    with pytest.raises(SpoolError, match="Input/output error"):
        write_json(str(path), {"new": True})
    assert path.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_directory_that_cannot_be_made_is_a_spool_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpoolError, match=f"cannot write {blocker}/x/summary.json"):
        write_json(str(blocker / "x" / "summary.json"), {})


def test_read_json_of_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"status": "runn')  # a torn write
    with pytest.raises(SpoolError) as raised:
        read_json(str(path))
    assert str(raised.value).startswith(f"{path} is corrupt: ")


def test_read_json_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpoolError) as raised:
        read_json(str(tmp_path / "absent.json"))
    assert str(raised.value) == f"{tmp_path / 'absent.json'} does not exist"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "is corrupt: not a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "is corrupt: maximum recursion depth"),  # nested deep
        ('{"job_id": "1", "node": "n"}', "not a node summary"),
        ('{"cluster": "c", "job_id": "1", "node": "n", "status": "done"}',
         "not a node summary: unknown status 'done'"),
        ('{"cluster": "c", "job_id": "", "node": "n", "status": "complete"}',
         "not a node summary: no job id or node"),
        ('{"cluster": "c", "job_id": "1", "node": "n", "status": "complete", "gpus": [7]}',
         "not a node summary"),
    ],
)
def test_read_summary_rejects_what_is_not_a_summary(
    tmp_path: Path, content: str, message: str,
) -> None:
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(SpoolError, match=message):
        read_summary(str(path))


def test_post_then_read_summary_round_trips(tmp_path: Path, make_summary: Callable[..., Any]) -> None:
    summary: NodeSummary = make_summary(utils=(10.0, 20.0))
    path = Spool(str(tmp_path)).post(summary)
    assert path == str(tmp_path / "outbox" / "gpueffdev-4242-gpu1.json")
    assert read_summary(path) == summary


def test_post_names_are_safe_and_one_per_job_and_node(
    tmp_path: Path, make_summary: Callable[..., Any],
) -> None:
    spool = Spool(str(tmp_path))
    path = spool.post(make_summary(cluster="../etc", node="gpu 1/x"))
    assert os.path.basename(path) == ".._etc-4242-gpu_1_x.json"  # no "/": stays in outbox
    assert os.path.dirname(path) == spool.outbox
    spool.post(make_summary(cluster="../etc", node="gpu 1/x", sampled_until=5.0))
    assert spool.pending() == [path]  # the newer one replaced the older
    assert read_summary(path).sampled_until == 5.0


def test_pending_lists_only_json_in_order(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    assert spool.pending() == []  # no outbox yet
    os.makedirs(spool.outbox)
    for name in ["b.json", "a.json", "a.json.claim-1", "c.json.123.tmp", "notes.txt"]:
        (Path(spool.outbox) / name).write_text("{}")
    os.makedirs(os.path.join(spool.outbox, "corrupt"))
    assert spool.pending() == [os.path.join(spool.outbox, n) for n in ("a.json", "b.json")]


def test_set_aside_moves_into_corrupt(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    os.makedirs(spool.outbox)
    bad = Path(spool.outbox) / "bad.json"
    bad.write_text("garbage")
    target = spool.set_aside(str(bad))
    assert target == os.path.join(spool.outbox, "corrupt", "bad.json")
    assert Path(target).read_text() == "garbage"
    assert not bad.exists()


def test_job_dir_is_inside_the_spool_whatever_the_id(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    assert spool.job_dir("4242") == str(tmp_path / "jobs" / "4242")
    assert spool.job_dir("../../etc") == str(tmp_path / "jobs" / ".._.._etc")


def test_a_summary_s_dict_is_what_asdict_gives(make_summary: Callable[..., NodeSummary]) -> None:
    """NodeSummary.to_dict skips asdict's deep copy (the sampler posts on the epilog's
    time): the same data for every field; a field holding a dataclass would differ here."""
    import dataclasses

    summary = make_summary(utils=(50.0, None), binding={"status": "verified", "evidence": ["bound"]},
                           run_started_at=1.5, ended_at=9.0)
    gpu = summary.gpus[0]
    gpu.timeline, gpu.xid_events = {"t": [0, 1], "util": [5.0, 6.0]}, [{"at": 1.0, "code": 79}]
    gpu.util_histogram_s, gpu.throttle_s, gpu.idle_now = [1.0] * 10, {"thermal": 2.0}, {"since": 1.0}
    assert summary.to_dict() == dataclasses.asdict(summary)
    assert json.dumps(summary.to_dict()) == json.dumps(dataclasses.asdict(summary))
    assert NodeSummary.from_dict(summary.to_dict()) == summary
