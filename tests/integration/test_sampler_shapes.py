"""Job shapes Slurm 22.05 cannot hand our dev cluster, driven through the real hooks:
a MIG slice (SLURM_JOB_GPUS naming a MIG instance) and a 7-day job on a fast clock.

The prolog, sampler, `gpueff-sim run` and epilog run as real processes; only the
environment Slurm would give them is written by the test. Each runs on both store engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.configfile import write_config
from tests.pg import StoreSite, as_json
from tests.unit.conftest import wait_delivered

pytestmark = [pytest.mark.heavy]  # CPU-bound, a store of its own: beside the cluster tests, at low priority

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "prolog" / "gpueff-prolog"
EPILOG = REPO / "epilog" / "gpueff-epilog"
SIM = REPO / ".venv" / "bin" / "gpueff-sim"
STANDIN = REPO / "build" / "nvml" / "current" / "libnvidia-ml.so.1"
MIG = "MIG-5ec0e2c4-1b0e-5a3e-9d7e-2f4a3c1b0a11"
GIB = 1024**3


def site(tmp_path: Path, store: StoreSite, devices: list[dict[str, Any]],
         **sampler: float) -> dict[str, str]:
    (tmp_path / "devices.json").write_text(json.dumps({"n1": devices}))
    (tmp_path / "state" / "n1").mkdir(parents=True)
    settings = {"interval_s": 0.5, "checkpoint_s": 1, "live_s": 3600, **sampler}
    scale = settings.pop("time_scale", 1)
    config = write_config(tmp_path / "gpueff.toml", {
        "gpu": {"library": str(STANDIN)},
        "sim": {"devices": f"{tmp_path}/devices.json", "state_dir": f"{tmp_path}/state", "time_scale": scale},
        "sampler": settings,
        "spool": {"dir": f"{tmp_path}/spool/%n"},
        **store.sections(),
        "log": {"file": f"{tmp_path}/log/%n.log"},
    })
    return {
        "PATH": os.environ["PATH"], "GPUEFF_CONFIG": str(config),
        "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1", "SLURM_CLUSTER_NAME": "dev",
        "SLURM_JOB_USER": "alice",
    }


def stored(tmp_path: Path, store: StoreSite) -> dict[str, Any]:
    """The job's summary in the store, once the deliverer the epilog started is done."""
    assert wait_delivered([tmp_path / "spool" / "n1"], timeout=120), "the summary was not delivered"
    ((body,),) = store.rows("select body from node_summaries where job_id = '77'")
    return dict(as_json(body))


