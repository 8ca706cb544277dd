"""The accounting query `gpueff JOBID` starts before anything else loads: only the least
of the standard library (no `re`, `subprocess`, `signal` module: their imports cost more
than this module's work before sacct starts), and slurmdbd answers while the rest loads.

The delimiter is new for every call (random bytes between unit separators): a job's owner
cannot put it in the job's name ahead of time, so no name can cut a row where it likes
(forge JobIDRaw, hide a task). Parsing is commands.py's.
"""

from __future__ import annotations

import os
import time

# The signal numbers without the signal module (its enums load enum and functools): the
# C module it wraps, loaded with the interpreter.
from _signal import SIGKILL, SIGPIPE, SIGXFSZ

from ..errors import SlurmError, UsageError

DELIMITER = "\x1f"  # ASCII unit separator: the captured fixtures' delimiter
# No TRES field: any of them costs a second round trip to slurmdbd (0.17 s, not 0.09 s,
# measured on Slurm 22.05). Memory comes from ReqMem, the GPU count from our line in the
# AdminComment (mirror.py); only a job without that line is asked for AllocTRES. Where a
# site keeps our line in the SystemComment ([slurm] comment_field), that is asked for in
# the AdminComment's place (and read under its name: the last column is our line's field).
FIELDS = (
    "JobID", "JobName", "JobIDRaw", "Cluster", "User", "Account", "Partition", "State",
    "ExitCode", "ElapsedRaw", "TimelimitRaw", "Start", "End", "NCPUS", "NNodes", "NodeList",
    "TotalCPU", "ReqMem", "MaxRSS", "NTasks", "AdminComment",
)


def is_job_id(text: str) -> bool:
    r"""A job id as sacct takes one: 1234, an array task 1234_7, a heterogeneous component
    1234+1 (1234_7+1 too), digits being Unicode decimal digits: what the regular
    expression `^\d+(_\d+)?(\+\d+)?$` matches (commands.JOB_ID), but for a trailing
    newline, without loading `re`."""
    rest, plus, component = text.partition("+")
    if plus and not component.isdecimal():
        return False
    job, underscore, task = rest.partition("_")
    return job.isdecimal() and (not underscore or task.isdecimal())


