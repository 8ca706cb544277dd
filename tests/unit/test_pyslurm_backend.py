"""The pyslurm backend's mapping, without Slurm: a stand-in pyslurm module answers with what
pyslurm 22.5.3 answered on the development cluster (tests/fixtures/pyslurm), and each
answer must equal what the commands backend makes of sacct's text for the same job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import JobNotFound, NotPermitted, SlurmError
from slurm_gpu_eff.slurm import inproc as pb
from slurm_gpu_eff.slurm.commands import jobs_from_rows, parse_rows
from slurm_gpu_eff.slurm.inproc import Pyslurm
from slurm_gpu_eff.slurm.records import RunningJob, SlurmJob, mirrored_gpus

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pyslurm"
SHAPES = sorted(path.stem for path in FIXTURES.glob("*.json"))


def fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    for record in doc["records"]:
        record["steps"] = {int(step_id): step for step_id, step in record["steps"]}
    return doc


class FakePyslurm:
    """The calls the backend makes, answering from one fixture (or none)."""

    def __init__(self, doc: dict[str, Any] | None = None, comments: dict[str, str] | None = None,
                 version: str = "22.5.3", controller: str = "22.05.8") -> None:
        self.doc = doc or {"records": [], "comments": {}, "tres_names": {}}
        self.comments = comments  # None: the fixture's
        self.__version__ = version
        self.controller = controller
        self.asked: list[tuple[str, Any]] = []
        self.settings = SimpleNamespace(LOCAL_CLUSTER="gpueffdev")
        self.slurmctld = SimpleNamespace(Config=SimpleNamespace(load=lambda: None))  # 22.5.3's has no version
        self.db = SimpleNamespace(
            JobFilter=lambda **kw: SimpleNamespace(**{"ids": None, **kw}),
            Jobs=SimpleNamespace(load=self._load, modify=self._modify),
            Job=lambda **kw: SimpleNamespace(**kw),
            TrackableResources=SimpleNamespace(load=self._tres),
        )
        self.load_error: Exception | None = None
        self.ctld_records: list[dict[str, Any]] = []

    # the older API
    def slurmdb_jobs(self) -> Any:
        def get(**kw: Any) -> dict[int, Any]:
            self.asked.append(("slurmdb_jobs", kw))
            return {int(r["jobid"]): r for r in self.doc["records"]}
        return SimpleNamespace(get=get)

    def config(self) -> Any:
        return SimpleNamespace(get=lambda: {"version": self.controller, "cluster_name": "gpueffdev",
                                            "private_data": 1})

    def job(self) -> Any:
        def find_id(job_id: str) -> list[dict[str, Any]]:
            if not self.ctld_records:
                raise ValueError("Invalid job id specified", 2017)
            return self.ctld_records
        return SimpleNamespace(find_id=find_id)

    def slurm_kill_job2(self, job_id: bytes, signal: int, flags: int) -> int:
        if not isinstance(job_id, bytes):  # a const char * in pyslurm (seen in the soak)
            raise TypeError(f"expected bytes, {type(job_id).__name__} found")
        self.asked.append(("kill", (job_id.decode(), signal, flags)))
        return 0

    # the newer API
    def _load(self, filt: Any) -> Any:
        self.asked.append(("Jobs.load", filt.ids))
        if self.load_error is not None:
            raise self.load_error
        comments = self.doc["comments"] if self.comments is None else self.comments
        jobs = {int(k): SimpleNamespace(id=int(k), admin_comment=v, system_comment=f"sys {v}")
                for k, v in comments.items()}
        return SimpleNamespace(data={"gpueffdev": jobs})

    def _modify(self, filt: Any, changes: Any) -> list[int]:
        self.asked.append(("Jobs.modify", (filt.ids, vars(changes))))
        return list(filt.ids)

    def _tres(self) -> dict[str, Any]:
        self.asked.append(("TrackableResources.load", None))
        names = self.doc["tres_names"].items()
        return {name: SimpleNamespace(id=int(i), type_and_name=name) for i, name in names}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a stand-in pyslurm; set its fixture with fake.doc = fixture(...)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    stand_in = FakePyslurm()
    monkeypatch.setattr(pb, "_MODULE", [stand_in])
    monkeypatch.setattr(pb, "_CONTROLLER", [])
    monkeypatch.setattr(pb, "_USABLE", [])
    monkeypatch.setattr(pb, "_TRES_NAMES", {})
    yield stand_in
    monkeypatch.undo()
    time.tzset()


def from_sacct(doc: dict[str, Any], without_comments: bool = False) -> list[SlurmJob]:
    """What SacctQuery makes of the captured sacct text (AllocTRES added as it adds it)."""
    rows = parse_rows(doc["sacct"], "\x1f")
    if without_comments:
        for row in rows:
            row["AdminComment"] = ""
    if any("." not in r["JobID"] and mirrored_gpus(r["AdminComment"]) is None for r in rows):
        tres = dict(line.split("\x1f") for line in doc["sacct_alloc_tres"].splitlines())
        for row in rows:
            row["AllocTRES"] = tres.get(row["JobIDRaw"], "")
    return jobs_from_rows(doc["job"], rows)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_job_shape_equals_what_sacct_gives(fake: FakePyslurm, shape: str) -> None:
    fake.doc = doc = fixture(shape)
    assert Pyslurm().jobs(doc["job"]) == from_sacct(doc)


@pytest.mark.parametrize("shape", SHAPES)
def test_without_our_line_the_gpus_come_from_alloc_tres_as_sacct_prints_it(fake: FakePyslurm,
                                                                             shape: str) -> None:
    fake.doc = doc = fixture(shape)
    fake.comments = {k: "" for k in doc["comments"]}
    jobs = Pyslurm().jobs(doc["job"])
    assert jobs == from_sacct(doc, without_comments=True)
    assert all(job.alloc_tres.startswith("billing=") and job.gpus >= 1 for job in jobs)
    assert ("TrackableResources.load", None) in fake.asked


def test_cpu_time_keeps_sacct_milliseconds(fake: FakePyslurm) -> None:
    """pyslurm.db.Jobs.load gives whole seconds per step: the older API's microseconds,
    summed over the steps and cut to milliseconds as sacct does, equal sacct's."""
    fake.doc = doc = fixture("multi_task_step")
    job, = Pyslurm().jobs(doc["job"])
    assert job.total_cpu_s == from_sacct(doc)[0].total_cpu_s
    assert job.total_cpu_s != int(job.total_cpu_s)


