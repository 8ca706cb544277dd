"""The shell epilog (epilog/gpueff-epilog): its fast path, where the sampler posts its own
final summary when told (SIGUSR1) and no interpreter starts, and every way out of it to
the Python epilog (hooks.main), which must then neither lose the summary nor post a
second one.

Fake samplers are small Python processes whose command line reads as the shell prolog's
sampler of the job (`... slurm_gpu_eff.node.sampler --prolog JOBID`); a recording
interpreter ($GPUEFF_PYTHON) tells whether, and how, the shell handed over to Python.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.model import COMPLETE, MISSING
from slurm_gpu_eff.node import hooks
from slurm_gpu_eff.node.spool import Spool, locator_path, write_json, write_locator
from tests.unit.test_hooks import EPILOG, PROLOG, own_job_id, run_shim, shim_env

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/run"),
    reason="the locator lives under /run, root's (as the hooks run)",
)

# Removes its job directory and ends on SIGUSR1 ("posts"; "slow": 0.3 s after it, and
# deaf to SIGTERM meanwhile), takes the name the real one takes once it has posted and
# let go of the GPUs, and lives on ("names"), or ignores SIGUSR1 and SIGTERM
# ("stubborn"); says it is ready by a file beside the job directory.
FAKE_SAMPLER = """
import os, signal, sys, time
job_dir, mode = sys.argv[1], sys.argv[2]
def posted(signum, frame):
    if mode == "names":
        with open("/proc/self/comm", "w") as handle:
            handle.write("gpueff-posted")
        return
    if mode == "slow":
        time.sleep(0.3)
    for name in os.listdir(job_dir):
        os.unlink(os.path.join(job_dir, name))
    os.rmdir(job_dir)
    os._exit(0)
signal.signal(signal.SIGUSR1, signal.SIG_IGN if mode == "stubborn" else posted)
if mode != "posts":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(job_dir + ".ready", "w").close()
while True:
    time.sleep(1)