def check_job_id(job_id: str) -> str:
    job_id = job_id.strip()
    if not is_job_id(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (like 1234, 1234_7 or 1234+1)")
    return job_id


def fresh_delimiter() -> str:
    """A delimiter no job name can hold: its middle is chosen now, at random."""
    return f"\x1f{os.urandom(8).hex()}\x1f"


def _inherited() -> list[int]:
    """The files beyond 0-2 that exec would pass on: those this process was started with
    (its shell's, without close-on-exec). Linux's /proc says which are open."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    fds = []
    for fd in map(int, names):
        try:
            if fd > 2 and os.get_inheritable(fd):
                fds.append(fd)
        except OSError:  # the listing's own, closed by now
            pass
    return fds


def sacct_command(job_id: str, sacct: str, comment_field: str, delimiter: str) -> list[str]:
    """The report's query (bin/gpueff starts the same, comment field and sacct at their
    defaults)."""
    fields = [comment_field if f == "AdminComment" else f for f in FIELDS]
    return [sacct, "-j", job_id, "-P", "-n", f"--delimiter={delimiter}", "--format=" + ",".join(fields)]


def _handed(text: str) -> tuple[int | None, int, int, list[str]]:
    """bin/gpueff's description of the sacct it started: (pid, out, err, argv), pid None
    where it is not one (set by hand, or garbled)."""
    words = text.split("\x1e")
    try:
        pid, out, err = (int(w) for w in words[:3])
    except ValueError:
        return None, -1, -1, []
    if pid <= 0 or min(out, err) <= 2 or out == err:
        return None, -1, -1, []
    return pid, out, err, words[3:]


def _fresh(delimiter: str) -> bool:
    """A delimiter made the way bin/gpueff makes them: random hex between unit separators."""
    middle = delimiter[1:-1]
    return (len(delimiter) >= 18 and delimiter[0] == delimiter[-1] == "\x1f"
            and all(c in "0123456789abcdef" for c in middle))


def _pipe(fd: int) -> bool:
    try:
        return (os.fstat(fd).st_mode & 0o170000) == 0o010000  # S_IFIFO, without the stat module
    except OSError:
        return False


def _close(*fds: int) -> None:
    for fd in fds:
        if _pipe(fd):  # only a pipe: any other number is not one we were handed
            os.close(fd)


class EarlyRun:
    """A Slurm command running from the moment this is made; text() waits for its output.

    Started with os.posix_spawnp, not subprocess: importing subprocess (and its signal,
    threading, selectors, locale) cost ~4 ms before sacct could start. What Popen does is
    done here: stdin from /dev/null, stdout and stderr read until the command closes them,
    SIGPIPE and SIGXFSZ at their defaults in it (Python ignores them), no file open in
    it but those three (Python's own are not inheritable; any gpueff was started with,
    beyond 0-2, is closed), exec's PATH search. One difference: glibc's posix_spawn leaves
    its own two internal signals (32, 33: thread cancellation, setxid) ignored in the
    child, where Popen leaves them at their defaults; glibc installs its handlers for them
    when a program first needs them, so the command is none the worse."""

    TIMEOUT_S = 60

    def __init__(self, command: list[str], daemon: str = "slurmctld") -> None:
        """`daemon`: the one that answers it (named where it does not)."""
        self.argv, self.daemon = command, daemon
        self.started = time.monotonic()
        self.reaped: int | None = None  # its wait status, where it was reaped before text()
        self.out, out_w = os.pipe()
        self.err, err_w = os.pipe()
        try:
            self.pid = os.posix_spawnp(command[0], command, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited()),
            ], setsigdef=(SIGPIPE, SIGXFSZ))
        except BaseException as exc:
            for fd in (self.out, self.err):
                os.close(fd)
            if isinstance(exc, FileNotFoundError):
                raise SlurmError(f"{command[0]} not found: is Slurm's client installed and on PATH?") from exc
            raise
        finally:
            os.close(out_w)
            os.close(err_w)

    def text(self) -> str:
        import select

        deadline = time.monotonic() + max(0.1, self.TIMEOUT_S - (time.monotonic() - self.started))
        read: dict[int, list[bytes]] = {self.out: [], self.err: []}
        poller = select.poll()
        for fd in read:
            poller.register(fd, select.POLLIN)
        try:
            left = set(read)
            while left:
                wait = deadline - time.monotonic()
                ready = poller.poll(wait * 1000) if wait > 0 else []
                if not ready:
                    os.kill(self.pid, SIGKILL)
                    os.waitpid(self.pid, 0)
                    raise SlurmError(f"{self.name} did not answer within {self.TIMEOUT_S} s "
                                     f"(is {self.daemon} up?)")
                for fd, _ in ready:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        read[fd].append(chunk)
                    else:
                        poller.unregister(fd)
                        left.discard(fd)
        finally:
            for fd in read:
                os.close(fd)
        waited = self.reaped if self.reaped is not None else os.waitpid(self.pid, 0)[1]
        status = os.waitstatus_to_exitcode(waited)
        if status != 0:
            err = b"".join(read[self.err])
            first = (err.decode("utf-8", "replace").strip().splitlines() or ["no message"])[0]
            raise SlurmError(f"{self.name} failed: {first}")
        # Bytes, decoded leniently: a job name is the user's and need not be UTF-8.
        return b"".join(read[self.out]).decode("utf-8", "replace")

    @property
    def name(self) -> str:
        return self.argv[0].rpartition("/")[2]


class SacctRun(EarlyRun):
    """`sacct -j JOBID` with FIELDS, running from the moment this is made (EarlyRun), or
    the one bin/gpueff started, taken over. `nodes`: the nodes' configuration, asked
    beside it where the caller started that too (cli.early_sacct)."""

    def __init__(self, job_id: str, sacct: str = "sacct", comment_field: str = "AdminComment",
                 handed: str | None = None) -> None:
        """`handed`: a sacct already running, as bin/gpueff describes it
        ($GPUEFF_EARLY_SACCT): taken if it is exactly this command, else stopped."""
        try:
            self.job_id = check_job_id(job_id)
        except UsageError:
            if handed is not None:
                self.drop(handed)
            raise
        self.sacct, self.comment_field = sacct, comment_field
        self.nodes: EarlyRun | None = None
        if handed is not None and self.take(handed):
            return
        self.delimiter = fresh_delimiter()
        super().__init__(self.command(self.delimiter), "slurmdbd")

    def command(self, delimiter: str) -> list[str]:
        return sacct_command(self.job_id, self.sacct, self.comment_field, delimiter)

    def take(self, handed: str) -> bool:
        """Take the sacct bin/gpueff started ("PID\x1eOUT\x1eERR\x1eARGV..." with \x1e
        between argv's words) where it is this process's child, its output and errors come
        on pipes, and it runs exactly this command with a fresh delimiter (sacct.FIELDS and
        bin/gpueff's fields are the same list: tested). A child of ours that is not that is
        stopped and its pipes closed; what is not our child is left alone, files and all
        (a description set by hand). The caller then starts its own."""
        pid, out, err, command = _handed(handed)
        if pid is None:
            return False
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours: not to be waited for, stopped, nor its files closed
            return False
        delimiter = next((a[12:] for a in command if a.startswith("--delimiter=")), "")
        if not (_fresh(delimiter) and command == self.command(delimiter) and _pipe(out) and _pipe(err)):
            if not done:
                os.kill(pid, SIGKILL)
                os.waitpid(pid, 0)
            _close(out, err)
            return False
        os.set_inheritable(out, False)  # nothing we start gets them
        os.set_inheritable(err, False)
        self.pid, self.out, self.err, self.delimiter = pid, out, err, delimiter
        self.argv, self.daemon, self.started = command, "slurmdbd", time.monotonic()
        self.reaped = status if done else None
        return True

    @staticmethod
    def drop(handed: str) -> None:
        """A sacct bin/gpueff started that nothing takes (not a report after all): stopped."""
        pid, out, err, _ = _handed(handed)
        if pid is None:
            return
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                os.kill(pid, SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:  # not ours: its files are none of ours either
            return
        _close(out, err)
