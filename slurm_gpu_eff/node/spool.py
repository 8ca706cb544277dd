"""The node-local spool (standard library only: the hooks and the sampler use it).

    SPOOL/jobs/JOBID/job.json      what the prolog saw (JobContext)
    SPOOL/jobs/JOBID/sampler.pid   the detached sampler's pid, and when the prolog ran
                                   (the run's identity: a requeued job keeps its id)
    SPOOL/jobs/JOBID/summary.json  the sampler's latest checkpoint (a NodeSummary)
    SPOOL/outbox/*.json            node summaries waiting for the store
    SPOOL/outbox/inflight/         taken by the deliverer (a dead one's wait for the next)
    SPOOL/outbox/dead/             summaries the store rejected, each with a .reason beside it
    SPOOL/outbox/corrupt/          files that were not summaries, kept for a human
    SPOOL/outbox/deliver.lock      held by the one deliverer at work on this spool

and, outside the spool, where the shell epilog finds a running sampler without reading
the config: /run/slurm-gpu-eff/by-config/CONFIG_PATH/NODE/JOBID (locator_path, below).

Every write is atomic (temporary file, fsync, rename): a crash leaves the old file or
the new one, never half of one. Summaries go to the outbox first and to the store
second, so a store that is down loses nothing: the next delivery takes them. The spool
is root's alone (0700, files 0600): it names users, jobs and what their GPUs did, which
users may not read of each other.
"""

from __future__ import annotations

import errno
import os

from ..errors import SpoolError

TYPE_CHECKING = False  # not typing's: importing typing costs the prolog milliseconds
if TYPE_CHECKING:
    from ..model import NodeSummary

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


class Spool:
    def __init__(self, root: str) -> None:
        self.root = root
        self.outbox = os.path.join(root, "outbox")

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.root, "jobs", safe_part(job_id))

    def make_private(self) -> None:
        """Create the spool's root 0700, or make an older one so: never what a link there
        names (os.chmod would follow it)."""
        private_dirs(self.root)
        fd = open_folder(self.root)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def post(self, summary: NodeSummary) -> str:
        """Queue a node summary for the store; the newest one per job, node and run wins."""
        path = self.posted_as(summary)
        write_json(path, summary.to_dict())
        return path

    def posted_as(self, summary: NodeSummary) -> str:
        """Where post() puts `summary`: one name per job, node and run."""
        name = f"{safe_part(summary.cluster)}-{safe_part(summary.job_id)}-{safe_part(summary.node)}"
        if summary.run_started_at:  # a requeued run never overwrites the one before
            name += f"-{int(summary.run_started_at)}"
        return os.path.join(self.outbox, name + ".json")

    def pending(self) -> list[str]:
        """Summaries waiting in the outbox, by name."""
        return _summaries_in(self.outbox)

    @property
    def inflight(self) -> str:
        return os.path.join(self.outbox, "inflight")

    @property
    def dead(self) -> str:
        return os.path.join(self.outbox, "dead")

    def take(self, path: str) -> str | None:
        """Move a pending summary into inflight/ under a name of its own, before reading it:
        a summary posted meanwhile under the same name is a new file, never touched."""
        import time

        target = os.path.join(self.inflight, f"{time.time_ns():020d}-{os.path.basename(path)}")
        try:
            private_dirs(self.inflight)
            os.rename(path, target)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SpoolError(f"cannot move {path} into {self.inflight}: {exc.strerror}") from exc
        return target

    def taken(self) -> list[str]:
        """What a deliverer took and did not finish (it died, or the store went away),
        oldest first."""
        return _summaries_in(self.inflight)

    def bury(self, path: str, reason: str) -> str:
        """A summary the store rejected: kept, with why, for a human (spool status)."""
        private_dirs(self.dead)
        target = os.path.join(self.dead, os.path.basename(path))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with os.fdopen(os.open(f"{target}.reason", flags, 0o600), "w", encoding="utf-8") as handle:
            handle.write(reason + "\n")
        os.replace(path, target)
        return target

    def set_aside(self, path: str, name: str | None = None) -> str:
        """Move a file that is not a summary out of the way, keeping it for inspection."""
        corrupt = os.path.join(self.outbox, "corrupt")
        private_dirs(corrupt)
        target = os.path.join(corrupt, name or os.path.basename(path))
        os.replace(path, target)
        return target


