"""Slurm prolog and epilog logic (standard library only: a hot path).

Slurm's Prolog is the shell script prolog/gpueff-prolog: it starts the sampler, whose
begin() calls prepare() and write_pid() here. main(["prolog"]) is the same steps in
Python, done before returning (the unit tests' prolog). Both hooks are bounded in time
by an interval timer, log their own failures, and return 0 whatever happens: a prolog
that fails drains the node and requeues the job.
- prolog: make the job's spool directory, start the detached sampler, return.
- epilog: stop the sampler (bounded wait), turn its last checkpoint into the node's
  summary, post it to the outbox, start a detached deliverer, return: it never waits on
  the store. Slurm's Epilog, the shell script epilog/gpueff-epilog, has the shell
  prolog's sampler do all that itself (SIGUSR1: sampler.finish) and comes here only
  when it cannot vouch for that ("--stopping PID": the sampler it told and stopped
  waiting for, which may have posted meanwhile: then nothing is posted here).
"""

from __future__ import annotations

import _signal  # signal.py only wraps this in enums, and importing enum costs the prolog 5 ms
import contextlib
import os
import sys
import time

from ..config import DEFAULT_PATH, Config, load_config
from ..errors import GpuEffError, SpoolError
from .jobenv import JobContext, parse_job_gpus
from .log import HookLog
from .spool import (
    PID_FILE,
    SUMMARY,
    Spool,
    is_sampler,
    locator_path,
    private_dirs,
    read_summary,
    remove_locator,
    run_started,
    sampler_pid,
)

# The imports are kept to the bare minimum (no typing, dataclasses, re, subprocess):
# each costs milliseconds of the epilog, while the node stays COMPLETING. The epilog
# imports what it needs inside its functions.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..model import NodeSummary


class HookTimeout(BaseException):
    """Raised by the timer; a BaseException so no `except Exception` swallows it."""


def sampler_command(config: Config, job_dir: str) -> list[str]:
    return [config.python, "-I", "-m", "slurm_gpu_eff.node.sampler", job_dir]


def child_env(env: Mapping[str, str], config: Config) -> dict[str, str]:
    """What a process the hook starts sees: Slurm's variables and the config we were given."""
    return dict(env, GPUEFF_CONFIG=config.path) if config.path else dict(env)


def prolog(env: Mapping[str, str], config: Config, log: HookLog) -> None:
    """The prolog in Python (prolog/gpueff-prolog, a shell script, is what Slurm runs: it
    starts the sampler, which calls prepare() itself): the job's spool directory, the
    detached sampler, its pid file, before returning."""
    prepared = prepare(env, config)
    if prepared is None:
        return
    job_dir, started = prepared
    # The sampler reads the job from Slurm's variables and the config we were given: no
    # other description of the job, so the prolog writes no JSON (json imports re).
    sampler_env = dict(child_env(env, config), GPUEFF_RUN_STARTED=f"{started:.3f}")
    try:
        pid = start_detached(sampler_command(config, job_dir), sampler_env)
    except OSError as exc:
        log.write(f"cannot start the sampler ({config.python}): {exc.strerror or exc}")
        return
    write_pid(job_dir, pid, started)
    log.write(f"started sampler pid {pid} for SLURM_JOB_GPUS={env.get('SLURM_JOB_GPUS', '')}")


def prepare(env: Mapping[str, str], config: Config) -> tuple[str, float] | None:
    """The job's private spool directory, and this run's start (its identity: the job id
    alone is not, a requeued job keeps it); None for a job without GPUs."""
    job = JobContext.from_env(env)
    gpus = parse_job_gpus(job.job_gpus)  # BindingError is logged by the caller; no sampler then
    if not gpus:
        return None
    spool = Spool(config.spool_for(job.node))
    job_dir = spool.job_dir(job.job_id)
    try:
        spool.make_private()
        private_dirs(job_dir)
    except OSError as exc:
        raise SpoolError(f"cannot create {job_dir}: {exc.strerror}") from exc
    return job_dir, time.time()


def write_pid(job_dir: str, pid: int, started: float) -> None:
    """Written whole and renamed: the epilog may read it the moment it appears."""
    path = os.path.join(job_dir, PID_FILE)
    part = f"{path}.{pid}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)  # one a crash left: made anew below, never written through
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(f"{pid} {started:.3f}\n")
    os.replace(part, path)


