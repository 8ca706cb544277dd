"""Which framework a job's GPU processes run on, told from the libraries they map.

A process with a CUDA context has its framework's libraries loaded (PyTorch, TensorFlow and
JAX load them at import, before any kernel runs), so one read of /proc/PID/maps, the first
time the process shows on one of the job's GPUs, says what it is: PyTorch (libtorch*,
libc10_cuda), TensorFlow (libtensorflow_framework, _pywrap_tensorflow_internal), JAX
(jaxlib's xla_extension, libjax*, anything under a jaxlib directory), else plain "cuda"
where only the CUDA runtime or driver library is mapped. Hints use it to give a
framework's fix only to that framework.

Bounded, as the sampler that calls it: each PID is read once, at most MAX_PIDS of them a
job, at most MAX_MAPS_BYTES of each maps file. A process gone, or one we may not read,
is skipped quietly. Standard library only.
"""

from __future__ import annotations

import os
import re

PYTORCH, TENSORFLOW, JAX, CUDA = "pytorch", "tensorflow", "jax", "cuda"
MAX_PIDS = 32  # a job with more GPU processes than this is classified from its first ones
MAX_MAPS_BYTES = 4 << 20  # a CUDA process maps thousands of regions: ~1 MiB of text
READ_CHUNK = 256 << 10
MAX_SEEN = 4096  # PIDs remembered (ours or not), so a churn of processes stays bounded

# A mapped shared object's path: the last field of a maps line, naming a .so file.
_SO_PATH = re.compile(rb" (/[^\n]*\.so[^/\n]*)$", re.MULTILINE)
# Basename prefixes, framework first: a process mapping any of these is that framework.
_PREFIXES = (
    (b"libtorch", PYTORCH), (b"libc10_cuda", PYTORCH),
    (b"libtensorflow_framework", TENSORFLOW), (b"_pywrap_tensorflow_internal", TENSORFLOW),
    (b"xla_extension", JAX), (b"libjax", JAX),
)
_CUDA_PREFIXES = (b"libcudart.so", b"libcuda.so")


def classify_maps(text: bytes) -> set[str]:
    """The frameworks a process maps, from its /proc/PID/maps text: {"cuda"} when only the
    CUDA runtime or driver is there, an empty set when nothing we know is."""
    found: set[str] = set()
    cuda = False
    for path in set(_SO_PATH.findall(text)):
        name = path.rpartition(b"/")[2]
        for prefix, framework in _PREFIXES:
            if name.startswith(prefix):
                found.add(framework)
                break
        else:
            if b"/jaxlib/" in path:
                found.add(JAX)
            elif name.startswith(_CUDA_PREFIXES):
                cuda = True
    if not found and cuda:
        found.add(CUDA)
    return found


def read_maps(pid: int, proc: str = "/proc", limit: int = MAX_MAPS_BYTES) -> bytes | None:
    """Up to `limit` bytes of a process's maps; None when it cannot be read (gone, not ours
    to read). The kernel writes the text as it is read, so a cap bounds the time too."""
    try:
        fd = os.open(f"{proc}/{pid}/maps", os.O_RDONLY)
    except OSError:
        return None
    chunks, size = [], 0
    try:
        while size < limit:
            chunk = os.read(fd, min(READ_CHUNK, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = b"".join(chunks)
    if size >= limit:  # cut mid-line: the last line is not whole
        text = text[: text.rfind(b"\n") + 1]
    return text


class FrameworkWatch:
    """The frameworks of a job's GPU processes, each PID looked at once."""

    __slots__ = ("examined", "found", "proc", "read", "seen")

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.seen: set[int] = set()  # every PID offered, ours or not: never looked at twice
        self.examined = 0  # PIDs whose maps were read
        self.read = 0  # ... and could be
        self.found: set[str] = set()

    def wants(self, pid: int) -> bool:
        """Whether `pid` is new and there is room to look at it (the sampler's per-poll test)."""
        return pid not in self.seen and self.examined < MAX_PIDS and len(self.seen) < MAX_SEEN

    def skip(self, pid: int) -> None:
        """A PID not to look at (another job's): remembered, so never asked about again."""
        if len(self.seen) < MAX_SEEN:
            self.seen.add(pid)

    def look(self, pid: int) -> None:
        """Classify a new process of the job by its maps; a failed read is no evidence."""
        if not self.wants(pid):
            return
        self.seen.add(pid)
        self.examined += 1
        text = read_maps(pid, self.proc)
        if text is None:
            return
        self.read += 1
        self.found |= classify_maps(text)

    def result(self) -> list[str] | None:
        """Sorted frameworks; [] when processes were read but none recognised; None when
        no process could be read."""
        return sorted(self.found) if self.read else None
