"""hooks.py in-process (hooks.main, as the shims call it) and through the real shims.

Every test runs against a sim site in tmp_path (the hook_site fixture: GPUEFF_CONFIG,
devices, spool, store, log), and every sampler it starts is killed and reaped after it.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff import config as config_module
from slurm_gpu_eff.config import Config
from slurm_gpu_eff.model import COMPLETE, MISSING, PARTIAL, RUNNING
from slurm_gpu_eff.node import hooks

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "prolog" / "gpueff-prolog"
EPILOG = REPO / "epilog" / "gpueff-epilog"
GIB = 1024**3


def prolog_line(pid: int) -> str:
    return f"job=4242 prolog[{os.getpid()}]: started sampler pid {pid} for SLURM_JOB_GPUS=0,2"


def own_job_id() -> str:
    """A job id that no other test uses meanwhile, for a sampler the shell prolog starts
    (`sampler --prolog JOBID`). Every epilog of a job id and node looks for such samplers
    in /proc (hooks.starting_samplers) and kills those not up in time: with several
    workers, another test's epilog of job 4242 on gpu1 would find, wait for or kill this
    test's sampler, and this test's look for what is left would see another's."""
    return str(10**8 + secrets.randbelow(9 * 10**8))


def wait_for_utilisation(hook_site: Any, timeout: float = 15.0) -> None:
    """Poll the sampler's checkpoints until every GPU has a utilisation figure: at least
    one driver sample window (up to 1 s here) has closed since it started."""
    path = hook_site.job_dir() / "summary.json"
    end = time.monotonic() + timeout
    while True:
        try:
            gpus = json.loads(path.read_text())["gpus"]
            if gpus and all("util" in g["metrics"] for g in gpus):
                return
        except (OSError, ValueError, KeyError):
            pass
        assert time.monotonic() < end, "no utilisation in the sampler's checkpoints"
        time.sleep(0.05)


# --- the normal life of a job ------------------------------------------------------------------

