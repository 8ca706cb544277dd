"""`make demo`: submit a few simulated GPU workloads as real users, wait, show `gpueff`.

Runs against the development cluster (`make cluster` has brought it up). Each job runs
`gpueff-sim run PROFILE` inside Slurm, so the prolog, sampler, epilog and store all do
their real work; only the GPUs are simulated.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = [  # (user, profile, sbatch options, what it shows)
    ("alice", "healthy-training.json", ["--gres=gpu:1"], "a well-fed training job"),
    ("bob", "data-starved.json", ["--gres=gpu:1"], "a job starving on its input pipeline"),
    ("alice", "one-idle-gpu.json", ["--gres=gpu:2"], "a job that asked for 2 GPUs, used 1"),
]


def cluster_env() -> dict[str, str]:
    """The environment `make -s cluster-env` gives a shell (the integration tests use it too)."""
    text = subprocess.run(
        ["bash", "-c", f'eval "$(bash {REPO}/scripts/cluster.sh env)" && env -0'],
        capture_output=True, text=True, check=True,
    ).stdout
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


def in_cluster(user: str, *command: str) -> list[str]:
    """COMMAND run as USER (root or a test user) against the running cluster, in its
    release's root where it has one: `scripts/cluster.sh as`, the one way in."""
    return ["bash", str(REPO / "scripts" / "cluster.sh"), "as", user, *command]


def as_user(user: str, env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_cluster(user, *command), capture_output=True, text=True, env=env,
                          check=False)


def settle(user: str, env: dict[str, str], job_id: str, timeout: float = 30) -> None:
    """Until the job's final figures are in: its epilog's delivery and the figures in its
    accounting follow the job's end by a few seconds (the report would say it shows a
    live snapshot)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done = as_user(user, env, "gpueff", job_id, "--json")
        try:
            status = json.loads(done.stdout).get("gpu_status")
        except ValueError:
            status = None
        if status in ("complete", "missing"):
            return
        time.sleep(1)


def main() -> int:
    env = cluster_env()
    work = Path(env["GPUEFF_CLUSTER_DIR"]) / "demo"
    work.mkdir(exist_ok=True)
    work.chmod(0o1777)
    sim = Path(env["GPUEFF_VENV"]) / "bin" / "gpueff-sim"  # the release's own venv
    submitted = []
    for user, profile, options, what in JOBS:
        copy = work / profile
        shutil.copy(REPO / "examples" / "profiles" / profile, copy)
        copy.chmod(0o644)
        name = profile.removesuffix(".json")
        done = as_user(user, env, "sbatch", "--parsable", "--mem=200M", "-J", name,
                       f"--output={work}/%j.out", *options, "--wrap", f"{sim} run {copy}")
        if done.returncode != 0:
            print(f"demo: sbatch failed for {user}: {done.stderr.strip()}", file=sys.stderr)
            return 1
        job_id = done.stdout.strip().split(";")[0]
        submitted.append((user, job_id, what))
        print(f"submitted job {job_id} as {user}: {what} ({profile})")
    print("waiting for the jobs to finish (about 40 s)...", flush=True)
    deadline = time.monotonic() + 300
    ids = ",".join(j for _, j, _ in submitted)
    while time.monotonic() < deadline:
        queue = as_user("root", env, "squeue", "-h", "-j", ids)
        if not queue.stdout.strip():
            break
        time.sleep(2)
    for user, job_id, what in submitted:
        settle(user, env, job_id)
        print(f"\n===== gpueff {job_id}  ({what}, run as {user}) =====", flush=True)
        report = as_user(user, env, "gpueff", job_id)
        print(report.stdout or report.stderr, end="", flush=True)
    print(f"\nTry it yourself: scripts/cluster.sh as {submitted[0][0]} gpueff {submitted[0][1]} --json"
          + ("" if env.get("GPUEFF_SLURM_ROOT") else " (or: eval \"$(make -s cluster-env)\"; gpueff ...)"))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