def _summaries_in(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SpoolError(f"cannot list {folder}: {exc.strerror}") from exc
    return [os.path.join(folder, n) for n in names if n.endswith(".json")]


PID_FILE = "sampler.pid"
SUMMARY = "summary.json"


def _pid_file(job_dir: str) -> list[str]:
    """The pid file's words: the sampler's pid, then when this run's prolog ran."""
    try:
        with open(os.path.join(job_dir, PID_FILE), encoding="ascii") as handle:
            return handle.read().split()
    except (OSError, UnicodeDecodeError):
        return []


def sampler_pid(job_dir: str) -> int | None:
    try:
        return int(_pid_file(job_dir)[0])
    except (ValueError, IndexError):
        return None


def run_started(job_dir: str) -> float | None:
    """When the prolog of this run of the job ran (epoch seconds), from the pid file."""
    try:
        return float(_pid_file(job_dir)[1])
    except (ValueError, IndexError):
        return None


def is_sampler(pid: int, job_dir: str) -> bool:
    """True while `pid` is this job's live sampler (not a zombie, not a recycled pid): its
    command line names the job's directory, or (started by the shell prolog) the job
    after --prolog."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            parts = handle.read().split(b"\0")
    except OSError:
        return False
    if job_dir.encode() in parts:
        return True
    at = parts.index(b"--prolog") if b"--prolog" in parts else -1
    return (at >= 0 and b"slurm_gpu_eff.node.sampler" in parts
            and parts[at + 1:at + 2] == [os.path.basename(job_dir).encode()])


# Where the shell epilog finds a job's sampler without reading the config (a TOML reader
# in sh would cost it more than all the rest of its work): the sampler writes its pid, the
# run's start and its job directory at LOCATOR_ROOT + CONFIG + "/" + NODE + "/" + JOBID,
# keyed by the path of the config file the hooks read ($GPUEFF_CONFIG, else the default),
# so that configs of their own on one machine (tests, several clusters) keep apart. /run
# is memory, root's, and empty after a reboot, as a running sampler's pointer should be.
# The sampler removes it as it ends, and the Python epilog after it.
LOCATOR_ROOT = "/run/slurm-gpu-eff/by-config"


def locator_path(config_file: str, node: str, job_id: str) -> str | None:
    """The job's locator, as epilog/gpueff-epilog spells it; None where the shell would not
    look (a relative config path or one with . or .. in it, a node name that is not a safe
    path part, a job id that is not digits): that job's epilog takes the Python path."""
    if not config_file.startswith("/") or any(p in (".", "..") for p in config_file.split("/")):
        return None
    if node in ("", ".", "..") or safe_part(node) != node:
        return None
    if not (job_id.isascii() and job_id.isdigit()):
        return None
    return f"{LOCATOR_ROOT}{config_file}/{node}/{job_id}"


def write_locator(path: str, pid: int, started: float, job_dir: str) -> None:
    """"PID STARTED JOB_DIR", written whole and renamed like the pid file (the epilog may
    read it at once). Only below an existing /run: never makes that."""
    root = os.path.dirname(os.path.dirname(LOCATOR_ROOT))
    if not os.path.isdir(root):
        raise OSError(errno.ENOENT, f"{root} does not exist", root)
    if "\n" in job_dir:  # sh reads one line
        raise OSError(errno.EINVAL, "a line break in the spool's path", job_dir)
    private_dirs(os.path.dirname(path))
    part = f"{path}.{pid}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(f"{pid} {started:.3f} ".encode() + os.fsencode(job_dir) + b"\n")
    os.replace(part, path)


def remove_locator(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def private_dirs(path: str) -> None:
    """os.makedirs with 0700 for what it creates (the parents it makes too)."""
    if not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent and parent != path:
            private_dirs(parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def open_folder(path: str) -> int:
    """A directory's descriptor, for root to act on or in; never a link's target (one planted
    where the directory should be would choose where root writes)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:
        if os.path.islink(path):  # the kernel's word for it, "not a directory", misleads
            raise OSError(errno.ELOOP, f"{path} is a symbolic link: root writes through none",
                          path) from None
        raise


def safe_part(text: str) -> str:
    """A path part from a job id or node name: ASCII letters, digits and _.- only."""
    return "".join(c if c in _SAFE else "_" for c in text) or "_"


def write_json(path: str, data: object) -> None:
    """Atomically replace `path` with `data` as JSON; raises SpoolError (e.g. disk full)."""
    import json  # here, not at the top: the prolog uses this module but never json (12 ms)

    directory = os.path.dirname(path)
    # A name no one can foresee, created new and never through a link (O_EXCL|O_NOFOLLOW).
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        private_dirs(directory)
        with os.fdopen(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SpoolError(f"cannot write {path}: {exc.strerror or exc}") from exc


def read_json(path: str) -> object:
    """Read a spool file; SpoolError says whether it is missing or corrupt."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError as exc:
        raise SpoolError(f"{path} does not exist") from exc
    except OSError as exc:
        raise SpoolError(f"cannot read {path}: {exc.strerror}") from exc
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the decoder
        raise SpoolError(f"{path} is corrupt: {exc}") from exc


def read_summary(path: str) -> NodeSummary:
    from ..model import NodeSummary  # not at the top: the prolog does not need dataclasses

    data = read_json(path)
    if not isinstance(data, dict):
        raise SpoolError(f"{path} is corrupt: not a JSON object")
    try:
        return NodeSummary.from_dict(data)
    except SpoolError as exc:
        raise SpoolError(f"{path}: {exc}") from exc
