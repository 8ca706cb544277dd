"""A thousand running jobs send live copies: each store engine keeps up (issue 8).

With `live_s = 45` (the default), 1,000 running jobs send 22 live copies a second to the
store. Here 25 simulated nodes with 40 running jobs each post two rounds of live copies,
each round in a quarter of a live period (so at four times that rate), through the
deliverer the samplers start (`python -m slurm_gpu_eff.store.deliver SPOOL --once`; on a
node many such starts collapse into the one that holds the spool's lock). Checked: every
job's newest copy is what the store holds, once, and no spool keeps anything or logs an
error. The time each round took to reach the store is printed, not asserted; `make
bench` measures the rates.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.model import RUNNING, GpuSummary, NodeSummary
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.store import open_store
from tests import pg
from tests.configfile import write_config
from tests.unit.conftest import wait_delivered

from .conftest import fail_or_skip

pytestmark = [pytest.mark.heavy]  # CPU-bound, a store of its own: beside the cluster tests, at low priority

NODES, JOBS_PER_NODE = 25, 40  # 1,000 running jobs
LIVE_S = Config().live_s
ROUND_S = LIVE_S / 4  # each round of 1,000 copies in a quarter of a live period


@pytest.fixture(params=pg.ENGINES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield pg.sqlite_url(tmp_path / "store.db")
        return
    why = pg.unavailable()
    if why:
        fail_or_skip(why)  # make test (GPUEFF_REQUIRE_CLUSTER) fails: CI must have it
    with pg.PgServer() as server:
        yield server.url


def deliverer(spool: Spool, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """What LiveDelivery starts (node/live.py: spawn_delivery)."""
    return subprocess.Popen([sys.executable, "-I", "-m", "slurm_gpu_eff.store.deliver", spool.root, "--once"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def live_copy(node: str, job: str, until: float) -> NodeSummary:
    gpu = GpuSummary(node=node, index=0, minor=0, uuid=f"GPU-{node}", name="sim",
                     memory_total_bytes=80 * 1024**3, power_limit_w=700.0, samples=int(until),
                     sampled_s=until, metrics={"util": {"mean": 50.0, "max": 90.0}})
    return NodeSummary(cluster="stress", job_id=job, node=node, status=RUNNING, user="alice",
                       started_at=1.0, sampled_from=1.0, sampled_until=until,
                       run_started_at=1.0, gpus=[gpu])


def test_a_thousand_running_jobs_live_copies_reach_each_engine(tmp_path: Path, store_url: str) -> None:
    conf = write_config(tmp_path / "gpueff.toml", {
        "store": {"url": store_url}, "log": {"file": f"{tmp_path}/log/%n.log"},
        "slurm": {"admin_comment": False},  # its jobs are not Slurm's
        "spool": {"retry_s": 0.5, "retry_max_s": 1},
    })
    env = {"PATH": "/usr/bin:/bin", "GPUEFF_CONFIG": str(conf)}
    spools = {f"n{n:02d}": Spool(str(tmp_path / "spool" / f"n{n:02d}")) for n in range(NODES)}
    jobs = [(node, str(10_000 + n * JOBS_PER_NODE + j))
            for j in range(JOBS_PER_NODE) for n, node in enumerate(spools)]
    open_store(store_url).close()  # the schema, as the first delivery on a site makes it
    for round_no, until in enumerate((100.0, 200.0), 1):
        started = time.monotonic()
        working: dict[str, subprocess.Popen[bytes]] = {}
        done: list[subprocess.Popen[bytes]] = []
        for i, (node, job) in enumerate(jobs):
            spools[node].post(live_copy(node, job, until))
            # Each sampler starts a deliverer after its post; one that finds the node's
            # spool held leaves at once, the holder taking its copy: so one at a time here.
            if node not in working or working[node].poll() is not None:
                done += [working[node]] if node in working else []
                working[node] = deliverer(spools[node], env)
            time.sleep(max(0.0, started + ROUND_S * (i + 1) / len(jobs) - time.monotonic()))
        # A copy posted just as its node's deliverer finished waits for the node's next
        # live copy, as on a site: that next post, here, is one more deliverer a node.
        done += list(working.values())
        done += [deliverer(spool, env) for spool in spools.values()]
        for child in done:
            assert child.wait(timeout=120) == 0
        assert wait_delivered([Path(s.root) for s in spools.values()], timeout=120)
        took = time.monotonic() - started
        print(f"round {round_no}: 1,000 live copies posted in {ROUND_S:.1f} s, all in the "
              f"{pg.engine_of(store_url)} store after {took:.1f} s "
              f"({len(jobs) / took:.0f}/s; 1,000 jobs at live_s={LIVE_S:g} need {len(jobs) / LIVE_S:.0f}/s)")
        stored = pg.rows(store_url, "select job_id, node, sampled_until from node_summaries")
        assert len(stored) == len(jobs)  # one row a job: copies replace, never add
        assert {(node, job) for job, node, _ in stored} == set(jobs)
        assert {until_ for _, _, until_ in stored} == {until}  # the newest copy, everywhere
    logs = "".join(p.read_text() for p in (tmp_path / "log").glob("*.log"))
    assert "unreachable" not in logs and "failed" not in logs and "rejected" not in logs, logs[-2000:]