def test_prolog_starts_a_detached_sampler(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    pid = hook_site.sampler_pid()
    job_dir = hook_site.job_dir()
    assert prolog_line(pid) in hook_site.log()
    hook_site.wait_for(job_dir / "summary.json")  # its first checkpoint: it has started
    assert hook_site.is_running(pid)
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        args = handle.read().decode().split("\0")[:-1]
    assert args == [sys.executable, "-I", "-m", "slurm_gpu_eff.node.sampler", str(job_dir)]
    assert os.getsid(pid) == pid  # its own session: outside the job, outliving the hook
    assert f"sampler[{pid}]: sampling 2 GPU(s): Slurm indexes [0, 2] = minors [0, 2]" in hook_site.log()


def test_epilog_stops_the_sampler_and_stores_a_complete_summary(hook_site: Any) -> None:
    hook_site.write_state(2, {"util": 60, "mem_used_gib": 10, "power_w": 300},
                          started_at=time.time() - 10)
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    pid = hook_site.sampler_pid()
    wait_for_utilisation(hook_site)
    assert hooks.main(["epilog"], env) == 0
    assert not hook_site.is_running(pid)
    assert not hook_site.job_dir().exists()
    (summary,) = hook_site.stored()  # delivered by the deliverer the epilog started
    assert [p.name for p in (hook_site.spool_root / "outbox").rglob("*.json")] == []
    assert (summary.status, summary.node, summary.cluster, summary.user) == (
        COMPLETE, "gpu1", "gpueffdev", "alice")
    assert (summary.job_gpus, summary.interval_s, summary.reason) == ("0,2", 0.2, "")
    assert summary.ended_at is not None and summary.sampled_until <= summary.ended_at
    assert [(g.index, g.minor, g.uuid) for g in summary.gpus] == [
        (0, 0, "GPU-00000000-0000-0000-0000-000000000000"),
        (2, 2, "GPU-22222222-2222-2222-2222-222222222222"),
    ]
    idle, busy = summary.gpus
    assert idle.samples >= 2 and busy.samples >= 2  # first checkpoint, then the last reading
    assert (idle.metric("util"), idle.metric("power_w")) == (0.0, 60.0)
    assert busy.metric("util") == pytest.approx(60.0, abs=1e-9)
    assert busy.metric("power_w") == pytest.approx(300.0, abs=1e-9)
    assert busy.metric("mem_used_bytes", "max") == 10 * GIB
    assert "posted complete summary (2 GPUs)" in hook_site.log()


def test_the_epilog_wakes_a_sampler_waiting_out_a_long_interval(hook_site: Any) -> None:
    """The sampler waits between polls on a pipe the signal writes to: a SIGTERM ends the
    wait at once, so the epilog never waits out the interval (here 30 s)."""
    hook_site.configure(sampler={"interval_s": 30})
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    pid = hook_site.sampler_pid()
    hook_site.wait_for(hook_site.job_dir() / "summary.json")  # polled once, now waiting
    time.sleep(0.3)
    started = time.monotonic()
    assert hooks.main(["epilog"], env) == 0
    assert time.monotonic() - started < 10  # well inside a poll's wait
    assert not hook_site.is_running(pid)
    (summary,) = hook_site.stored()
    assert summary.status == COMPLETE and all(g.samples == 2 for g in summary.gpus)


def test_a_sampler_killed_after_its_checkpoint_gives_partial(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env())
    hooks.main(["prolog"], env)
    pid = hook_site.sampler_pid()
    hook_site.wait_for(hook_site.job_dir() / "summary.json")
    os.kill(pid, signal.SIGKILL)  # the OOM killer, say
    os.waitpid(pid, 0)
    assert hooks.main(["epilog"], env) == 0
    (summary,) = hook_site.stored()
    assert summary.status == PARTIAL
    assert summary.reason.startswith("the sampler stopped unexpectedly; figures up to ")
    assert [g.minor for g in summary.gpus] == [0, 2]
    assert f"sampler pid {pid} was already gone" in hook_site.log()


def test_the_sampler_sees_the_environment_the_prolog_was_given(hook_site: Any) -> None:
    env = hook_site.env()  # passed to main(), not exported to os.environ
    hooks.main(["prolog"], env)
    pid = hook_site.sampler_pid()
    end = time.monotonic() + 10
    while not (hook_site.job_dir() / "summary.json").exists():
        assert time.monotonic() < end, f"sampler {pid} wrote no checkpoint"
        time.sleep(0.02)
    hooks.main(["epilog"], env)
    assert [(s.status, s.reason) for s in hook_site.stored()] == [(COMPLETE, "")]


# --- nothing to do, or nothing done ---------------------------------------------------------------

def test_a_job_without_gpus_spools_nothing(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env(SLURM_JOB_GPUS=""))
    assert hooks.main(["prolog"], env) == 0
    assert not (hook_site.spool_root / "jobs").exists()
    assert hooks.main(["epilog"], env) == 0
    assert not (hook_site.spool_root / "outbox").exists()
    assert not hook_site.store_path.exists()
    assert hook_site.log() == ""


def test_epilog_without_a_prolog_record_stores_missing(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env())
    assert hooks.main(["epilog"], env) == 0
    (summary,) = hook_site.stored()
    assert summary.status == MISSING
    assert summary.reason == (
        "no sampler record on this node: the prolog did not run or the spool was lost")
    assert (summary.job_gpus, summary.gpus) == ("0,2", [])


def test_epilog_for_gpus_that_cannot_be_read_stores_missing(hook_site: Any) -> None:
    env = hook_site.export(hook_site.env(SLURM_JOB_GPUS="zz"))
    assert hooks.main(["epilog"], env) == 0
    (summary,) = hook_site.stored()
    assert summary.status == MISSING
    assert summary.reason == "GPUs not sampled: SLURM_JOB_GPUS='zz': cannot read 'zz'"


def test_a_corrupt_checkpoint_gives_missing_with_its_reason(hook_site: Any) -> None:
    job_dir = hook_site.job_dir()
    job_dir.mkdir(parents=True)
    (job_dir / "summary.json").write_text('{"cluster": "gpueffdev", "status": "runn')
    env = hook_site.export(hook_site.env())
    assert hooks.main(["epilog"], env) == 0
    (summary,) = hook_site.stored()
    assert summary.status == MISSING
    assert summary.reason.startswith(f"the sampler left no summary ({job_dir}/summary.json is corrupt")
    assert "no sampler pid file" in hook_site.log()
    assert not job_dir.exists()


# --- garbage in: always 0, and a line in the log ---------------------------------------------------

@pytest.mark.parametrize("kind", ["prolog", "epilog"])
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SLURM_JOB_ID": "x"}, "SLURM_JOB_ID='x' is not a job id"),
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID='' is not a job id"),
        ({"SLURM_JOB_GPUS": "zz"}, "SLURM_JOB_GPUS='zz': cannot read 'zz'"),
    ],
)
def test_garbage_environment(
    hook_site: Any, kind: str, overrides: dict[str, str], message: str,
) -> None:
    env = hook_site.export(hook_site.env(**overrides))
    assert hooks.main([kind], env) == 0
    assert not (hook_site.spool_root / "jobs").exists()  # no sampler
    if kind == "prolog" or overrides.get("SLURM_JOB_ID") is not None:
        assert f"{kind}[{os.getpid()}]: {message}" in hook_site.log()


