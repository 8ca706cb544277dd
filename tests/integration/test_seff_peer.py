"""Slurm's own seff (the release's, from Debian's source package, run as it is) beside gpueff on
the same jobs: CPU and memory efficiency must agree (issue 8, finding 6 and its "done
when"). seff rounds a job's CPU time to whole seconds and gpueff does not: that, and
seff's two decimals, is the only difference allowed."""

from __future__ import annotations

import re

import pytest

from slurm_gpu_eff.slurm.records import parse_tres
from tests.integration.conftest import Cluster

# CPU and memory efficiency come from sacct, but `gpueff` reads each job's GPU figures
# from the store on the way: it runs on both engines.
pytestmark = [pytest.mark.cluster, pytest.mark.cluster_store]

PY = "/usr/bin/python3"
# Work that holds MiB of memory (touched, so it is resident) and burns CPU for seconds.
HOLD = (f"{PY} -c \"import time; x = bytearray({{mib}} << 20); x[::4096] = b'1' * len(x[::4096]); "
        "t = time.process_time()\n"
        "while time.process_time() - t < {cpu}: pass\n"
        "time.sleep({idle})\"")

SHAPES = {
    "one task": ("", ["--mem=200M"], HOLD.format(mib=60, cpu=3, idle=4)),
    "a multi-task step": ("", ["--mem=1000M", "-n", "4"],
                          "srun -n 4 " + HOLD.format(mib=150, cpu=1, idle=6)),
    "several steps": ("", ["--mem=500M"],
                      "srun -n 1 " + HOLD.format(mib=40, cpu=2, idle=2) + "\n"
                      "srun -n 1 " + HOLD.format(mib=120, cpu=1, idle=3)),
    "two nodes": ("", ["--mem=300M", "-N", "2", "--ntasks-per-node=1"],
                  "srun " + HOLD.format(mib=80, cpu=2, idle=4)),
    "an array": ("_1", ["--mem=200M", "--array=1-2"], HOLD.format(mib=50, cpu=2, idle=3)),
}


def seff(cluster: Cluster, job: str) -> tuple[float, float, float]:
    """seff's CPU efficiency, memory efficiency (percent) and core-walltime (s)."""
    done = cluster.run(["seff", job], timeout=60)  # the cluster's release's seff (cluster.sh)
    assert done.code == 0, done.err
    cpu = re.search(r"CPU Efficiency: ([\d.]+)% of ([\d:-]+) core-walltime", done.out)
    mem = re.search(r"Memory Efficiency: ([\d.]+)% of", done.out)
    assert cpu and mem, done.out
    return float(cpu[1]), float(mem[1]), _seconds(cpu[2])


def _seconds(text: str) -> float:
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days) * 86400 if days else 0) + h * 3600 + m * 60 + s


@pytest.fixture(scope="module")
def jobs(cluster: Cluster) -> dict[str, str]:
    seff_cmd = cluster.dir / "bin" / "seff"  # cluster.sh runs the release's own seff through it
    assert seff_cmd.is_file(), f"{seff_cmd} is missing: scripts/cluster.sh up writes it"
    started = {}
    for name, (suffix, args, body) in SHAPES.items():
        job = cluster.submit("alice", body, "--gres=gpu:1", "-J", name.replace(" ", "-"), *args)
        started[name] = job + suffix
    for name, job in started.items():
        assert cluster.wait_done(job.split("_")[0], timeout=180) == "COMPLETED", (name, cluster.output(job))
    return started


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cpu_and_memory_efficiency_agree_with_seff(
    cluster: Cluster, jobs: dict[str, str], shape: str,
) -> None:
    job = jobs[shape]
    cpu, mem, core_walltime = seff(cluster, job)
    data = cluster.gpueff(job, "alice", "--json").json()
    assert core_walltime == data["elapsed_s"] * data["cpus"], (shape, core_walltime, data)
    # seff counts CPU time in whole seconds (rounded), gpueff to the millisecond: rounded
    # as seff does, gpueff's own CPU time gives seff's figure to its two decimals...
    cpu_s = data["cpu_efficiency"] * core_walltime / 100
    assert abs(100 * round(cpu_s) / core_walltime - cpu) <= 0.006, (shape, cpu_s, cpu)
    # ...and unrounded it differs by that rounding alone: half a CPU-second at most
    assert abs(data["cpu_efficiency"] - cpu) <= 0.5 + 100 * 0.5 / core_walltime, (shape, data, cpu)
    assert abs(data["mem_efficiency"] - mem) <= 0.5, (shape, data["mem_efficiency"], mem)
    if shape == "a multi-task step":  # 4 tasks x 150 MiB: all four counted, not one task's peak
        # of what Slurm allocated: 1000 MiB on one node, 2000 MiB where it spread the tasks
        # over two (--mem is per node; seen on a busy cluster)
        tres = cluster.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=AllocTRES"]).out.strip()
        alloc_mib = parse_tres(tres)["mem"] / 2**20
        assert data["mem_efficiency"] > 100 * 3 * 150 / alloc_mib, (data["mem_efficiency"], alloc_mib)
