"""50 jobs end on 5 nodes while the store is down (PostgreSQL: the server stopped; SQLite:
the file held locked by a reader's exclusive transaction): every epilog returns, nothing
is lost, `gpueff spool status` lists what waits, and once the database is back all 50
summaries arrive exactly once, by themselves: the detached deliverer, become the spool's
retrier, delivers them, with no new job and no command. Real epilog shims in separate
processes, as in test_delivery_stress (no Slurm job needed), run where the cluster's
epilogs run: in its release's root, by its Python, where it has one."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts.demo import in_cluster
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.store.deliver import spool_status
from tests.configfile import write_config
from tests.integration.conftest import Cluster
from tests.pg import StoreSite
from tests.unit.conftest import wait_delivered

# Its bar (no epilog over 0.5 s) needs the CPUs to itself; the cluster is only where it runs.
pytestmark = [pytest.mark.serial, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
EPILOG = REPO / "epilog" / "gpueff-epilog"
# 50 jobs ending on 5 nodes. On a site each node runs its own epilogs; here all share this
# machine's cores, so as many run at once as there are cores: more would time the queue
# for a core (10 at once on 2 cores: 0.5-0.9 s each), not an epilog.
NODES, JOBS_PER_NODE, AT_ONCE = 5, 10, os.cpu_count() or 1
DOWN_AFTER_S = 3.0  # the store stays down this long after the last epilog: retries meet it


def test_fifty_jobs_ending_with_the_store_down_are_delivered_once_it_is_back(
    tmp_path: Path, store_site: StoreSite, cluster: Cluster,
) -> None:
    config = write_config(tmp_path / "gpueff.toml", {
        "spool": {"dir": f"{tmp_path}/spool/%n", "retry_s": 0.3, "retry_max_s": 1},
        **store_site.sections(),
        "log": {"file": f"{tmp_path}/log/%n.log"},
        "hooks": {"python": cluster.python},
    })
    store_site.create()  # the store existed before it went down
    base = {"PATH": os.environ["PATH"], "GPUEFF_CONFIG": str(config),
            "GPUEFF_PYTHON": cluster.python, "SLURM_CLUSTER_NAME": "down",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0"}
    nodes = [f"n{n}" for n in range(NODES)]
    jobs = [(node, str(2000 + n * JOBS_PER_NODE + j))
            for j in range(JOBS_PER_NODE) for n, node in enumerate(nodes)]
    roots = [tmp_path / "spool" / node for node in nodes]

    def epilog(job: tuple[str, str]) -> tuple[int, float]:
        node, job_id = job
        started = time.perf_counter()
        done = subprocess.run(in_cluster("root", str(EPILOG)), env={
            **base, "SLURMD_NODENAME": node, "SLURM_JOB_ID": job_id}, timeout=60)
        return done.returncode, time.perf_counter() - started

    with store_site.down():
        with ThreadPoolExecutor(AT_ONCE) as pool:
            ran = list(pool.map(epilog, jobs))
        assert [code for code, _ in ran] == [0] * len(jobs)
        time.sleep(DOWN_AFTER_S)
        # Nothing delivered, nothing lost: every summary waits in its node's spool...
        statuses = {node: spool_status(Spool(str(root))) for node, root in zip(nodes, roots, strict=True)}
        waiting = {node: s.pending + s.inflight for node, s in statuses.items()}
        assert sum(map(len, waiting.values())) == len(jobs), waiting
        assert not any(s.dead or s.corrupt for s in statuses.values())
        # ...and `gpueff spool status` says which, node by node.
        for node in nodes:
            shown = subprocess.run(in_cluster("root", "gpueff", "spool", "status", "--node", node),
                                   env=base, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            counts = re.search(r"(\d+) waiting, (\d+) in flight", shown.stdout)
            assert counts and int(counts[1]) + int(counts[2]) == JOBS_PER_NODE, shown.stdout
            for job_node, job_id in jobs:
                if job_node == node:
                    assert f"-{job_id}-{node}" in shown.stdout, (job_id, shown.stdout)
    # The store is back. No job, no command: the spools' retriers deliver by themselves.
    assert wait_delivered(roots, timeout=120), [spool_status(Spool(str(r))) for r in roots]
    rows = store_site.rows("select node, job_id, count(*) from node_summaries group by node, job_id")
    assert len(rows) == len(jobs) == 50
    assert {count for _, _, count in rows} == {1}  # none twice
    assert {(node, job) for node, job, _ in rows} == set(jobs)
    assert not any(s.dead or s.corrupt for s in (spool_status(Spool(str(r))) for r in roots))
    logs = "".join(p.read_text() for p in (tmp_path / "log").glob("*.log"))
    assert "Traceback" not in logs and "rejected" not in logs, logs[-2000:]
    walls = [wall for _, wall in ran]
    print(f"{store_site.engine}, store down: 50 epilogs, {AT_ONCE} at a time: epilog wall time "
          f"median {statistics.median(walls) * 1000:.0f} ms, max {max(walls) * 1000:.0f} ms")