def test_an_unknown_hook_is_logged(hook_site: Any) -> None:
    assert hooks.main(["teardown"], hook_site.env()) == 0
    assert f"teardown[{os.getpid()}]: unknown hook 'teardown'" in hook_site.log()


def test_a_spool_that_cannot_be_created(hook_site: Any) -> None:
    blocker = hook_site.root / "not-a-dir"
    blocker.write_text("")
    hook_site.configure(spool={"dir": str(blocker / "spool" / "%n")})
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    assert f"prolog[{os.getpid()}]: " in hook_site.log()
    assert "Not a directory" in hook_site.log()
    assert hooks.main(["epilog"], env) == 0
    assert f"cannot write {blocker}/spool/gpu1/outbox/" in hook_site.log()
    assert len(hook_site.log().splitlines()) == 2


def test_a_spool_that_cannot_be_created_is_named_in_the_log(hook_site: Any) -> None:
    blocker = hook_site.root / "not-a-dir"
    blocker.write_text("")
    hook_site.configure(spool={"dir": str(blocker / "spool" / "%n")})
    assert hooks.main(["prolog"], hook_site.export(hook_site.env())) == 0
    assert str(blocker) in hook_site.log()
    assert "internal error" not in hook_site.log()


def test_a_hook_that_hangs_gives_up_at_its_timeout(
    hook_site: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook_site.configure(hooks={"timeout_s": 0.3}, sampler={"stop_wait_s": 0.1})

    def hang(*args: Any) -> None:
        time.sleep(5)

    monkeypatch.setattr(hooks, "stop_sampler", hang)
    (hook_site.job_dir()).mkdir(parents=True)
    env = hook_site.export(hook_site.env())
    started = time.monotonic()
    assert hooks.main(["epilog"], env) == 0
    assert time.monotonic() - started < 2
    assert "gave up after 0.3 s" in hook_site.log()


@pytest.fixture
def defaults_in_tmp(hook_site: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the built-in defaults (used when the config file is missing or broken) at
    tmp_path instead of /var; returns the default log for node gpu1."""
    defaults = hook_site.root / "defaults"
    defaults.mkdir()  # as /var/log is: the log makes its own directory, not its parents
    patched = functools.partial(
        config_module.Config, spool_dir=str(defaults / "spool" / "%n"),
        store_path=str(defaults / "gpueff.db"), log_file=str(defaults / "log" / "%n.log"),
    )
    monkeypatch.setattr(config_module, "Config", patched)
    monkeypatch.setattr(hooks, "Config", patched)
    return defaults / "log" / "gpu1.log"


def test_a_config_named_in_gpueff_config_that_is_missing_is_logged(
    hook_site: Any, defaults_in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A typo in $GPUEFF_CONFIG must not silently fall back to the defaults."""
    monkeypatch.setenv("GPUEFF_CONFIG", str(hook_site.root / "absent.toml"))
    monkeypatch.setattr(hooks, "start_detached", lambda *a: pytest.fail("sampler started"))
    assert hooks.main(["prolog"], hook_site.export(hook_site.env())) == 0
    assert f"config file {hook_site.root / 'absent.toml'} does not exist" in defaults_in_tmp.read_text()


def test_no_config_file_at_all_means_defaults(
    hook_site: Any, defaults_in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)
    monkeypatch.setattr("slurm_gpu_eff.config.DEFAULT_PATH", str(hook_site.root / "absent.toml"))
    started: list[list[str]] = []

    def record(command: list[str], env: object) -> int:  # not a real sampler: real NVML
        started.append(command)
        return 999_999_999

    monkeypatch.setattr(hooks, "start_detached", record)
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    job_dir = defaults_in_tmp.parent.parent / "spool" / "gpu1" / "jobs" / "4242"
    assert started == [[sys.executable, "-I", "-m", "slurm_gpu_eff.node.sampler", str(job_dir)]]
    assert "started sampler pid 999999999" in defaults_in_tmp.read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read config"),  # a directory where the file should be
        (b'[gpu]\nbackend = "sim\xff"\n', "cannot read config"),  # not UTF-8
        (b'backend = "sim"\n', "line 1: backend: settings go under a [section]"),
        (b'[sampler]\ninterval_s = "fast"\n', "line 2: [sampler] interval_s = 'fast': must be a number"),
        (b"[sampler]\ninterval_s = fast\n", "not valid TOML: "),  # the old INI's unquoted word
        (b"[sampler]\ninterval_s = inf\n", "[sampler] interval_s = inf: must be a number greater than 0"),
        (b"[sampler]\ncheckpoint_s = nan\n", "[sampler] checkpoint_s = nan: must be a number greater than 0"),
        (b'[gpu]\nbackend = "sim"\n', "line 2: [gpu] backend: unknown setting"),  # gone: one NVML path
    ],
)
def test_a_broken_config_is_logged_to_the_default_log(
    hook_site: Any, defaults_in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
    content: bytes | None, message: str,
) -> None:
    broken = hook_site.root / "broken.toml"
    if content is None:
        broken.mkdir()
    else:
        broken.write_bytes(content)
    monkeypatch.setenv("GPUEFF_CONFIG", str(broken))
    env = hook_site.export(hook_site.env())
    for kind in ("prolog", "epilog"):
        assert hooks.main([kind], env) == 0
    log = defaults_in_tmp.read_text()
    assert len(log.splitlines()) == 2
    assert all(message in line and str(broken) in line for line in log.splitlines())
    assert not hook_site.spool_root.exists()
    assert not (defaults_in_tmp.parent.parent / "spool").exists()


