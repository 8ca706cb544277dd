"""The prolog and the epilog on a real GPU, against a bare interpreter start (issue 21's
bars: 0.5x and 1.0x), where `make bench` can only time them over the stand-in library.

On the stand-in an NVML call costs microseconds; on a driver the sampler's last reading,
which the epilog waits for (the sampler takes it when the shell epilog says SIGUSR1, posts
the final summary, shuts NVML down, then lets the epilog return), costs what the driver
takes: ~13 ms of CPU a GPU-poll on an H100 (issue 22). This times it where it is real.

For a machine with an NVIDIA GPU and nvidia-ml-py but no Slurm (`make gpu-check`'s), as
root (the shell epilog finds the sampler under /run): from the repository root,

    python3 bench/gpu_hooks.py --python /path/to/a/venv/bin/python [--gpus 0,1] [--runs 10]

where that interpreter imports pynvml and this checkout (a .pth file) with -I, as an
install's venv does. `--standin` runs the same over the stand-in library (the check of
this script on a machine without a GPU: `make` builds the library). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROLOG = str(REPO / "prolog" / "gpueff-prolog")
EPILOG = str(REPO / "epilog" / "gpueff-epilog")
NODE = "gpuhooks"


def site(root: Path, python: str, gpus: str, standin: bool) -> dict[str, str]:
    """A config under `root` and the environment Slurm gives the hooks. No [gpu] library:
    the driver's libnvidia-ml.so.1, as on a site (the bench's stand-in with --standin).
    interval_s is the default (1 s); checkpoint_s and live_s long, so no live copy is
    delivered (the store needs sqlite-utils, which such a machine may lack)."""
    root.mkdir(parents=True, exist_ok=True)
    if standin:
        sys.path.insert(0, str(REPO))
        from bench.run import setup  # the stand-in's devices, profile and config

        env = setup(root, 1.0)
    else:
        config = root / "gpueff.toml"
        config.write_text(
            "[sampler]\ninterval_s = 1.0\ncheckpoint_s = 600\nlive_s = 3600\n"
            f"[spool]\ndir = {json.dumps(str(root / 'spool' / '%n'))}\n"
            f"[store]\npath = {json.dumps(str(root / 'store.db'))}\n"
            f"[log]\nfile = {json.dumps(str(root / 'log' / '%n.log'))}\n"
            f"[hooks]\npython = {json.dumps(python)}\n", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(GPUEFF_CONFIG=str(config), SLURMD_NODENAME=NODE, SLURM_CLUSTER_NAME=NODE,
                   SLURM_JOB_USER="root")
    env.update(GPUEFF_PYTHON=python, SLURM_JOB_GPUS=gpus)
    return env


def wall(command: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - began


def job_dir(env: dict[str, str], job: str) -> Path:
    return Path(env["GPUEFF_CONFIG"]).parent / "spool" / env["SLURMD_NODENAME"] / "jobs" / job


def wait_for(path: Path, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def stop_sampler(directory: Path) -> None:
    """The prolog's sampler, stopped as a job whose epilog is not timed (SIGTERM)."""
    try:
        pid = int((directory / "sampler.pid").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.02)


def fast_paths(log: str, jobs: list[str]) -> int:
    """The epilogs the shell ended alone: the sampler logged that it posted the job's final
    summary itself, and no Python epilog ran for the job."""
    lines = log.splitlines()
    return sum(
        any(f"job={job} sampler[" in line and "posted complete summary" in line for line in lines)
        and not any(f"job={job} epilog[" in line for line in lines)
        for job in jobs)


def settled_log(folder: Path, jobs: list[str], timeout_s: float = 15.0) -> str:
    """The hooks' log once every job's end is in it (the sampler logs "posted" after the
    epilog returned; a Python epilog logs as it runs), or as it stands at the timeout."""
    log = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = "".join(path.read_text() for path in sorted(folder.glob("*.log")))
        lines = log.splitlines()
        if all(any(f"job={job} " in line and ("posted complete summary" in line or " epilog[" in line)
                   for line in lines) for job in jobs):
            break
        time.sleep(0.05)
    return log