def wait_for(path: Path, what: str, timeout: float = 60) -> None:
    """Until `path` exists: a Python process starting on a loaded machine (4 workers on
    2 cores) takes seconds, not the tenth of one it takes alone."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.05)


def sampler_pid(tmp_path: Path) -> int:
    pid_file = tmp_path / "spool" / "n1" / "jobs" / "77" / "sampler.pid"
    wait_for(pid_file, "the prolog started no sampler")
    return int(pid_file.read_text().split()[0])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_mig_slice_is_measured_by_gpm_with_no_utilisation(
    tmp_path: Path, store_site: StoreSite,
) -> None:
    devices = [{"minor": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "name": "H100",
                "gpm": True, "mig": [{"gi_id": 3, "uuid": MIG, "memory_total_gib": 10},
                                     {"gi_id": 5, "uuid": MIG[:-2] + "22", "memory_total_gib": 20}]}]
    env = site(tmp_path, store_site, devices) | {"SLURM_JOB_GPUS": MIG}
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"phases": [{"seconds": 6, "gpus": {"*": {
        "util": 90, "sm_active": 40, "tensor_active": 25, "mem_used_gib": 6}}}]}))
    subprocess.run([str(PROLOG)], env=env, check=True)
    subprocess.run([str(SIM), "run", str(profile)], env=env, check=True, capture_output=True)
    subprocess.run([str(EPILOG)], env=env, check=True)

    summary = stored(tmp_path, store_site)
    assert summary["status"] == "complete"
    (gpu,) = summary["gpus"]
    assert gpu["uuid"] == MIG and gpu["mig_gi_id"] == 3 and gpu["minor"] == 0
    assert gpu["memory_total_bytes"] == 10 * GIB
    assert gpu["metrics"]["mem_used_bytes"]["max"] == 6 * GIB
    assert "util" not in gpu["metrics"]  # NVML has no utilisation for a MIG slice
    state = json.loads((tmp_path / "state" / "n1" / f"{MIG}.json").read_text())
    t0, t1 = summary["sampled_from"], summary["sampled_until"]
    busy = max(0.0, min(t1, state["ended_at"]) - max(t0, state["started_at"]))
    assert abs(gpu["metrics"]["sm_active"]["mean"] - 40 * busy / (t1 - t0)) <= 1.0
    assert abs(gpu["metrics"]["tensor_active"]["mean"] - 25 * busy / (t1 - t0)) <= 1.0


def test_seven_days_at_four_gpus_in_bounded_memory_and_a_small_summary(
    tmp_path: Path, store_site: StoreSite,
) -> None:
    day = 86400
    devices = [{"minor": m, "uuid": f"GPU-bbbbbbbb-0000-0000-0000-00000000000{m}", "gpm": True,
                "name": "H100", "sample_buffer": 120} for m in range(4)]
    # One simulated minute per poll; 4 simulated hours per wall second: 7 days in 42 s.
    env = site(tmp_path, store_site, devices, interval_s=60, time_scale=14400) | {
        "SLURM_JOB_GPUS": "0-3"}
    profile = tmp_path / "week.json"
    profile.write_text(json.dumps({"phases": [{"seconds": 7 * day, "gpus": {"*": {
        "util": {"low": 10, "high": 90, "period_s": day, "duty": 0.5},
        "sm_active": 50, "power_w": 400, "mem_used_gib": 40}}}]}))
    subprocess.run([str(PROLOG)], env=env, check=True)
    pid = sampler_pid(tmp_path)
    workload = subprocess.Popen([str(SIM), "run", str(profile)], env=env, stdout=subprocess.DEVNULL)
    hour_in = time.monotonic() + 1.0  # about 1 simulated hour in (after start-up)
    # The sampler writes its pid file before it loads the library and binds the GPUs:
    # its first measure of memory is taken once it sampled and checkpointed, not sooner.
    wait_for(tmp_path / "spool" / "n1" / "jobs" / "77" / "summary.json", "the sampler made no checkpoint")
    time.sleep(max(0.0, hour_in - time.monotonic()))
    rss_hour = rss_kib(pid)
    assert workload.wait(timeout=120) == 0
    rss_week = rss_kib(pid)
    subprocess.run([str(EPILOG)], env=env, check=True)

    assert rss_week - rss_hour <= 5 * 1024, (rss_hour, rss_week)
    summary = stored(tmp_path, store_site)
    size = len(json.dumps(summary, separators=(",", ":")))
    print(f"7-day job, 4 GPUs: RSS {rss_hour} KiB after 1 h, {rss_week} KiB after 7 days; "
          f"summary {size} bytes")
    assert size < 200 * 1024, size
    t0, t1 = summary["sampled_from"], summary["sampled_until"]
    assert t1 - t0 >= 7 * day * 0.99
    for gpu in summary["gpus"]:
        timeline = gpu["timeline"]
        assert len(timeline["points"]) <= 720
        assert timeline["bucket_s"] * len(timeline["points"]) >= 7 * day * 0.99
        # A square wave of 10/90 over whole days averages 50. At this speed the driver's
        # buffer (120 windows: 20 simulated s) holds a third of each 60 s poll interval, or
        # less when the sampler falls behind on 2 cores: the mean is of a subsample, and
        # within 2 points in most runs, 2.4 in one seen; 5 is the bound that is not luck.
        assert abs(gpu["metrics"]["util"]["mean"] - 50) <= 5.0
        # At 4.2 ms of wall time per poll the sampler falls behind on 2 cores and skips
        # polls rather than bursting; each poll still weighs the time it stands for.
        assert gpu["samples"] >= 1000
