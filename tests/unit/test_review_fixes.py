"""Regressions for the defects a code review found (each test failed before its fix)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import load_config
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.hostlist import expand_hostlist
from slurm_gpu_eff.model import COMPLETE, RUNNING, NodeSummary
from slurm_gpu_eff.node import hooks
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.node.stats import Stat, Timeline
from slurm_gpu_eff.store.deliver import deliver
from slurm_gpu_eff.store.sqlite import SqliteStore


def summary(status: str, until: float) -> NodeSummary:
    return NodeSummary(cluster="c", job_id="7", node="n1", status=status, sampled_until=until)


@pytest.mark.parametrize(("text", "message"), [
    ("[hooks]\ntimeout_s = 1e12\n", "timeout_s must be at most 18"),
    ("[hooks]\ntimeout_s = inf\n", "timeout_s = inf: must be a number greater than 0"),
    ("[hooks]\ntimeout_s = 4\n[sampler]\nstop_wait_s = 5\n", "stop_wait_s must be under"),
])
def test_hook_time_bounds_that_cannot_work_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gpueff.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))


def test_put_checks_and_writes_under_one_lock(tmp_path: Path) -> None:
    """A final summary written by another connection between our check and our write must
    win: put() takes the write lock before it reads."""
    path = str(tmp_path / "store.db")
    SqliteStore(path).put(summary(RUNNING, 100.0))
    blocker = sqlite3.connect(path, timeout=5)
    blocker.execute("begin immediate")
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(SqliteStore(path).put(summary(RUNNING, 150.0))))
    thread.start()
    time.sleep(0.2)  # the late live snapshot now waits for the lock, before reading
    blocker.execute(
        "update node_summaries set status = 'complete', sampled_until = 200.0 where job_id = '7'")
    blocker.execute("commit")
    thread.join(10)
    assert done == [False]  # it saw the final summary once it had the lock
    (stored,) = SqliteStore(path, readonly=True).node_summaries("7") or [None]
    assert stored is not None


def test_timeline_survives_a_clock_stepped_back() -> None:
    timeline = Timeline(bucket_s=10.0)
    timeline.add(1000.0, 1.0, 50.0, None, None, None)
    timeline.add(950.0, 1.0, 70.0, None, None, None)  # NTP stepped the clock back 50 s
    assert timeline.to_dict()["points"][0][0] == 60.0


def test_non_finite_readings_are_not_figures() -> None:
    stat = Stat()
    stat.add(math.nan, 1.0)
    stat.add(math.inf, 1.0)
    stat.add(40.0, 1.0)
    assert (stat.mean, stat.samples) == (40.0, 1)


def test_a_sampler_that_ends_before_its_sigterm_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "sampler.pid").write_text("4242\n")
    monkeypatch.setattr(hooks, "_wait_for_exec", lambda pid, job_dir: True)

    def gone(pid: int, signum: int) -> Any:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(hooks.os, "kill", gone)
    hooks.stop_sampler(str(tmp_path), 1.0, HookLog(str(tmp_path / "log"), "1", "epilog"))


def test_hostlists_with_several_bracket_groups_expand_fully() -> None:
    assert expand_hostlist("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert expand_hostlist("gpu[1-2],login") == ["gpu1", "gpu2", "login"]


def test_the_jobs_cgroup_is_found_in_v1_per_node_and_v2_layouts(tmp_path: Path) -> None:
    from slurm_gpu_eff.node.jobenv import job_cgroup_exists

    (tmp_path / "freezer" / "slurm_gpu2" / "uid_1001" / "job_42").mkdir(parents=True)
    (tmp_path / "system.slice" / "slurmstepd.scope" / "job_7").mkdir(parents=True)
    assert job_cgroup_exists("42", "gpu2", str(tmp_path))
    assert not job_cgroup_exists("42", "gpu1", str(tmp_path))  # another node on this host
    assert job_cgroup_exists("7", "any", str(tmp_path))
    assert not job_cgroup_exists("4", "gpu2", str(tmp_path))  # job_4 is not job_42


def test_an_orphaned_sampler_stops_only_when_slurm_agrees_the_job_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.node import orphan
    from slurm_gpu_eff.node.jobenv import JobContext

    exists = {"now": True}
    monkeypatch.setattr(orphan, "job_cgroup_exists", lambda job, node: exists["now"])
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho RUNNING\n")
    squeue.chmod(0o755)
    watch = orphan.OrphanWatch(JobContext("42", "gpu1"), str(squeue))
    assert not watch.ended()  # cgroup seen
    exists["now"] = False
    assert [watch.ended() for _ in range(4)] == [False] * 4  # gone, but Slurm says running
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\n"
                      "exit 1\n")
    assert watch.ended()  # gone for 3+ checks and unknown to Slurm
    squeue.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    assert not watch.ended()  # no answer is no proof


def test_an_abandoned_job_directory_is_posted_by_the_next_delivery(tmp_path: Path) -> None:
    from slurm_gpu_eff.node.spool import write_json

    spool = Spool(str(tmp_path / "spool"))
    old, fresh = Path(spool.job_dir("7")), Path(spool.job_dir("8"))
    for job_dir, job in ((old, "7"), (fresh, "8")):
        live = NodeSummary(cluster="c", job_id=job, node="n1", status=RUNNING, sampled_until=5000.0)
        write_json(str(job_dir / "summary.json"), live.to_dict())
        (job_dir / "sampler.pid").write_text("999999999\n")  # no such process
    os.utime(old / "summary.json", (1, 1))  # untouched for decades: abandoned
    store = SqliteStore(str(tmp_path / "store.db"))
    result = deliver(spool, store)
    assert result.swept == ["7"] and not old.exists() and fresh.exists()
    (stored,) = store.node_summaries("7")
    assert stored.status == "partial" and "no epilog posted its summary" in stored.reason
    assert store.node_summaries("8") == []


def test_slurms_gpu_indexes_map_to_device_minors_through_slurmd_g(tmp_path: Path) -> None:
    """With AutoDetect, Slurm's GPU order can differ from the minors': slurmd -G names each
    index's device file, whose own number is the minor NVML knows."""
    from slurm_gpu_eff.node.binding import gres_gpu_minors

    devices = tmp_path / "dev"
    devices.mkdir()
    for name, minor in (("nvidia0", 3), ("nvidia1", 2), ("nvidia-cap7", 7)):
        try:
            os.mknod(devices / name, 0o600 | 0o020000, os.makedev(195, minor))
        except PermissionError:
            pytest.skip("mknod needs root")
    slurmd = tmp_path / "slurmd"
    slurmd.write_text(
        "#!/bin/sh\n"
        f"echo 'slurmd: Gres Name=gpu Type=h100 Count=2 Index=0 ID=1 File={devices}/nvidia[0-1] (null)' >&2\n"
        f"echo 'slurmd: Gres Name=gpu Type=mig Count=1 Index=2 File={devices}/nvidia-caps/x' >&2\n"
        "echo 'slurmd: Gres Name=shard Count=8 Index=0 ID=2 File=/dev/null' >&2\n"
    )
    slurmd.chmod(0o755)
    assert gres_gpu_minors("gpu1", str(slurmd)) == {0: 3, 1: 2}
    assert gres_gpu_minors("gpu1", str(tmp_path / "absent")) == {}