def quiet(config: str, timeout_s: float = 30.0) -> list[int]:
    """Waits until no process runs with this config (GPUEFF_CONFIG in its environment):
    after an epilog returns, its sampler still removes the job's spool directory and starts
    a detached deliverer, which writes into the store and the log; removing the folder
    under them fails (or they fail). Returns the pids still running at the timeout."""
    mark = f"GPUEFF_CONFIG={config}".encode() + b"\0"
    deadline = time.monotonic() + timeout_s
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "environ").read_bytes():
                        left.append(int(entry.name))
                except OSError:  # ended, or not ours to read
                    continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def run(python: str, gpus: str, runs: int, standin: bool, settle_s: float) -> dict[str, object]:
    # ignore_cleanup_errors: only for a process still running after quiet()'s bound, named
    # in the result; the timings stand either way.
    with tempfile.TemporaryDirectory(prefix="gpueff-hooks-", ignore_cleanup_errors=True) as tmp:
        env = site(Path(tmp), python, gpus, standin)
        bare = [wall([python, "-c", "pass"], env) for _ in range(runs)]
        prologs, epilogs, jobs = [], [], []
        for n in range(runs):  # the prolog alone: its sampler stopped untimed, one at a time
            job = str(7000 + n)
            prologs.append(wall([PROLOG], {**env, "SLURM_JOB_ID": job}))
            if wait_for(job_dir(env, job) / "summary.json"):
                stop_sampler(job_dir(env, job))
        for n in range(runs):  # the epilog of a job whose sampler polled settle_s
            job = str(8000 + n)
            job_env = {**env, "SLURM_JOB_ID": job}
            subprocess.run([PROLOG], env=job_env, check=True, stdin=subprocess.DEVNULL)
            if not wait_for(job_dir(env, job) / "summary.json"):
                raise SystemExit(f"job {job}: the sampler wrote no checkpoint in 30 s")
            time.sleep(settle_s)
            epilogs.append(wall([EPILOG], job_env))
            jobs.append(job)
        log = settled_log(Path(tmp) / "log", jobs)
        tail = log.splitlines()[-6:]
        lingering = quiet(env["GPUEFF_CONFIG"])
    return {"python": python, "gpus": gpus, "runs": runs,
            "bare_ms": 1000 * statistics.median(bare),
            "prolog_ms": 1000 * statistics.median(prologs),
            "epilog_ms": 1000 * statistics.median(epilogs),
            "epilog_all_ms": [round(1000 * t, 1) for t in epilogs],
            "epilog_posted_by_sampler": fast_paths(log, jobs), "log_tail": tail,
            "still_running": lingering}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="the hooks' interpreter (an install's venv python)")
    parser.add_argument("--gpus", default="0", help="SLURM_JOB_GPUS (device minors)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--settle", type=float, default=2.5,
                        help="seconds the sampler polls before the epilog")
    parser.add_argument("--standin", action="store_true", help="the stand-in library, not a GPU")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = run(args.python, args.gpus, args.runs, args.standin, args.settle)
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    bare = found["bare_ms"]
    print(f"bare start ({args.python} -c pass): {bare:.1f} ms (median of {args.runs})")
    for name, bar in (("prolog", 0.5), ("epilog", 1.0)):
        ms = found[f"{name}_ms"]
        ratio = ms / bare  # type: ignore[operator]
        print(f"{name} wall time (median): {ms:.1f} ms = {ratio:.2f}x bare start; "
              f"target <= {bar}x: {'ok' if ratio <= bar else 'MISSED'}")
    print(f"epilogs (ms): {found['epilog_all_ms']}; posted by the sampler (shell path): "
          f"{found['epilog_posted_by_sampler']} of {args.runs}")
    if found["still_running"]:
        print(f"processes of this config still running after 30 s: {found['still_running']}")
    for line in found["log_tail"]:  # type: ignore[attr-defined]
        print(f"  log: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