# --- the real shims ---------------------------------------------------------------------------

def run_shim(shim: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(shim)], env=env, capture_output=True, timeout=30, check=False)


def shim_env(hook_site: Any, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "GPUEFF_CONFIG": str(hook_site.config_path)}
    env.update(hook_site.env())
    env.update(extra)
    return env


def test_the_real_shims_run_a_job_through(hook_site: Any) -> None:
    job = own_job_id()
    env = shim_env(hook_site, SLURM_JOB_ID=job)
    assert "GPUEFF_PYTHON" not in env  # the venv beside the checkout
    done = run_shim(PROLOG, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    pid = hook_site.sampler_pid(job)
    hook_site.wait_for(hook_site.job_dir(job) / "summary.json")
    done = run_shim(EPILOG, env)
    assert (done.returncode, done.stderr) == (0, b"")
    assert not hook_site.is_running(pid)
    (summary,) = hook_site.stored(job)
    assert (summary.status, [g.minor for g in summary.gpus]) == (COMPLETE, [0, 2])


def test_the_shell_prolog_costs_a_job_without_gpus_one_test(hook_site: Any) -> None:
    """No interpreter, no process, nothing written: sh runs the script and returns."""
    env = shim_env(hook_site, SLURM_JOB_GPUS="", GPUEFF_PYTHON="/bin/false-not-started")
    done = subprocess.run(["sh", "-x", str(PROLOG)], env=env, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0
    assert done.stderr.decode().splitlines() == ["+ [ -n  ]", "+ exit 0"]  # nothing else ran
    assert not hook_site.spool_root.exists() and hook_site.log() == ""


def test_a_job_ending_as_its_prolog_returns_keeps_its_figures(hook_site: Any) -> None:
    """The epilog may come before the sampler the shell prolog started has made its spool
    directory: it waits for it, then stops it as always. Nothing is lost, nothing left."""
    job = own_job_id()
    env = shim_env(hook_site, SLURM_JOB_ID=job)
    assert run_shim(PROLOG, env).returncode == 0
    assert run_shim(EPILOG, env).returncode == 0  # at once: the sampler is still starting
    (summary,) = hook_site.stored(job)
    assert summary.status != MISSING and [g.minor for g in summary.gpus] == [0, 2]
    assert "still starting: waited for it" in hook_site.log() or "sampler pid" in hook_site.log()
    left = [pid for pid, cmdline in command_lines() if b"--prolog" in cmdline and job.encode() in cmdline]
    assert left == []


def command_lines() -> list[tuple[int, bytes]]:
    """Every process's pid and command line; one that ends while /proc is read is left
    out (its entry goes between listing it and reading it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.append((int(entry), Path(f"/proc/{entry}/cmdline").read_bytes()))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("shim", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_a_shim_with_no_python_still_exits_0(hook_site: Any, shim: Path) -> None:
    done = run_shim(shim, shim_env(hook_site, GPUEFF_PYTHON="/nonexistent"))
    assert done.returncode == 0
    assert not hook_site.spool_root.exists()
    assert hook_site.log() == ""


def test_a_running_job_has_fresh_figures_in_the_store_without_any_epilog(hook_site: Any) -> None:
    """The sampler sends live copies every live_s: a running job shows its figures so far,
    newer each time, and nothing waits in the spool between copies."""
    hook_site.configure(sampler={"interval_s": 0.2, "checkpoint_s": 0.5, "live_s": 0.5})
    hook_site.write_state(2, {"util": 60}, started_at=time.time() - 10)
    env = hook_site.export(hook_site.env())
    hooks.main(["prolog"], env)
    hook_site.sampler_pid()
    seen: list[float] = []
    end = time.monotonic() + 30
    while len(seen) < 2:
        assert time.monotonic() < end, f"live copies seen: {seen}"
        stored = hook_site.stored()
        if stored and stored[0].sampled_until not in seen:
            assert [s.status for s in stored] == [RUNNING]
            seen.append(stored[0].sampled_until)
        time.sleep(0.1)
    assert seen[1] > seen[0]  # the newer copy replaced the older one
    assert Config().live_s == 45  # the default: a copy under 60 s old, delivery included


def test_the_spool_and_the_log_are_root_s_alone(hook_site: Any) -> None:
    """Issue 9: spool files and hook logs name users, jobs and their GPUs' figures; no
    user may read another's. With slurmd's usual umask (022), everything the hooks, the
    sampler and the deliverer make under the spool or the log directory is 0700/0600,
    and a spool made readable by an older version is closed again by the next prolog."""
    old = os.umask(0o022)
    try:
        hook_site.spool_root.mkdir(parents=True)
        hook_site.spool_root.chmod(0o755)  # as an older version left it
        hook_site.write_state(2, {"util": 60}, started_at=time.time() - 10)
        env = hook_site.export(hook_site.env())
        hooks.main(["prolog"], env)
        hook_site.wait_for(hook_site.job_dir() / "summary.json")
        hooks.main(["epilog"], env)
        assert hook_site.stored()  # delivered: the deliverer wrote under the spool too
    finally:
        os.umask(old)
    made = [hook_site.spool_root, *hook_site.spool_root.rglob("*"),
            hook_site.log_path.parent, *hook_site.log_path.parent.rglob("*")]
    assert len(made) > 5
    readable = {str(p): oct(p.stat().st_mode & 0o777) for p in made if p.stat().st_mode & 0o077}
    assert readable == {}


def test_the_log_makes_its_own_directory_but_never_its_parents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A sampler or mail worker outliving its cluster must not build the tree back."""
    from slurm_gpu_eff.node.log import HookLog

    HookLog(str(tmp_path / "log" / "gpu1.log"), "7", "epilog").write("first")
    assert "job=7 epilog" in (tmp_path / "log" / "gpu1.log").read_text()
    assert (tmp_path / "log").stat().st_mode & 0o777 == 0o700
    HookLog(str(tmp_path / "gone" / "log" / "gpu1.log"), "7", "sampler").write("late line")
    assert not (tmp_path / "gone").exists()
    assert "late line" in capsys.readouterr().err


def test_a_sampler_still_not_up_when_the_epilog_gives_up_is_killed(hook_site: Any) -> None:
    """Left alone, a sampler that starts after its job's epilog would sample the GPUs the
    next job is given; it holds no figures yet, so it goes."""
    hook_site.configure(sampler={"stop_wait_s": 0.5})
    job = own_job_id()
    env = hook_site.export(hook_site.env(SLURM_JOB_ID=job))
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "slurm_gpu_eff.node.sampler", "--prolog", job], env=env)
    deadline = time.monotonic() + 10  # exec'd: a forked child still shows pytest's command line
    while b"--prolog" not in Path(f"/proc/{stuck.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert hooks.main(["epilog"], env) == 0
        assert stuck.wait(timeout=5) == -signal.SIGKILL
    finally:
        stuck.kill()
    assert "was not up after 0.5 s: killed" in hook_site.log()
    (summary,) = hook_site.stored(job)
    assert summary.status == MISSING


def test_a_sampler_that_cannot_be_started_is_said_so(hook_site: Any) -> None:
    """start_detached spawns (posix_spawn): an interpreter that is not there is an error
    the prolog logs, not a pid file naming a process that never ran."""
    hook_site.configure(hooks={"python": str(hook_site.root / "no-python")})
    env = hook_site.export(hook_site.env())
    assert hooks.main(["prolog"], env) == 0
    missing = hook_site.root / "no-python"
    assert f"cannot start the sampler ({missing}): No such file or directory" in hook_site.log()
    assert not (hook_site.job_dir() / "sampler.pid").exists()