def test_a_corrupt_stored_summary_is_a_store_error_not_a_crash(tmp_path: Path) -> None:
    from slurm_gpu_eff.errors import StoreError

    store = SqliteStore(str(tmp_path / "store.db"))
    store.put(summary(COMPLETE, 1.0))
    store.db.execute("update node_summaries set body = '{not json'")
    store.db.conn.commit()
    with pytest.raises(StoreError, match="corrupt summary of job 7"):
        store.node_summaries("7")


NESTED = "[" * 100_000 + "]" * 100_000  # past the decoder's recursion limit


@pytest.mark.parametrize("body", [
    "{not json", "[1, 2]", "5", None, '{"status": "x"}', NESTED,
    '{"cluster": "c", "job_id": 7, "node": "gpu1", "status": "complete"}',  # not text: sorted
    '{"cluster": "c", "job_id": "7", "node": ["gpu1"], "status": "complete"}',  # with text ids
])
def test_a_stored_body_of_any_shape_reads_as_not_a_node_summary(body: str | None) -> None:
    """NodeSummary.from_json, which both stores and the idle check read rows with: one
    error (SpoolError) whatever the row holds, never a TypeError (a NULL, a list)."""
    from slurm_gpu_eff.errors import SpoolError
    from slurm_gpu_eff.model import NodeSummary

    with pytest.raises(SpoolError, match="not a node summary"):
        NodeSummary.from_json(body)  # type: ignore[arg-type]
    assert NodeSummary.from_json(json.dumps(summary(COMPLETE, 1.0).to_dict())).job_id == "7"


