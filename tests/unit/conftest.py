"""Shared fixtures for the unit tests: builders for sacct rows, jobs, node summaries,
a simulated GPU node (devices file, state files, a scripted clock) and a hook site
(config, spool, store, log in tmp_path) whose sampler processes are always reaped.

Fixtures that build things are factories (they return a function), so that a test
says exactly what differs from the default job, GPU or summary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff import model
from slurm_gpu_eff.config import Config
from slurm_gpu_eff.node.gpu import GpuSession
from slurm_gpu_eff.node.spool import LOCATOR_ROOT
from slurm_gpu_eff.sim.profile import parse_profile
from slurm_gpu_eff.sim.workload import state_path, state_record
from slurm_gpu_eff.slurm.records import SlurmJob
from slurm_gpu_eff.slurm.sacct import DELIMITER, FIELDS
from tests import standin
from tests.configfile import write_config
from tests.unit.hint_jobs import gpu, job_report  # noqa: F401  (the hint rules' tests' fixtures)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GIB = 1024**3
BOOT = 1_700_000_000.0  # the simulated "driver load" (devices file mtime)

# Our line in a finished 2-GPU job's AdminComment, as sacct gives it back (mirror.py; a
# job this large would carry figures= too): where SacctQuery finds the job's GPU count.
DEFAULT_ADMIN_COMMENT = ("gpueff1 status=complete nodes=1 gpus=2 util=50.0 gpu_util=50.0,50.0 "
                         "idle=0 mem_peak=25.0 energy_kwh=0.500 alloc_gpus=2")

# One job-allocation row, as sacct -P prints it for a finished 2-GPU job.
DEFAULT_ROW = {
    "JobID": "4242", "JobName": "train", "JobIDRaw": "4242", "Cluster": "gpueffdev",
    "User": "alice", "Account": "physics", "Partition": "gpu", "State": "COMPLETED",
    "ExitCode": "0:0", "ElapsedRaw": "3600", "TimelimitRaw": "120",
    "Start": "2026-11-20T10:00:00", "End": "2026-11-20T11:00:00", "NCPUS": "4",
    "NNodes": "1", "NodeList": "gpu1", "TotalCPU": "01:00:00", "ReqMem": "4000M",
    "MaxRSS": "", "NTasks": "", "AdminComment": DEFAULT_ADMIN_COMMENT,
}
# A parsed row may also hold AllocTRES: SacctQuery.jobs() adds it, from a second sacct
# call, to jobs without our line.
ROW_FIELDS = (*FIELDS, "AllocTRES")


@pytest.fixture
def sacct_fixture() -> Callable[[str], str]:
    """The text of tests/fixtures/sacct/NAME, byte for byte (no newline translation)."""

    def read(name: str) -> str:
        with open(FIXTURES / "sacct" / name, encoding="utf-8", newline="") as handle:
            return handle.read()

    return read


@pytest.fixture
def sacct_row() -> Callable[..., dict[str, str]]:
    """A parsed sacct row (dict keyed by FIELDS, and AllocTRES when given): DEFAULT_ROW
    with overrides."""

    def build(**fields: str) -> dict[str, str]:
        unknown = set(fields) - set(ROW_FIELDS)
        assert not unknown, f"not sacct fields: {unknown}"
        return {**DEFAULT_ROW, **fields}

    return build


@pytest.fixture
def sacct_line() -> Callable[..., str]:
    """One line of sacct -P output in slurm.FIELDS order, with the \\x1f delimiter."""

    def build(**fields: str) -> str:
        row = {**DEFAULT_ROW, **fields}
        return DELIMITER.join(row[f] for f in FIELDS) + "\n"

    return build


@pytest.fixture
def make_job() -> Callable[..., SlurmJob]:
    """A finished 2-GPU, 4-core, 1-hour job on gpu1; keyword arguments override."""

    def build(**overrides: Any) -> SlurmJob:
        values: dict[str, Any] = dict(
            job_id="4242", job_id_raw="4242", name="train", cluster="gpueffdev",
            user="alice", account="physics", partition="gpu", state="COMPLETED",
            exit_code="0:0", elapsed_s=3600, timelimit_s=7200,
            start="2026-11-20T10:00:00", end="2026-11-20T11:00:00", ncpus=4, nnodes=1,
            nodelist="gpu1", total_cpu_s=7200.0, alloc_mem_bytes=4000 * 1024**2,
            max_rss_bytes=1000 * 1024**2, gpus=2,
        )
        values.update(overrides)
        return SlurmJob(**values)

    return build


@pytest.fixture
def make_gpu() -> Callable[..., model.GpuSummary]:
    """A sampled GPU summary: util/power/memory statistics from the given means."""

    def build(
        node: str = "gpu1", minor: int = 0, util: float | None = 50.0,
        util_max: float | None = None, power: float | None = 250.0,
        mem_used: float | None = 20 * GIB, **overrides: Any,
    ) -> model.GpuSummary:
        metrics: dict[str, dict[str, Any]] = {}
        if util is not None:
            peak = util if util_max is None else util_max
            metrics["util"] = {"mean": util, "min": 0.0, "max": peak, "last": util,
                               "samples": 3600, "seconds": 3599.0}
        if power is not None:
            metrics["power_w"] = {"mean": power, "min": 60.0, "max": power, "last": power,
                                  "samples": 3600, "seconds": 3599.0}
        if mem_used is not None:
            metrics["mem_used_bytes"] = {"mean": mem_used, "min": 0.0, "max": mem_used,
                                         "last": mem_used, "samples": 3600, "seconds": 3599.0}
        values: dict[str, Any] = dict(
            node=node, index=minor, minor=minor,
            uuid=f"GPU-00000000-0000-0000-0000-00000000000{minor}",
            name="NVIDIA H100 (simulated)", memory_total_bytes=80 * GIB, power_limit_w=700.0,
            samples=3600, sampled_s=3599.0, metrics=metrics, energy_j=900_000.0,
            energy_source="counter",
        )
        values.update(overrides)
        return model.GpuSummary(**values)

    return build


@pytest.fixture
def make_summary(make_gpu: Callable[..., model.GpuSummary]) -> Callable[..., model.NodeSummary]:
    """A node summary; `utils` gives one GPU per value (minor = position)."""

    def build(
        node: str = "gpu1", status: str = model.COMPLETE, utils: tuple[float | None, ...] = (50.0,),
        job_id: str = "4242", cluster: str = "gpueffdev", **overrides: Any,
    ) -> model.NodeSummary:
        values: dict[str, Any] = dict(
            cluster=cluster, job_id=job_id, node=node, status=status, user="alice",
            account="physics", partition="gpu", job_gpus="0,1", interval_s=1.0,
            started_at=BOOT, sampled_from=BOOT + 1, sampled_until=BOOT + 3600, ended_at=BOOT + 3601,
            gpus=[make_gpu(node=node, minor=i, util=u) for i, u in enumerate(utils)],
        )
        values.update(overrides)
        return model.NodeSummary(**values)

    return build


# --- the simulated NVML -------------------------------------------------------------------

# The devices of simulated node gpu1. NVML enumerates them in file order, which is
# deliberately not minor order: binding must go by minor number, never by NVML index.
SIM_DEVICES = [
    {"minor": 1, "uuid": "GPU-11111111-1111-1111-1111-111111111111", "name": "NVIDIA H100 (sim)",
     "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 0.5},
    {"minor": 2, "uuid": "GPU-22222222-2222-2222-2222-222222222222", "name": "NVIDIA H100 (sim)",
     "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 1.0},
    {"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": "NVIDIA H100 (sim)",
     "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 0.5},
    {"minor": 3, "uuid": "GPU-33333333-3333-3333-3333-333333333333", "name": "NVIDIA A100 (sim)",
     "memory_total_gib": 40, "power_limit_w": 400, "idle_power_w": 50, "sample_period_s": 0.5,
     "unsupported": ["nvmlDeviceGetTotalEnergyConsumption"]},
]


class SimNode:
    """A simulated node `gpu1` in tmp_path: devices file, state dir, and a config that
    points pynvml at the stand-in libnvidia-ml.so.1, whose clock the test sets (`now`)."""

    def __init__(self, root: Path, lib: Any, node: str = "gpu1") -> None:
        self.devices_file = root / "devices.json"
        self.state_dir = root / "state"
        self.lib = lib
        self.node = node
        self.config = Config(gpu_library=lib._name, sim_devices=str(self.devices_file),
                             sim_state_dir=str(self.state_dir))
        self.now = BOOT + 1000.0

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        standin.set_clock(self.lib, value)  # the library's clock follows the test's

    def clock(self) -> float:
        return self._now

    def write_devices(self, table: Any) -> None:
        """The devices file ({node: [spec, ...]} or a bare list). Its mtime stays BOOT: the
        simulated driver's load, where the library's clock and energy counter start."""
        self.devices_file.write_text(json.dumps(table), encoding="utf-8")
        os.utime(self.devices_file, (BOOT, BOOT))

    def session(self) -> GpuSession:
        """A GPU session through the real pynvml, its clocks the test's (the wall clock and
        the monotonic one alike: a test that steps one sets them apart)."""
        session = GpuSession(self.config)
        session.clock = session.steady = self.clock
        return session

    def write_state(
        self, minor: int | str, profile: dict[str, Any], started_at: float,
        ended_at: float | None = None, position: int = 0, prior_extra_j: float = 0.0,
        pid: int | None = None,
    ) -> Path:
        """What `gpueff-sim run` publishes for GPU `minor` (or a MIG UUID)."""
        path = Path(state_path(str(self.state_dir), self.node, minor))
        path.parent.mkdir(parents=True, exist_ok=True)
        state = state_record(parse_profile(profile), position, started_at, ended_at, prior_extra_j,
                             pid, "4242")
        path.write_text(json.dumps(state), encoding="utf-8")
        return path


def write_sim_config(root: Path, lib_path: str) -> Path:
    return write_config(root / "gpueff.toml", {
        "gpu": {"library": lib_path, "map_file": str(root / "gpu-map-%n.json")},
        "sim": {"devices": str(root / "devices.json"), "state_dir": str(root / "state")},
    })


@pytest.fixture
def sim_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    """Devices file + state dir in tmp_path, pynvml over the stand-in, its clock scripted.

    The devices file's mtime (the simulated "driver load") is BOOT; the library reads time
    from `sim_node.now`, so every reading is exact.
    """
    import pynvml

    path = standin.library_path()
    standin.load(pynvml, path)
    monkeypatch.setenv("GPUEFF_CONFIG", str(write_sim_config(tmp_path, path)))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")
    node = SimNode(tmp_path, pynvml.nvmlLib)
    node.write_devices({"gpu1": SIM_DEVICES})
    (node.state_dir / node.node).mkdir(parents=True)  # as cluster.sh makes it: per node
    yield node
    standin.set_clock(node.lib, None)
    standin.shut_down(node.lib)  # sessions a test left open end with it


# --- hooks: a site in tmp_path, and the sampler processes it starts -----------------------


@dataclass
class HookSite:
    root: Path
    config_path: Path
    spool_root: Path  # for node gpu1
    store_path: Path
    log_path: Path  # for node gpu1
    monkeypatch: pytest.MonkeyPatch
    pids: list[int] = field(default_factory=list)

    def export(self, env: dict[str, str]) -> dict[str, str]:
        """Put `env` in os.environ too, as slurmd does: the sampler inherits the prolog's
        process environment. Returns env."""
        for name, value in env.items():
            self.monkeypatch.setenv(name, value)
        return env

    def is_running(self, pid: int) -> bool:
        return runs_under(pid, self.root)

    def settled(self, timeout: float = 15.0) -> None:
        wait_delivered([self.spool_root], timeout)

    def stored(self, job_id: str = "4242") -> list[model.NodeSummary]:
        """What the store holds for the job once delivery settled ([] when there is no
        store at all)."""
        self.settled()
        if not self.store_path.exists():
            return []
        from slurm_gpu_eff.store.sqlite import SqliteStore

        store = SqliteStore(str(self.store_path), readonly=True)
        try:
            return store.node_summaries(job_id)
        finally:
            store.close()

    def configure(self, **sections: dict[str, Any]) -> None:
        """Rewrite the site's config with some keys changed (see write_site_config)."""
        write_site_config(self.root, **sections)

    def env(self, **overrides: str) -> dict[str, str]:
        """What slurmd gives a prolog/epilog for job 4242 on gpu1 with GPUs 0 and 2."""
        env = {
            "SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "gpu1", "SLURM_JOB_GPUS": "0,2",
            "SLURM_CLUSTER_NAME": "gpueffdev", "SLURM_JOB_USER": "alice",
            "SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_PARTITION": "gpu",
        }
        env.update(overrides)
        return env

    def write_state(self, minor: int, metrics: dict[str, float], started_at: float) -> None:
        """Make simulated GPU `minor` run `metrics` for an hour from `started_at` (epoch s)."""
        path = Path(state_path(str(self.root / "state"), "gpu1", minor))
        path.parent.mkdir(parents=True, exist_ok=True)
        profile = parse_profile({"phases": [{"seconds": 3600, "gpus": {"*": metrics}}]})
        path.write_text(json.dumps(state_record(profile, 0, started_at, job_id="4242")),
                        encoding="utf-8")

    def job_dir(self, job_id: str = "4242") -> Path:
        return self.spool_root / "jobs" / job_id

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8") if self.log_path.exists() else ""

    def sampler_pid(self, job_id: str = "4242") -> int:
        """The job's sampler (the shell prolog's writes its own pid file: waited for)."""
        self.wait_for(self.job_dir(job_id) / "sampler.pid")
        pid = int((self.job_dir(job_id) / "sampler.pid").read_text().split()[0])
        self.pids.append(pid)
        return pid

    def wait_for(self, path: Path, timeout: float = 15.0) -> None:
        """Poll (20 ms) until `path` exists: the sampler's first checkpoint, say."""
        end = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < end, f"{path} did not appear within {timeout} s"
            time.sleep(0.02)


