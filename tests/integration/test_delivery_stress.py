"""Issue 8: many epilogs at once on many nodes, one store. Real epilog shims in separate
processes (simulated nodes on this machine: a spool each), each posting its summary and
starting a detached deliverer: every summary arrives once, none twice, none rejected,
nothing left in any spool. (No Slurm needed: the environment is what slurmd gives.)
On both store engines: the SQLite file, and a private PostgreSQL server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.store.deliver import spool_status
from tests.configfile import write_config
from tests.pg import StoreSite
from tests.unit.conftest import wait_delivered

pytestmark = [pytest.mark.heavy]  # CPU-bound, a store of its own: beside the cluster tests, at low priority

REPO = Path(__file__).resolve().parents[2]
EPILOG = REPO / "epilog" / "gpueff-epilog"
NODES, JOBS_PER_NODE, AT_ONCE = 25, 20, 25  # 500 epilogs, 25 running at any moment


def test_five_hundred_epilogs_deliver_five_hundred_summaries(
    tmp_path: Path, store_site: StoreSite,
) -> None:
    config = write_config(tmp_path / "gpueff.toml", {
        "spool": {"dir": f"{tmp_path}/spool/%n", "retry_s": 0.5, "retry_max_s": 1},
        **store_site.sections(),
        "log": {"file": f"{tmp_path}/log/%n.log"},
        # The bound a site may set at most: at low priority beside the cluster tests, 25
        # interpreters starting at once on 2 cores have taken over 10 s (the default), and
        # an epilog that gives up posts nothing (the report names the node as missing);
        # this test is about delivery, so it gives them time and says if any gave up.
        "hooks": {"python": sys.executable, "timeout_s": 18},
    })
    base = {"PATH": os.environ["PATH"], "GPUEFF_CONFIG": str(config),
            "GPUEFF_PYTHON": sys.executable, "SLURM_CLUSTER_NAME": "stress",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0"}
    jobs = [(f"n{n:02d}", str(1000 + n * JOBS_PER_NODE + j))
            for j in range(JOBS_PER_NODE) for n in range(NODES)]
    started = time.monotonic()
    running: list[subprocess.Popen[bytes]] = []
    for node, job in jobs:
        while len(running) >= AT_ONCE:
            running = [p for p in running if p.poll() is None]
            time.sleep(0.005)
        env = {**base, "SLURMD_NODENAME": node, "SLURM_JOB_ID": job}
        running.append(subprocess.Popen([str(EPILOG)], env=env))
    for process in running:
        assert process.wait(timeout=60) == 0
    roots = [tmp_path / "spool" / f"n{n:02d}" for n in range(NODES)]
    assert wait_delivered(roots, timeout=120), "the spools did not empty"
    elapsed = time.monotonic() - started
    statuses = [spool_status(Spool(str(root))) for root in roots]
    assert not any(s.dead or s.corrupt for s in statuses)
    rows = store_site.rows("select node, job_id, count(*) from node_summaries group by node, job_id")
    logs = "".join(p.read_text() for p in sorted((tmp_path / "log").glob("*.log")))
    lost = sorted(set(jobs) - {(node, job) for node, job, _ in rows})
    said = [line for line in logs.splitlines() if any(f"job={job} " in line for _, job in lost)]
    assert not lost, f"{len(lost)} not in the store: {lost[:10]}; their log lines: {said[:20]}"
    assert len(rows) == len(jobs) == 500
    assert {count for _, _, count in rows} == {1}  # none twice
    assert "failed" not in logs and "unreachable" not in logs, logs[-2000:]
    print(f"{store_site.engine}: 500 epilogs on {NODES} nodes, {AT_ONCE} at a time: all delivered "
          f"in {elapsed:.1f} s ({500 / elapsed:.0f} summaries/s)")