def test_the_records_are_asked_once_with_sacct_flags(fake: FakePyslurm) -> None:
    fake.doc = fixture("array")
    Pyslurm().jobs("9")
    (call, kw), (load, ids) = fake.asked[:2]
    assert call == "slurmdb_jobs" and kw == {"jobids": ["9"], "flags": pb.JOBCOND_FLAG_NO_TRUNC,
                                              "clusters": ["gpueffdev"]}
    assert load == "Jobs.load" and ids == [9, 10]


def test_a_system_comment_field_is_read_instead(fake: FakePyslurm) -> None:
    fake.doc = fixture("one_task")
    job, = Pyslurm(Config(comment_field="SystemComment")).jobs("5")
    assert job.admin_comment.startswith("sys gpueff1 ")


def test_heterogeneous_jobs_comments_come_from_sacct_where_pyslurm_cannot_load_them(
        fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyslurm.db.Jobs.load raises IndexError on a heterogeneous job (a step's node index
    is the whole job's): the comments alone are asked of sacct."""
    fake.doc = doc = fixture("heterogeneous")
    fake.load_error = IndexError("list index out of range")
    asked: list[list[str]] = []

    def sacct(command: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        asked.append(command)
        delimiter = command[command.index("-n") + 1].split("=", 1)[1]
        out = "".join(f"gpueffdev{delimiter}{k}{delimiter}{v}\n" for k, v in doc["comments"].items())
        return subprocess.CompletedProcess(command, 0, out.encode(), b"")

    monkeypatch.setattr("slurm_gpu_eff.slurm.inproc.run_slurm", sacct)
    assert Pyslurm().jobs("25") == from_sacct(doc)
    assert asked and asked[0][0].endswith("sacct") and asked[0][1:3] == ["-j", "25,26"]


def test_a_period_is_asked_of_sacct_with_every_run_of_a_requeued_job(
        fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither pyslurm API gives every run of a requeued job (sacct -D): the usage report
    counts each, so the period goes through the commands, and pyslurm is not asked."""
    asked: list[list[str]] = []

    def sacct(command: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, b"", b"")

    monkeypatch.setattr("slurm_gpu_eff.slurm.commands.run_slurm", sacct)
    assert Pyslurm().period_jobs(1_795_700_000, 1_795_800_000, user="alice") == []
    assert asked[0][0].endswith("sacct") and {"-D", "-X", "-u", "alice"} <= set(asked[0])
    assert fake.asked == []


def test_a_component_asked_by_its_own_raw_id_keeps_that_id(fake: FakePyslurm) -> None:
    """The difference named in the module's docstring: sacct shows 25+1 for job 26."""
    fake.doc = doc = fixture("het_component")
    job, = Pyslurm().jobs("26")
    assert job.job_id == "26" and job.job_id_raw == "26"
    assert job == SlurmJob(**{**vars(from_sacct(doc)[0]), "job_id": "26"})


def test_no_job_is_job_not_found(fake: FakePyslurm) -> None:
    with pytest.raises(JobNotFound):
        Pyslurm().jobs("424242")


def test_no_job_under_private_data_is_not_permitted(fake: FakePyslurm,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NotPermitted, match="PrivateData=jobs"):
        Pyslurm().jobs("424242")


def test_pyslurm_errors_become_ours(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise ValueError("Unable to contact slurm controller (connect failure)", 1007)
    monkeypatch.setattr(fake, "slurmdb_jobs", broken)
    with pytest.raises(SlurmError, match=r"^slurmdbd: Unable to contact slurm controller \(connect"):
        Pyslurm().jobs("5")

    def denied() -> Any:
        raise ValueError("Access/permission denied", 2002)
    monkeypatch.setattr(fake, "slurmdb_jobs", denied)
    with pytest.raises(NotPermitted):
        Pyslurm().jobs("5")


def test_comment_as_get_admin_comment(fake: FakePyslurm) -> None:
    fake.doc = doc = fixture("array_task")
    fake.comments = {"10": "site text"}
    comment = Pyslurm().comment("9_1", owner=True)
    assert comment == ("site text", "billing=1,cpu=1,gres/gpu=1,mem=200M,node=1", "9_1", "alice", "physics")
    assert fake.asked[0][1]["flags"] == pb.JOBCOND_FLAG_NO_TRUNC | pb.JOBCOND_FLAG_NO_STEP
    assert Pyslurm().comment("9_1").user == ""
    fake.doc = {**doc, "records": []}
    assert Pyslurm().comment("77") == ("", "", "77", "", "")


def test_set_comment_of_a_running_job_goes_through_slurmctld(fake: FakePyslurm) -> None:
    modified: list[tuple[int, Any]] = []
    fake.Job = lambda job_id: SimpleNamespace(modify=lambda changes: modified.append((job_id, changes)))  # type: ignore[attr-defined]
    fake.JobSubmitDescription = lambda **kw: kw  # type: ignore[attr-defined]
    assert Pyslurm().set_comment("65", "gpueffdev", "gpueff1 x") == "slurmctld"
    assert modified == [(65, {"admin_comment": "gpueff1 x"})]


def test_set_comment_of_a_finished_job_goes_through_slurmdbd(fake: FakePyslurm) -> None:
    def finished(changes: Any) -> None:
        raise ValueError("Job has already finished", 2017)
    fake.Job = lambda job_id: SimpleNamespace(modify=finished)  # type: ignore[attr-defined]
    fake.JobSubmitDescription = lambda **kw: kw  # type: ignore[attr-defined]
    assert Pyslurm().set_comment("5", "gpueffdev", "gpueff1 x") == "slurmdbd"
    assert ("Jobs.modify", ([5], {"admin_comment": "gpueff1 x"})) in fake.asked
    assert Pyslurm(Config(comment_field="SystemComment")).set_comment("5", "gpueffdev", "y") == "slurmdbd"
    assert ("Jobs.modify", ([5], {"system_comment": "y"})) in fake.asked
    with pytest.raises(SlurmError, match="not a job comment field"):
        Pyslurm(Config(comment_field="Comment")).set_comment("5", "gpueffdev", "y")


def test_set_comment_names_an_array_task_by_its_raw_id(fake: FakePyslurm) -> None:
    fake.doc = fixture("array_task")
    assert Pyslurm().set_comment("9_1", "gpueffdev", "t", running=True) == "slurmdbd"
    assert ("Jobs.modify", ([10], {"admin_comment": "t"})) in fake.asked


def test_set_comment_of_the_task_holding_the_arrays_id_goes_through_the_commands(
        fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """9_2's raw id is 9, the array's: JobFilter(ids=[9]) would write every task."""
    doc = fixture("array")
    fake.doc = {**doc, "records": [r for r in doc["records"] if r["jobid"] == 9]}
    calls: list[tuple[Any, ...]] = []
    def written(*args: Any, **kw: Any) -> str:
        calls.append((args[:3], {k: kw[k] for k in ("running", "field")}))
        return "slurmdbd"

    monkeypatch.setattr("slurm_gpu_eff.slurm.commands.set_admin_comment", written)
    assert Pyslurm().set_comment("9_2", "gpueffdev", "t", running=True) == "slurmdbd"
    assert calls == [(("9_2", "gpueffdev", "t"), {"running": True, "field": "AdminComment"})]
    assert not any(call == "Jobs.modify" for call, _ in fake.asked)


def test_running_job_as_squeue(fake: FakePyslurm) -> None:
    fake.ctld_records = [
        {"job_id": 65, "array_job_id": None, "array_task_id": None, "het_job_id": None,
         "het_job_offset": None, "name": "a\nb", "user_id": 0, "account": "physics", "partition": "gpu",
         "job_state": "RUNNING",
         "batch_flag": 1, "comment": None, "time_limit": "UNLIMITED", "run_time": 3725, "nodes": "gpu[1-2]",
         "tres_alloc_str": "cpu=1,mem=200M,node=1,billing=1,gres/gpu=1", "start_time": 1795701154},
        {"job_id": 66, "array_job_id": 64, "array_task_id": 2, "het_job_id": None,
         "het_job_offset": None, "name": "t", "user_id": 0, "account": "physics", "partition": "gpu",
         "job_state": "PENDING",
         "batch_flag": 0, "comment": "c", "time_limit": 90, "run_time": 0, "nodes": None,
         "tres_alloc_str": None, "start_time": 0},
    ]
    backend = Pyslurm()
    assert backend.running_job("65") == RunningJob(
        job_id="65", name="a\nb", user="root", account="physics", partition="gpu", state="RUNNING",
        batch=True, comment="", time_limit="UNLIMITED", run_time="1:02:05", nodes="gpu[1-2]",
        tres="cpu=1,mem=200M,node=1,billing=1,gres/gpu=1", task_id="65", start_at=1795701154.0)
    pending = backend.running_job("66")
    assert pending is not None
    assert (pending.task_id, pending.time_limit, pending.run_time) == ("64_2", "1:30:00", "0:00")
    assert pending.start_at is None
    assert backend.running_job("67") is None
    fake.ctld_records = []
    assert backend.running_job("65") is None


def test_running_job_through_the_24_11_api(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """24.11's older find_id hands slurm_load_job text where it takes an integer (it raised
    "an integer is required" on the cluster, and the idle watch sent no alert): the newer
    pyslurm.Job.load is asked there, and its parts give squeue's tres-alloc."""
    def broken(job_id: Any) -> Any:
        raise TypeError("an integer is required")
    jobs = {
        65: SimpleNamespace(
            id=65, array_id=None, array_task_id=None, heterogeneous_id=None, heterogeneous_offset=None,
            name="a\nb", user_name="alice", account="physics", partition="gpu", state="RUNNING",
            is_batch_job=True, comment=None, time_limit=10, run_time=3725, allocated_nodes="gpu[2-3]",
            cpus=3, memory=3072, num_nodes=2, billable_tres=3.0, gres_per_node={"gres/gpu": 1},
            start_time=1795701154),
        66: SimpleNamespace(
            id=66, array_id=64, array_task_id=2, heterogeneous_id=None, heterogeneous_offset=None,
            name="t", user_name="bob", account="physics", partition="gpu", state="RUNNING",
            is_batch_job=False, comment="c", time_limit=None, run_time=5, allocated_nodes="gpu1",
            cpus=3, memory=3000, num_nodes=1, billable_tres=3.0, gres_per_node={}, start_time=1795701154),
    }
    def load(job_id: int) -> Any:
        assert isinstance(job_id, int)
        if job_id not in jobs:
            raise ValueError("Invalid job id specified", 2017)
        return jobs[job_id]
    monkeypatch.setattr(fake, "__version__", "24.11.0")
    monkeypatch.setattr(fake, "job", lambda: SimpleNamespace(find_id=broken))
    monkeypatch.setattr(fake, "Job", SimpleNamespace(load=load), raising=False)
    backend = Pyslurm()
    assert backend.running_job("65") == RunningJob(
        job_id="65", name="a\nb", user="alice", account="physics", partition="gpu", state="RUNNING",
        batch=True, comment="", time_limit="10:00", run_time="1:02:05", nodes="gpu[2-3]",
        tres="cpu=3,mem=3G,node=2,billing=3,gres/gpu=2", task_id="65", start_at=1795701154.0)
    task = backend.running_job("66")
    assert task is not None
    # a GPU count asked per job (--gpus=3) is not in that API's parts: left out, not guessed
    assert (task.task_id, task.batch, task.time_limit, task.tres) == (
        "64_2", False, "UNLIMITED", "cpu=3,mem=3000M,node=1,billing=3")
    assert backend.running_job("67") is None


def test_cluster_and_private_data_from_slurmctlds_configuration(fake: FakePyslurm,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    backend = Pyslurm()
    assert backend.cluster() == "gpueffdev"
    assert backend.private_jobs() is False  # root sees all
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert backend.private_jobs() is True


def test_the_24_11_configuration_api(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyslurm 24.11's slurmctld.Config has the version (22.5.3's has not: its older config())."""
    loaded = SimpleNamespace(version="24.11.5", cluster_name="gpueffdev", private_data=["jobs", "usage"])
    config = SimpleNamespace(version=property(lambda self: ""), load=lambda: loaded)
    monkeypatch.setattr(fake, "slurmctld", SimpleNamespace(Config=config))
    monkeypatch.setattr(fake, "__version__", "24.11.0")
    monkeypatch.setattr(pb.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert pb.usable() == (True, "pyslurm 24.11.0 for Slurm 24.11")
    assert Pyslurm().private_jobs() is True and Pyslurm().cluster() == "gpueffdev"


def test_scancel_names_the_task_as_scancel_does(fake: FakePyslurm) -> None:
    Pyslurm().scancel("64_2")
    assert fake.asked == [("kill", ("64_2", 9, 0))]


def test_usable_where_the_releases_match(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(pb, "config_source", lambda: "/etc/slurm/slurm.conf")
    assert pb.usable() == (True, "pyslurm 22.5.3 for Slurm 22.05")


def test_not_usable_where_the_releases_differ(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb.importlib.util, "find_spec", lambda name: object())
    fake.controller = "24.11.5"
    assert pb.usable() == (
        False, "pyslurm 22.5.3 is built for Slurm 22.05, the Slurm running here is 24.11.5")


def test_not_usable_without_an_answer(fake: FakePyslurm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb.importlib.util, "find_spec", lambda name: object())

    def silent() -> Any:
        raise ValueError("Insane message length", 1008)
    monkeypatch.setattr(fake, "config", silent)
    ok, why = pb.usable()
    assert not ok
    assert why == "pyslurm 22.5.3 (for Slurm 22.05) got no answer from slurmctld: Insane message length"


def test_not_usable_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb, "_USABLE", [])
    monkeypatch.setattr(pb.importlib.util, "find_spec", lambda name: None)
    assert pb.usable() == (
        False, "pyslurm is not installed (scripts/build-pyslurm.sh builds it from its sources)")


def test_no_slurm_conf_means_no_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a slurm.conf, libslurm ends the process at `import pyslurm` (exit 1, no
    exception): the backend refuses before importing."""
    monkeypatch.setattr(pb, "_MODULE", [])
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    with pytest.raises(SlurmError, match="no slurm.conf here"):
        pb._module()


@pytest.mark.parametrize(("sec", "usec", "text"), [
    (0, 57701, "0.057"), (3, 1_107_999, "4.107"), (3599, 999_999, "3599.999"), (3600, 500_000, "3600"),
    (86400 * 2 + 5, 0, "172805"),
])
def test_cpu_time_as_sacct_prints_it(sec: int, usec: int, text: str) -> None:
    assert pb.cpu_time(sec, usec) == text


def test_cpu_time_of_steps_still_running_is_left_out_as_sacct_does() -> None:
    record = {"tot_cpu_sec": 0, "tot_cpu_usec": 0, "steps": {
        0xFFFFFFFB: {"state": 1, "tot_cpu_sec": 5, "tot_cpu_usec": 0},  # batch, running
        0: {"state": 3, "tot_cpu_sec": 2, "tot_cpu_usec": 600_000},
        1: {"state": 5, "tot_cpu_sec": 1, "tot_cpu_usec": 600_000},  # failed: ended
    }}
    assert pb.job_cpu(record) == (3, 1_200_000)
    assert pb.cpu_time(*pb.job_cpu(record)) == "4.200"


@pytest.mark.parametrize(("code", "text"), [
    (0, "0:0"), (1 << 8, "1:0"), (9, "0:9"), (137 << 8, "9:0"), (pb.NO_VAL, "0:0"), (None, "0:0"),
])
def test_exit_code_as_sacct_prints_it(code: int | None, text: str) -> None:
    assert pb.exit_code(code) == text


def test_alloc_tres_text() -> None:
    names = {1: "cpu", 2: "mem", 3: "energy", 4: "node", 5: "billing", 1001: "gres/gpu",
             1002: "gres/gpu:a100"}
    simple = f"1=8,2=8192,3={pb.NO_VAL64},4=1,5=8,1001=2,1002=2,9999=1"
    assert pb.alloc_tres_text(simple, names) == "billing=8,cpu=8,gres/gpu=2,gres/gpu:a100=2,mem=8G,node=1"
    assert pb.alloc_tres_text("2=1536", names) == "mem=1536M"
    assert pb.alloc_tres_text("", names) == ""


def test_job_names() -> None:
    def rec(jobid: int, array: int = 0, task: int = pb.NO_VAL, waiting: str | None = None) -> dict[str, Any]:
        return {"jobid": jobid, "array_job_id": array, "array_task_id": task, "array_task_str": waiting}
    assert pb.job_names("9", [rec(9, 9, 2), rec(10, 9, 1), rec(11, 9, pb.NO_VAL, "3-5%2")]) == {
        9: "9_2", 10: "9_1", 11: "9_[3-5]"}
    assert pb.job_names("25", [rec(25), rec(26)]) == {25: "25+0", 26: "25+1"}
    assert pb.job_names("25+1", [rec(26)]) == {26: "25+1"}
    assert pb.job_names("26", [rec(26)]) == {26: "26"}


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00"), (65, "1:05"), (3725, "1:02:05"),
                                               (90061, "1-01:01:01"), (-1, "INVALID")])
def test_duration_as_squeue(seconds: int, text: str) -> None:
    assert pb.duration(seconds) == text


def test_slurm_release() -> None:
    assert pb.slurm_release("22.5.3") == pb.slurm_release("22.05.8") == "22.05"
    assert pb.slurm_release("24.11.0") == "24.11"
    assert pb.slurm_release("") is None


PYSLURM = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import importlib.util, sys; "
                    "sys.exit(importlib.util.find_spec('pyslurm') is None)"]).returncode != 0,
    reason="pyslurm is not built in this venv (scripts/build-pyslurm.sh; its sources are ../shared/vendor)")


@PYSLURM
def test_the_pyslurm_built_here_has_every_call_the_backend_makes(tmp_path: Path) -> None:
    """In a child process (a slurm.conf of its own, no controller needed): what the
    backend calls exists in the pyslurm this venv has."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=probe\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    probe = (
        "import pyslurm as ps\n"
        "assert all(callable(getattr(ps, n)) for n in ('slurmdb_jobs', 'job', 'slurm_kill_job2', 'config', "
        "'Job', 'JobSubmitDescription'))\n"
        "assert all(callable(x) for x in (ps.db.Jobs.load, ps.db.Jobs.modify, ps.db.JobFilter, ps.db.Job, "
        "ps.db.TrackableResources.load))\n"
        "assert ps.settings.LOCAL_CLUSTER == 'probe', ps.settings.LOCAL_CLUSTER\n"
        "assert ps.db.Job(admin_comment='x').admin_comment == 'x'\n"
        "assert ps.JobSubmitDescription(admin_comment='y').admin_comment == 'y'\n"
        "print(ps.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_CONF": str(conf)})
    assert done.returncode == 0, done.stderr
    assert pb.slurm_release(done.stdout.strip()) is not None