def gpu_row(**changes: object) -> dict[str, object]:
    return {"node": "n1", "index": 0, "minor": 0, "uuid": "GPU-1", "name": "sim",
            "memory_total_bytes": 80 * 2**30, "power_limit_w": 700, "samples": 3, "sampled_s": 3,
            "metrics": {"util": {"mean": 50.0, "min": 0, "max": 100, "last": 50.0, "samples": 3,
                                 "seconds": 3.0}}, **changes}


@pytest.mark.parametrize(("change", "message"), [
    ({"processes_max": "2"}, "processes_max is str"),
    ({"index": True}, "index is bool"),
    ({"gpm": 1}, "gpm is int"),
    ({"idle_now": [1, 2]}, "idle_now is list"),
    ({"metrics": {"util": {"mean": "50"}}}, "metric 'util' is not figures"),
    ({"metrics": {"util": [50.0]}}, "metric 'util' is not figures"),
    ({"metrics": {"util": {"mean": True}}}, "metric 'util' is not figures"),
])
def test_a_field_of_another_kind_is_not_a_node_summary(change: dict[str, object], message: str) -> None:
    """Past the ids: each field's JSON kind is its annotation's (a float takes an int), so a
    hand's edit or a release that changed a field reads as "corrupt summary", not as an
    internal error of the report that formats it."""
    from slurm_gpu_eff.errors import SpoolError
    from slurm_gpu_eff.model import NodeSummary

    body = {**summary(COMPLETE, 1.0).to_dict(), "gpus": [gpu_row()]}
    assert NodeSummary.from_dict(body).gpus[0].metric("util") == 50.0  # ints for floats: taken
    with pytest.raises(SpoolError, match=message):
        NodeSummary.from_dict({**body, "gpus": [gpu_row(**change)]})
    with pytest.raises(SpoolError, match="interval_s is str"):
        NodeSummary.from_dict({**body, "interval_s": "1"})


def test_a_summary_of_a_newer_version_is_refused_by_name() -> None:
    from slurm_gpu_eff.errors import SpoolError
    from slurm_gpu_eff.model import SUMMARY_VERSION, NodeSummary

    body = summary(COMPLETE, 1.0).to_dict()
    assert NodeSummary.from_dict({**body, "version": SUMMARY_VERSION}).version == SUMMARY_VERSION
    with pytest.raises(SpoolError, match=f"newer slurm-gpu-eff .summary version {SUMMARY_VERSION + 1}"):
        NodeSummary.from_dict({**body, "version": SUMMARY_VERSION + 1})


def test_the_utilisation_line_counts_only_gpus_whose_utilisation_was_measured() -> None:
    from slurm_gpu_eff.model import GpuSummary
    from slurm_gpu_eff.report.job import build_report
    from slurm_gpu_eff.report.render import render_text
    from slurm_gpu_eff.slurm.records import SlurmJob

    job = SlurmJob("7", "7", "x", "c", "alice", "a", "gpu", "COMPLETED", "0:0", 600, None,
                   "", "", 1, 1, "n1", 1.0, None, None, 2)
    measured = GpuSummary("n1", 0, 0, "GPU-0", "H100", None, None,
                          metrics={"util": {"mean": 80.0, "max": 90.0}})
    mig = GpuSummary("n1", 1, 1, "MIG-1", "H100 MIG", None, None, mig_gi_id=3)
    node = NodeSummary(cluster="c", job_id="7", node="n1", status=COMPLETE, gpus=[measured, mig])
    assert "GPU Utilisation: 80.0% mean over 1 measured GPU(s)" in render_text(build_report(job, [node]))