"""


def fake_sampler(hook_site: Any, job: str, mode: str, locator: bool = True) -> subprocess.Popen[bytes]:
    """A fake sampler of `job` with its job directory, pid file and (with `locator`) the
    locator the shell epilog reads, as the real one writes them."""
    job_dir = hook_site.job_dir(job)
    job_dir.mkdir(parents=True)
    script = hook_site.root / "fake_sampler.py"  # a file: sh reads a command line's first line
    script.write_text(FAKE_SAMPLER)
    proc = subprocess.Popen([sys.executable, str(script), str(job_dir), mode,
                             "slurm_gpu_eff.node.sampler", "--prolog", job])
    hook_site.pids.append(proc.pid)
    hook_site.wait_for(Path(f"{job_dir}.ready"))
    (job_dir / "sampler.pid").write_text(f"{proc.pid} {time.time():.3f}\n")
    if locator:
        path = locator_path(str(hook_site.config_path), "gpu1", job)
        assert path is not None
        write_locator(path, proc.pid, time.time(), str(job_dir))
    return proc


def recording_python(hook_site: Any) -> tuple[Path, Path]:
    """An interpreter that only writes down its arguments: (it, what it wrote)."""
    calls = hook_site.root / "python-calls"
    fake = hook_site.root / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >>{calls}\n')
    fake.chmod(0o755)
    return fake, calls


def alive(pid: int) -> bool:
    """Not ended, nor a zombie (hook_site.is_running knows only samplers whose command
    line names the site: the shell prolog's names the job)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except OSError:
        return False


def name_of(pid: int) -> str | None:
    """The process's name (/proc/PID/comm), None once it has ended."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() if alive(pid) else None
    except OSError:
        return None


def locator_of(hook_site: Any, job: str) -> Path:
    path = locator_path(str(hook_site.config_path), "gpu1", job)
    assert path is not None
    return Path(path)


def started(hook_site: Any, job: str) -> tuple[dict[str, str], int]:
    """The shell prolog's sampler of `job`, up: its first checkpoint and its locator written.
    Returns the job's hook environment and the sampler's pid."""
    env = shim_env(hook_site, SLURM_JOB_ID=job)
    assert run_shim(PROLOG, env).returncode == 0
    pid = hook_site.sampler_pid(job)
    hook_site.wait_for(hook_site.job_dir(job) / "summary.json")
    hook_site.wait_for(locator_of(hook_site, job))
    return env, pid


def until_ended(pid: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while alive(pid):
        assert time.monotonic() < end
        time.sleep(0.02)


# --- the fast path: no interpreter ----------------------------------------------------------------

def test_the_sampler_posts_its_own_final_summary_and_no_interpreter_starts(hook_site: Any) -> None:
    """The real shell prolog's sampler, stopped by the shell epilog: its final summary is
    in the store, complete, its directory and locator are gone, it has ended (let go of
    the GPUs), and no Python epilog ran."""
    hook_site.write_state(2, {"util": 60, "power_w": 300}, started_at=time.time() - 10)
    job = own_job_id()
    env, pid = started(hook_site, job)
    locator = locator_of(hook_site, job)
    assert locator.read_text() == (
        f"{pid} {(hook_site.job_dir(job) / 'sampler.pid').read_text().split()[1]} {hook_site.job_dir(job)}\n")
    assert locator.stat().st_mode & 0o777 == 0o600
    assert Path("/run/slurm-gpu-eff").stat().st_mode & 0o777 == 0o700
    done = run_shim(EPILOG, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    # The epilog returned once the sampler had posted and shut NVML down (it says so by
    # its name); what it does after (its directory, the log, a deliverer) is not waited for.
    assert name_of(pid) in ("gpueff-posted", None)
    (summary,) = hook_site.stored(job)
    until_ended(pid)
    assert not hook_site.job_dir(job).exists() and not locator.exists()
    assert (summary.status, summary.reason, [g.minor for g in summary.gpus]) == (COMPLETE, "", [0, 2])
    assert summary.ended_at is not None and summary.sampled_until <= summary.ended_at
    assert summary.run_started_at is not None
    busy = summary.gpus[1]
    assert busy.metric("util") == pytest.approx(60.0, abs=1e-9)
    log = hook_site.log()
    assert f"sampler[{pid}]: posted complete summary (2 GPUs)" in log
    assert " epilog[" not in log  # no Python epilog


def test_a_sampler_that_posts_on_sigusr1_is_all_the_epilog_waits_for(hook_site: Any) -> None:
    python, calls = recording_python(hook_site)
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "posts")
    done = run_shim(EPILOG, shim_env(hook_site, SLURM_JOB_ID=job, GPUEFF_PYTHON=str(python)))
    assert done.returncode == 0
    assert sampler.wait(timeout=5) == 0  # it got SIGUSR1 (SIGTERM would end it -15)
    assert not calls.exists()  # no interpreter started


def test_the_epilog_returns_once_the_sampler_says_it_posted(hook_site: Any) -> None:
    """What the sampler does after it posted and shut NVML down (its directory, the log,
    a deliverer: file system work that may wait behind the post's fsync) is not waited
    for: its name in /proc says it may go."""
    python, calls = recording_python(hook_site)
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "names")
    done = run_shim(EPILOG, shim_env(hook_site, SLURM_JOB_ID=job, GPUEFF_PYTHON=str(python)))
    assert done.returncode == 0
    assert name_of(sampler.pid) == "gpueff-posted"  # told, and still there
    assert not calls.exists()


# --- the ways to the Python epilog ------------------------------------------------------------------

def test_a_sampler_that_does_not_end_is_handed_to_the_python_epilog(hook_site: Any) -> None:
    """Told, it neither posts nor ends: past its bound the shell hands over, naming the
    sampler it told; the Python epilog kills it after stop_wait_s and posts what the job
    directory holds (nothing here: missing, saying why)."""
    hook_site.configure(sampler={"stop_wait_s": 0.5})
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "stubborn")
    done = run_shim(EPILOG, shim_env(hook_site, SLURM_JOB_ID=job))
    assert done.returncode == 0
    assert sampler.wait(timeout=5) == -signal.SIGKILL
    assert f"sampler pid {sampler.pid} did not stop within 0.5 s: killed" in hook_site.log()
    (summary,) = hook_site.stored(job)
    assert summary.status == MISSING and summary.reason.startswith("the sampler left no summary")
    assert not hook_site.job_dir(job).exists() and not locator_of(hook_site, job).exists()


def test_the_shell_names_the_sampler_it_told_when_it_hands_over(hook_site: Any) -> None:
    python, calls = recording_python(hook_site)
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "stubborn")
    run_shim(EPILOG, shim_env(hook_site, SLURM_JOB_ID=job, GPUEFF_PYTHON=str(python)))
    assert calls.read_text().split()[-2:] == ["--stopping", str(sampler.pid)]


@pytest.mark.parametrize("case", ["no locator", "not the sampler", "no job directory"])
def test_what_the_shell_cannot_vouch_for_goes_to_python_untouched(hook_site: Any, case: str) -> None:
    """No locator (a sampler still starting, or none), a locator whose pid is some other
    process (a pid used again), or one whose job directory is gone: nothing is signalled,
    and the Python epilog does what it always did."""
    python, calls = recording_python(hook_site)
    job = own_job_id()
    other = None
    sampler = fake_sampler(hook_site, job, "posts", locator=case != "no locator")
    if case == "not the sampler":
        other = subprocess.Popen(["sleep", "60"])
        write_locator(str(locator_of(hook_site, job)), other.pid, time.time(), str(hook_site.job_dir(job)))
    elif case == "no job directory":
        write_locator(str(locator_of(hook_site, job)), sampler.pid, time.time(),
                      str(hook_site.root / "elsewhere"))
    try:
        env = shim_env(hook_site, SLURM_JOB_ID=job, GPUEFF_PYTHON=str(python))
        assert run_shim(EPILOG, env).returncode == 0
        assert sampler.poll() is None and (other is None or other.poll() is None)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    assert calls.read_text().startswith("-I -c ")
    assert "--stopping" not in calls.read_text()


@pytest.mark.parametrize("job", ["4242/../4242", "../4242", "4242 ", "", "x"])
def test_a_job_id_that_is_not_digits_never_reaches_a_path(hook_site: Any, job: str) -> None:
    """SLURM_JOB_ID goes into the locator's path only as digits: anything else goes to the
    Python epilog, which says what is wrong with it, and no sampler is signalled."""
    python, calls = recording_python(hook_site)
    sampler = fake_sampler(hook_site, "4242", "posts")
    done = run_shim(EPILOG, shim_env(hook_site, SLURM_JOB_ID=job, GPUEFF_PYTHON=str(python)))
    assert done.returncode == 0
    assert sampler.poll() is None
    assert "--stopping" not in calls.read_text()


@pytest.mark.parametrize("node", ["gpu/1", "..", "gpu 1"])
def test_a_node_name_that_is_not_a_path_part_goes_to_python(hook_site: Any, node: str) -> None:
    python, calls = recording_python(hook_site)
    assert locator_path(str(hook_site.config_path), node, "4242") is None  # the same rule
    done = run_shim(EPILOG, shim_env(hook_site, SLURMD_NODENAME=node, GPUEFF_PYTHON=str(python)))
    assert done.returncode == 0 and calls.read_text().startswith("-I -c ")


def test_a_relative_config_path_goes_to_python(hook_site: Any) -> None:
    python, calls = recording_python(hook_site)
    assert locator_path("gpueff.toml", "gpu1", "4242") is None
    assert locator_path("/etc/../etc/gpueff.toml", "gpu1", "4242") is None
    env = shim_env(hook_site, GPUEFF_CONFIG="gpueff.toml", GPUEFF_PYTHON=str(python))
    done = subprocess.run([str(EPILOG)], env=env, cwd=hook_site.root, capture_output=True, timeout=30,
                          check=False)
    assert done.returncode == 0 and calls.read_text().startswith("-I -c ")


def test_the_shell_epilog_costs_a_job_without_gpus_one_test(hook_site: Any) -> None:
    """As the prolog: no interpreter, no process, nothing read or written."""
    env = shim_env(hook_site, SLURM_JOB_GPUS="", GPUEFF_PYTHON="/bin/false-not-started")
    done = subprocess.run(["sh", "-x", str(EPILOG)], env=env, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0
    assert done.stderr.decode().splitlines() == ["+ [ -n  ]", "+ exit 0"]
    assert not hook_site.spool_root.exists() and hook_site.log() == ""


# --- the Python epilog after the shell: one summary, never two, never none -----------------------------

def test_python_after_the_shell_posts_nothing_when_the_sampler_did(hook_site: Any) -> None:
    """The shell told the sampler and stopped waiting; meanwhile it posted and removed its
    directory: the Python epilog waits for it to end and posts no second, missing one."""
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "posts")
    sampler.send_signal(signal.SIGUSR1)  # it "posts": its directory goes
    sampler.wait(timeout=5)
    env = hook_site.export(hook_site.env(SLURM_JOB_ID=job))
    assert hooks.main(["epilog", "--stopping", str(sampler.pid)], env) == 0
    assert hook_site.stored(job) == []
    assert "the sampler posted its final summary itself" in hook_site.log()
    assert not locator_of(hook_site, job).exists()


def test_python_after_the_shell_waits_for_a_sampler_still_posting(hook_site: Any) -> None:
    """The same while the sampler is still at it: the Python epilog stops it as always
    (the real sampler, told by SIGUSR1, posts whatever comes after) and, its directory
    gone once it is done, posts nothing itself."""
    job = own_job_id()
    sampler = fake_sampler(hook_site, job, "slow")
    sampler.send_signal(signal.SIGUSR1)  # it takes 0.3 s to "post"
    env = hook_site.export(hook_site.env(SLURM_JOB_ID=job))
    assert hooks.main(["epilog", "--stopping", str(sampler.pid)], env) == 0
    assert sampler.wait(timeout=5) == 0
    assert hook_site.stored(job) == []
    assert "the sampler posted its final summary itself" in hook_site.log()
    assert "killed" not in hook_site.log()


def test_a_final_summary_in_the_outbox_is_never_posted_over(hook_site: Any, make_summary: Any) -> None:
    """The sampler posted its final summary and was killed before it removed its
    directory: the Python epilog finds the last checkpoint there (running) and must not
    post it, cut short, over the final one."""
    job = own_job_id()
    job_dir = hook_site.job_dir(job)
    job_dir.mkdir(parents=True)
    started = time.time() - 60
    (job_dir / "sampler.pid").write_text(f"999999999 {started:.3f}\n")
    checkpoint = make_summary(status="running", job_id=job, run_started_at=started,
                              sampled_until=started + 30)
    write_json(str(job_dir / "summary.json"), checkpoint.to_dict())
    final = make_summary(status=COMPLETE, job_id=job, run_started_at=started, sampled_until=started + 59,
                         ended_at=started + 60)
    Spool(str(hook_site.spool_root)).post(final)
    env = hook_site.export(hook_site.env(SLURM_JOB_ID=job))
    assert hooks.main(["epilog"], env) == 0
    (summary,) = hook_site.stored(job)
    assert (summary.status, summary.sampled_until) == (COMPLETE, started + 59)
    assert "the sampler posted its final summary itself, then was stopped" in hook_site.log()
    assert not job_dir.exists()


def test_sigterm_still_leaves_the_summary_for_the_epilog(hook_site: Any) -> None:
    """Only the shell epilog's SIGUSR1 makes the sampler post: Slurm's SIGTERM (a sampler
    inside the job's cgroup) or the Python epilog's leaves the complete summary as the
    checkpoint, and the epilog that comes after posts it, once."""
    job = own_job_id()
    env, pid = started(hook_site, job)
    os.kill(pid, signal.SIGTERM)
    until_ended(pid)
    assert (hook_site.job_dir(job) / "summary.json").exists()
    assert not locator_of(hook_site, job).exists()  # removed as it ended
    assert hook_site.stored(job) == []  # nothing posted by the sampler
    assert run_shim(EPILOG, env).returncode == 0
    (summary,) = hook_site.stored(job)
    assert summary.status == COMPLETE
    assert "epilog[" in hook_site.log() and "posted complete summary (2 GPUs)" in hook_site.log()


def test_a_sampler_that_cannot_post_leaves_its_summary_to_the_python_epilog(hook_site: Any) -> None:
    """Told to post, it cannot (the outbox is not a directory): it keeps the final summary
    as its checkpoint, in its directory, so the shell hands over and the Python epilog
    tries as it always did; what it cannot post either stays there, complete, for the next
    delivery to sweep: never lost."""
    job = own_job_id()
    env, pid = started(hook_site, job)
    outbox = hook_site.spool_root / "outbox"
    outbox.write_text("")
    assert run_shim(EPILOG, env).returncode == 0
    assert not alive(pid)
    log = hook_site.log()
    assert f"sampler[{pid}]: cannot post the final summary, left for the epilog" in log
    assert "epilog[" in log and f"cannot write {outbox}/" in log  # the Python epilog's try
    checkpoint = json.loads((hook_site.job_dir(job) / "summary.json").read_text())
    assert (checkpoint["status"], checkpoint["reason"]) == (COMPLETE, "")
    assert checkpoint["ended_at"] is not None


@pytest.mark.parametrize("stop", ["shell epilog", "sigterm"])
def test_the_final_reading_reads_the_energy_counter_its_cadence_skipped(hook_site: Any, stop: str) -> None:
    """Between summaries the loop reads the energy counter only every ENERGY_EVERY_S (10 s);
    the final reading, however the sampler is stopped, reads it: the job's energy is the
    counter's difference over the whole window, not up to the last read by cadence."""
    hook_site.configure(sampler={"interval_s": 0.1, "checkpoint_s": 60, "live_s": 3600})
    hook_site.write_state(2, {"util": 60, "power_w": 300}, started_at=time.time() - 10)
    job = own_job_id()
    env, pid = started(hook_site, job)
    time.sleep(1.5)  # a dozen polls, none of them due to read the counter
    if stop == "sigterm":
        os.kill(pid, signal.SIGTERM)
        until_ended(pid)
    assert run_shim(EPILOG, env).returncode == 0
    (summary,) = hook_site.stored(job)
    busy = summary.gpus[1]
    window = summary.sampled_until - summary.sampled_from
    assert window > 1.5 and busy.energy_source == "counter"
    # within 10%: the counter is read a few ms before the window opens and after it closes
    # (more on a loaded machine); a final reading without it would give ~0 J
    assert busy.energy_j == pytest.approx(300 * window, rel=0.1)