def start_detached(command: list[str], env: Mapping[str, str]) -> int:
    """Start `command` in its own session, stdio on /dev/null: outside the job, outliving
    the hook. posix_spawn (vfork and exec), not fork: from the sampler, which starts the
    deliverer on the epilog's time, a fork copies its page tables (~1 ms). OSError when
    `command` cannot be run."""
    null = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
    return os.posix_spawn(command[0], command, dict(env), file_actions=null, setsid=True)


def epilog(env: Mapping[str, str], config: Config, log: HookLog, stopping: int | None = None) -> None:
    """`stopping`: the sampler the shell epilog told to post the summary itself (SIGUSR1)
    and stopped waiting for; the job's directory, which it saw, goes only once the
    summary is posted (by the sampler, or by an epilog)."""
    job = JobContext.from_env(env)
    spool = Spool(config.spool_for(job.node))
    job_dir = spool.job_dir(job.job_id)
    pid_file = os.path.join(job_dir, PID_FILE)
    locator = locator_path(config.path or DEFAULT_PATH, job.node, job.job_id)
    if stopping is not None and not os.path.isdir(job_dir):
        wait_or_kill(stopping, job_dir, config.stop_wait_s, log)  # it lets go of the GPUs
        log.write("the sampler posted its final summary itself")
        remove_locator(locator)
        return
    if not os.path.exists(pid_file) and _has_gpus(job.job_gpus):
        late = starting_samplers(job.job_id, job.node, pid_file, config.stop_wait_s)
        if late and not os.path.exists(pid_file):
            # Still not started (a slow filesystem, a loaded node): it holds no figures,
            # and left alone it would sample GPUs the next job is given.
            for pid in late:
                with contextlib.suppress(OSError):
                    os.kill(pid, _signal.SIGKILL)
            log.write(f"the sampler the prolog started was not up after {config.stop_wait_s:g} s: killed")
        elif late:
            log.write("the sampler the prolog started was still starting: waited for it")
    if os.path.isdir(job_dir):
        stop_sampler(job_dir, config.stop_wait_s, log)
        if not os.path.isdir(job_dir):  # the sampler the shell epilog told, while we waited
            log.write("the sampler posted its final summary itself")
            remove_locator(locator)
            return
        summary = node_summary(job_dir, job, config)
        summary.run_started_at = summary.run_started_at or run_started(job_dir)
        if _final_posted(spool, summary):  # the sampler posted, then was killed
            log.write("the sampler posted its final summary itself, then was stopped")
            _clean_up(job_dir, config, job, locator)
            deliver(config, spool, env, log)
            return
    else:
        try:
            if not parse_job_gpus(job.job_gpus):
                return
            reason = "no sampler record on this node: the prolog did not run or the spool was lost"
        except GpuEffError as exc:
            reason = f"GPUs not sampled: {exc}"
        summary = _missing(job, config, reason)
    summary.ended_at = time.time()
    spool.post(summary)  # if this fails (disk full), the next delivery sweeps the job dir
    _clean_up(job_dir, config, job, locator)
    log.write(f"posted {summary.status} summary ({len(summary.gpus)} GPUs)")
    deliver(config, spool, env, log)


def _clean_up(job_dir: str, config: Config, job: JobContext, locator: str | None) -> None:
    if config.export_dir:  # a sampler killed before it could take its figures away
        from .export import remove

        with contextlib.suppress(OSError):
            remove(config.export_dir, job.job_id)
    import shutil  # here: the prolog never needs it

    shutil.rmtree(job_dir, ignore_errors=True)
    remove_locator(locator)


def _final_posted(spool: Spool, summary: NodeSummary) -> bool:
    """Whether the outbox already holds a final summary of this run (the sampler's, told
    by the shell epilog to post): a checkpoint posted over it would lose its last figures."""
    try:
        return read_summary(spool.posted_as(summary)).final
    except GpuEffError:
        return False


def _missing(job: JobContext, config: Config, reason: str) -> NodeSummary:
    from ..model import MISSING

    return job.summary(MISSING, reason, interval_s=config.interval_s)


def node_summary(job_dir: str, job: JobContext, config: Config) -> NodeSummary:
    """The sampler's last word, with its status set to what really happened."""
    try:
        summary = read_summary(os.path.join(job_dir, SUMMARY))
    except GpuEffError as exc:
        return _missing(job, config, f"the sampler left no summary ({exc})")
    summary.cut_short("the sampler stopped unexpectedly")
    return summary


def _has_gpus(job_gpus: str) -> bool:
    try:
        return bool(parse_job_gpus(job_gpus))
    except GpuEffError:
        return False


