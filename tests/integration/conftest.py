"""The development Slurm cluster (scripts/cluster.sh), driven as its users would drive it.

Jobs are submitted by unprivileged Unix users (alice, bob) with sbatch; their GPUs are
simulated behind the pynvml API by `gpueff-sim run` inside the job. Nothing is mocked
between sbatch and `gpueff --json`.

The store runs on both engines. A test of the cluster's store is marked `cluster_store`:
`make test` runs every test with the cluster on SQLite, then switches the cluster to
PostgreSQL (`scripts/cluster.sh store postgresql`) and runs the `cluster_store` tests
again. A test with a store of its own takes the `store_site` fixture, which runs it once
per engine (PostgreSQL: a private server from tests/pg.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.demo import cluster_env, in_cluster
from slurm_gpu_eff.config import Config, load_config
from tests import pg
from tests.configfile import value
from tests.smtp import Server

REPO = Path(__file__).resolve().parents[2]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# What slurmstepd writes to a job's output when the batch script it was to run is gone.
SCRIPT_LOST = re.compile(r"slurmstepd\S*: error: execve\(\): \S*/slurm_script: No such file or directory")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster_store: uses the development cluster's store; `make test` runs it "
        "again with the cluster on PostgreSQL (scripts/cluster.sh store postgresql)")


def pytest_report_header(config: pytest.Config) -> str | None:
    """Which engine the cluster's store is on, so that a log says which pass it is."""
    try:
        conf = load_config(cluster_env()["GPUEFF_CONFIG"])
    except Exception:  # no cluster, or no config yet: nothing to say
        return None
    return f"development cluster's store: {pg.engine_of(conf.store_url)} ({conf.store_url})"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cluster:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.dir = Path(env["GPUEFF_CLUSTER_DIR"])
        self.work = self.dir / "tests"
        self.work.mkdir(exist_ok=True)
        os.chmod(self.work, 0o1777)  # like /tmp: every test user writes its job output here
        # The release's venv: on 24.11 and 26.05 the jobs run their root's own Python.
        self.venv = Path(env["GPUEFF_VENV"])
        self.sim = self.venv / "bin" / "gpueff-sim"
        self.python = str(self.venv / "bin" / "python")
        # How each submit_profile job was submitted, so that a lost launch can be redone.
        self.submitted: dict[str, tuple[str, Path, tuple[str, ...], str, str]] = {}

    def run(self, command: list[str], user: str | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> Result:
        """Run a command as root or an unprivileged user against the cluster, in its release's
        root where it has one (scripts/cluster.sh as), with `env` added to the environment."""
        done = subprocess.run(in_cluster(user or "root", *command), capture_output=True, text=True,
                              timeout=timeout, env={**self.env, **(env or {})}, cwd=self.work)
        return Result(done.returncode, done.stdout, done.stderr)

    def write(self, name: str, text: str) -> Path:
        path = self.work / f"{uuid.uuid4().hex[:8]}-{name}"
        path.write_text(text)
        path.chmod(0o644)
        return path

    def profile(self, phases: list[dict[str, Any]]) -> Path:
        return self.write("profile.json", json.dumps({"phases": phases}))

    def submit(self, user: str, body: str, *args: str) -> str:
        """sbatch a script as `user`; returns the job id. Output goes to the shared work dir."""
        script = self.write("job.sh", "#!/bin/sh\n" + body + "\n")
        out = self.work / f"slurm-%j-{uuid.uuid4().hex[:6]}.out"
        mem = [] if "hetjob" in body else ["--mem=200M"]  # a het job sets it per component
        result = self.run(["sbatch", "--parsable", *mem, f"--output={out}", *args,
                           str(script)], user=user)
        assert result.code == 0, f"sbatch failed: {result.err}"
        return result.out.strip().split(";")[0]

    def submit_profile(
        self, user: str, profile: Path, *args: str, runner: str = "exec", before: str = "",
    ) -> str:
        """A job that plays `profile` on its GPUs; runner="srun" plays it on every node;
        `before` is shell run first (e.g. CPU load in the background)."""
        # With work started `before`, the script waits for it: Slurm counts the CPU time of
        # the children it reaps, not of orphans left behind by an exec.
        launch = "srun --ntasks-per-node=1" if runner == "srun" else ("" if before else "exec")
        body = (f"{before}\necho SLURM_JOB_GPUS=$SLURM_JOB_GPUS "
                f"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\n"
                f"{launch} {shlex.quote(str(self.sim))} run {shlex.quote(str(profile))}"
                + ("\nwait" if before else ""))
        job_id = self.submit(user, body, *args)
        self.submitted[job_id] = (user, profile, args, runner, before)
        return job_id

    def launch_lost(self, job_id: str) -> bool:
        """Slurm lost a finished job before any of its script ran. Slurm 22.05's slurmd
        deletes a batch job's script when a connect to that job's batch-step socket is
        refused (`_handle_stray_script: Purging vestigial job script` in slurmd's log): meant
        for a dead step's leftovers, it can also hit a step that is starting (its script
        written, its socket not yet answering). slurmstepd then cannot exec the script
        (`execve(): .../slurm_script: No such file or directory` in the job's output) and
        the job ends FAILED, exit code 2, in no time, its GPUs idle. Seen in CI with four
        jobs starting together on one node."""
        return self.state(job_id) == "FAILED" and bool(SCRIPT_LOST.search(self.output(job_id)))

    def wait_played(self, job_id: str, timeout: float = 120, retries: int = 2) -> str:
        """Wait for a submit_profile job to leave the queue; if Slurm lost its launch
        (launch_lost), submit it again as its user would, at most `retries` times. Returns the
        id of the job that ran, after checking that its workload played (its output has the
        workload's times): a test that judges what the GPUs did needs them driven."""
        self.wait_done(job_id, timeout)
        for _ in range(retries):
            if not self.launch_lost(job_id):
                break
            user, profile, args, runner, before = self.submitted[job_id]
            job_id = self.submit_profile(user, profile, *args, runner=runner, before=before)
            self.wait_done(job_id, timeout)
        self.played(job_id)  # fails, with the job's output, if the workload did not play
        return job_id

    def output(self, job_id: str) -> str:
        files = list(self.work.glob(f"slurm-{job_id}-*.out"))
        return files[0].read_text() if files else ""

    def state(self, job_id: str) -> str:
        """The state of the job's newest record: a job whose nodes were updated just as it
        was allocated has a RESIZING record before the run's own."""
        result = self.run(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=State"])
        records = [line.split()[0] for line in result.out.splitlines() if line.strip()]  # "CANCELLED by 0"
        return (records or ["UNKNOWN"])[-1]

    def in_queue(self, job_id: str) -> bool:
        result = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"])
        return bool(result.out.strip())

    def wait_state(self, job_id: str, states: set[str], timeout: float = 90) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.state(job_id)
            if state in states:
                return state
            if state in FINAL_STATES:
                break
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {self.state(job_id)}")

    def wait_done(self, job_id: str, timeout: float = 120) -> str:
        """Wait until the job has left the queue: its epilogs have finished on every node."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.in_queue(job_id) and self.state(job_id) in FINAL_STATES:
                return self.state(job_id)
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} did not finish within {timeout} s")

    def gpueff(self, job_id: str, user: str = "alice", *args: str) -> Result:
        """`gpueff JOBID` as `user`; for a finished GPU job, once its final figures are in
        its AdminComment (the users' read path: a few seconds after the store has them)."""
        if user != "root":
            self.wait_mirrored(job_id)
        return self.run(["gpueff", job_id, *args], user=user)

    def wait_mirrored(self, job_id: str, timeout: float = 30) -> None:
        """Until a finished GPU job's AdminComment holds its final line (at most `timeout`:
        the test then sees what a user would)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            row = self.run(["sacct", "-j", job_id, "-X", "-n", "-P",
                            "--format=State,AllocTRES,AdminComment"]).out.strip().split("|")
            if len(row) < 3 or row[0].split()[0] not in FINAL_STATES or "gres/gpu" not in row[1]:
                return  # unknown, running, or no GPUs: nothing to wait for
            if "gpueff1 " in row[2] and "status=running" not in row[2]:
                return
            time.sleep(0.5)

    @property
    def config_file(self) -> Path:
        """The cluster's config file (TOML), as the hooks find it: $GPUEFF_CONFIG."""
        return Path(self.env["GPUEFF_CONFIG"])

    def config(self) -> Config:
        """The cluster's config as the hooks read it now (the engine may be switched)."""
        return load_config(str(self.config_file))

    @property
    def store_url(self) -> str:
        """The writers' URL of the cluster's store (root reads the PostgreSQL password)."""
        return self.config().store_url

    @property
    def engine(self) -> str:
        return pg.engine_of(self.store_url)

    def store_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read query on the cluster's store, whichever the engine (`?` placeholders)."""
        return pg.rows(self.store_url, sql, params)

    def store_execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """A write on the cluster's store (a test damaging it on purpose)."""
        return pg.execute(self.store_url, sql, params)

    def store_down(self) -> AbstractContextManager[None]:
        """The cluster's store unusable while inside: PostgreSQL stopped, or the SQLite
        file held locked by a reader's exclusive transaction."""
        return pg.store_down(self.store_url, self.dir / "pg")

    def summaries(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The stored node summaries of a job, by node."""
        found = self.store_rows("select node, body from node_summaries where job_id = ?", (job_id,))
        return {node: pg.as_json(body) for node, body in found}

    def played(self, job_id: str) -> tuple[float, float]:
        """When the job's workload started and ended, as gpueff-sim printed it."""
        found = re.search(r"\(from ([\d.]+) to ([\d.]+)\)", self.output(job_id))
        assert found, f"no workload times in job {job_id}'s output: {self.output(job_id)!r}"
        return float(found[1]), float(found[2])

    def truth(self, job_id: str, node: str, value: float, idle: float = 0.0) -> float:
        """A constant profile value's mean over the sampled window: idle outside the workload."""
        summary = self.summaries(job_id)[node]
        t0, t1 = summary["sampled_from"], summary["sampled_until"]
        started, ended = self.played(job_id)
        busy = max(0.0, min(t1, ended) - max(t0, started))
        return (value * busy + idle * ((t1 - t0) - busy)) / (t1 - t0)

    def node_state(self, node: str) -> str:
        return self.run(["sinfo", "-h", "-n", node, "-o", "%T"]).out.strip()

    def spool(self, node: str) -> Path:
        return self.dir / "spool" / node

    def sim_state(self, node: str, minor: int) -> dict[str, Any]:
        return json.loads((self.dir / "sim" / "state" / node / f"gpu{minor}.json").read_text())


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    try:
        env = cluster_env()
        up = subprocess.run(in_cluster("root", "sinfo", "-h"), env=env, capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        up = False
    if not up:
        fail_or_skip("the development cluster is not running (make cluster)")
    return Cluster(env)


def with_settings(text: str, section: str, settings: dict[str, Any] | str) -> str:
    """The TOML config `text` with `settings` (typed values, written as TOML; or TOML lines
    as they are) in its [section]: right after the section's header where it has one (TOML
    allows a table only once, so a second [section] would not do), else in that section
    added at the end. A key the section already sets is an error when the file is read."""
    if isinstance(settings, str):
        lines = settings if settings.endswith("\n") else settings + "\n"
    else:
        lines = "".join(f"{key} = {value(v)}\n" for key, v in settings.items())
    header = re.compile(rf"^\[{re.escape(section)}\][ \t]*(#.*)?\n", re.M)
    if header.search(text):
        return header.sub(lambda found: found[0] + lines, text, count=1)
    return text + ("\n" if text and not text.endswith("\n") else "") + f"[{section}]\n{lines}"


def fail_or_skip(message: str) -> None:
    """Where the cluster is required (make test, CI), what a test needs must be there."""
    if os.environ.get("GPUEFF_REQUIRE_CLUSTER"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(params=pg.ENGINES)
def store_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[pg.StoreSite]:
    """A store of the test's own, once per engine: the SQLite file tmp_path/store.db, or a
    private PostgreSQL server (destroyed after the test)."""
    if request.param == "sqlite":
        yield pg.StoreSite.sqlite(tmp_path / "store.db")
        return
    why = pg.unavailable()
    if why:
        fail_or_skip(why)
    with pg.PgServer() as server:
        yield pg.StoreSite.postgresql(server)


SMTP_PORT = 8025  # the development cluster's [mail] smtp_port


@pytest.fixture(scope="module")
def smtp() -> Iterator[Server]:
    """A real SMTP server where the cluster's mail goes, for one test module."""
    server = Server(SMTP_PORT)
    server.start()
    yield server
    server.stop()