def wait_delivered(spool_roots: list[Path], timeout: float = 15.0) -> bool:
    """Until the deliverers the epilogs started in the background have done their work:
    nothing waits in any outbox or in flight, and nobody holds a spool. False on timeout."""
    from slurm_gpu_eff.node.spool import Spool
    from slurm_gpu_eff.store.deliver import spool_status

    spools = [Spool(str(root)) for root in spool_roots]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(s.pending or s.inflight or s.deliverer for s in map(spool_status, spools)):
            return True
        time.sleep(0.02)
    return False


def runs_under(pid: int, root: Path) -> bool:
    """True while `pid` is alive (not a zombie) with an argument under `root`: a process
    this test started, not a recycled pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return False
    return any(a.startswith(str(root).encode()) for a in args)


def write_site_config(root: Path, **sections: dict[str, Any]) -> Path:
    """A gpueff.toml for the sim backend, everything under root; sections override keys
    (values as TOML types: numbers as numbers, str for strings, bool for true/false)."""
    values: dict[str, dict[str, Any]] = {
        # The GPU map here, never the host's /var/lib (the sampler runs as root in tests too).
        "gpu": {"library": standin.library_path(), "map_file": str(root / "gpu-map-%n.json")},
        "sim": {"devices": str(root / "devices.json"), "state_dir": str(root / "state")},
        "sampler": {"interval_s": 0.2, "checkpoint_s": 0.5},
        "hooks": {"python": sys.executable, "timeout_s": 10},
        "spool": {"dir": str(root / "spool" / "%n")},
        "store": {"path": str(root / "store" / "gpueff.db")},
        "log": {"file": str(root / "log" / "%n.log")},
        # No AdminComment mirror (on by default): a deliverer here never reaches a real
        # Slurm's job 4242. test_mirror.py checks the mirror with a fake Slurm.
        "slurm": {"admin_comment": False},
    }
    for name, keys in sections.items():
        values.setdefault(name, {}).update(keys)
    return write_config(root / "gpueff.toml", values)


@pytest.fixture
def hook_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HookSite]:
    """GPUEFF_CONFIG -> a sim site in tmp_path. Every sampler started is killed and reaped
    at teardown, and the SIGALRM handler the hooks install is put back."""
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"gpu1": SIM_DEVICES}), encoding="utf-8")
    config = write_site_config(tmp_path)
    monkeypatch.setenv("GPUEFF_CONFIG", str(config))
    site = HookSite(
        root=tmp_path, config_path=config, spool_root=tmp_path / "spool" / "gpu1",
        store_path=tmp_path / "store" / "gpueff.db", log_path=tmp_path / "log" / "gpu1.log",
        monkeypatch=monkeypatch,
    )
    for name in [n for n in os.environ if n.startswith("SLURM")]:
        monkeypatch.delenv(name)  # a suite run inside a Slurm job must not leak its job in
    alarm = signal.getsignal(signal.SIGALRM)
    yield site
    signal.signal(signal.SIGALRM, alarm)
    for pid_file in tmp_path.glob("spool/*/jobs/*/sampler.pid"):
        try:
            site.pids.append(int(pid_file.read_text().split()[0]))
        except (OSError, ValueError):
            pass
    for pid in set(site.pids):
        if runs_under(pid, tmp_path):
            os.kill(pid, signal.SIGKILL)
        try:  # samplers started in-process are our children: reap them
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    # The locators the shell prolog's samplers wrote for this site's config (spool.py)
    shutil.rmtree(LOCATOR_ROOT + str(tmp_path), ignore_errors=True)


# --- the store engines --------------------------------------------------------------------

ENGINES = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One private PostgreSQL server for the session (tests/pg.py), or skip where the
    machine has none; `make test` (GPUEFF_REQUIRE_CLUSTER=1) fails instead of skipping."""
    from tests import pg

    if not pg.available():
        if os.environ.get("GPUEFF_REQUIRE_CLUSTER"):
            pytest.fail("PostgreSQL is not installed: run scripts/install-deps.sh")
        pytest.skip("PostgreSQL is not installed (scripts/install-deps.sh installs it)")
    with pg.PgServer() as server:
        yield server


def fresh_schema(url: str) -> str:
    """`url` narrowed to a new, empty schema of its database: each test its own store."""
    import uuid

    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"create schema {schema}")
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@pytest.fixture(params=ENGINES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new, empty store, once per engine."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store' / 'gpueff.db'}"
    return fresh_schema(request.getfixturevalue("pg_server").url)


def store_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """Rows of a raw query on a store, whichever its engine (what a test checks beyond
    the Store interface: the GPU rows admin reports will read)."""
    from tests import pg

    return pg.rows(url, query)