def starting_samplers(job_id: str, node: str, pid_file: str, wait_s: float) -> list[int]:
    """A job that ends within milliseconds of its prolog: the sampler that the shell
    prolog started may not have written its pid file yet. Waits while one of this job and
    node (its command line names the job, its environment the node) is starting, until
    the file is there or wait_s passed; the pids of those seen."""
    wanted = [b"slurm_gpu_eff.node.sampler", b"--prolog", job_id.encode()]
    here = f"SLURMD_NODENAME={node}".encode()
    end = time.monotonic() + wait_s
    seen: list[int] = []
    while time.monotonic() < end and not os.path.exists(pid_file):
        now = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _starting(pid, wanted, here)]
        if not now:
            break
        seen = sorted(set(seen) | set(now))
        time.sleep(0.02)
    return seen


def _starting(pid: str, wanted: list[bytes], here: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            parts = handle.read().split(b"\0")
        if not any(parts[i:i + len(wanted)] == wanted for i in range(len(parts))):
            return False
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return here in handle.read().split(b"\0")
    except OSError:
        return False


def stop_sampler(job_dir: str, wait_s: float, log: HookLog) -> None:
    """SIGTERM the job's sampler and wait for its final flush; SIGKILL after wait_s."""
    pid = sampler_pid(job_dir)
    if pid is None:
        log.write("no sampler pid file")
        return
    if not _wait_for_exec(pid, job_dir):
        log.write(f"sampler pid {pid} was already gone")
        return
    try:
        os.kill(pid, _signal.SIGTERM)
    except ProcessLookupError:
        return  # it ended between the check and the signal: its last word is on disk
    wait_or_kill(pid, job_dir, wait_s, log)


def wait_or_kill(pid: int, job_dir: str, wait_s: float, log: HookLog) -> None:
    """Wait for the stopping sampler to end; SIGKILL after wait_s."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if not is_sampler(pid, job_dir):
            return
        time.sleep(0.02)
    log.write(f"sampler pid {pid} did not stop within {wait_s:g} s: killed")
    try:
        os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for_exec(pid: int, job_dir: str, wait_s: float = 0.5) -> bool:
    """True once `pid` is the sampler. For a few ms after the prolog forks it, the child
    still shows the prolog's command line: a job that ends that fast must not lose it."""
    end = time.monotonic() + wait_s
    while not is_sampler(pid, job_dir):
        if time.monotonic() > end or not os.path.exists(f"/proc/{pid}"):
            return False
        time.sleep(0.01)
    return True


def deliver(config: Config, spool: Spool, env: Mapping[str, str], log: HookLog) -> None:
    """Hand the outbox to a detached deliverer and return: the node stays COMPLETING, of
    no use to anyone, for as long as the epilog runs, so it never waits on the store. The
    deliverer retries by itself while the store is away (store/deliver.py)."""
    command = [config.python, "-I", "-m", "slurm_gpu_eff.store.deliver", spool.root]
    try:
        start_detached(command, child_env(env, config))
    except OSError as exc:  # the summary is in the outbox: the next delivery takes it
        log.write(f"cannot start the delivery ({exc}); the summary waits in the outbox")


def main(argv: list[str], env: Mapping[str, str] = os.environ) -> int:
    """Entry point for both hooks. Always returns 0."""
    kind = argv[0] if argv else ""
    # epilog/gpueff-epilog adds "--stopping PID" when it handed over to this path
    told = argv[2] if argv[1:2] == ["--stopping"] and argv[2:3] else ""
    stopping = int(told) if told.isascii() and told.isdigit() else None
    node = env.get("SLURMD_NODENAME", "")
    try:
        config = load_config()
    except GpuEffError as exc:
        config = Config()
        HookLog(config.log_for(node), env.get("SLURM_JOB_ID", "?"), kind).write(str(exc))
        return 0
    log = HookLog(config.log_for(node), env.get("SLURM_JOB_ID", "?"), kind)

    def on_timer(signum: int, frame: object) -> None:
        raise HookTimeout()

    _signal.signal(_signal.SIGALRM, on_timer)
    _signal.setitimer(_signal.ITIMER_REAL, config.hook_timeout_s)
    try:
        if kind == "prolog":
            prolog(env, config, log)
        elif kind == "epilog":
            epilog(env, config, log, stopping)
        else:
            log.write(f"unknown hook {kind!r}")
    except HookTimeout:
        log.write(f"gave up after {config.hook_timeout_s:g} s")
    except GpuEffError as exc:
        log.write(str(exc))
    except Exception as exc:  # a bug of ours must not become a drained node
        log.write(f"internal error: {exc!r}")
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
