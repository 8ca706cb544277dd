"""What every check of `gpueff doctor` uses: its results (Check, Note), a command run with
a bound, and who owns a path and who else could change it (the directories above it)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

UNSET = ("", "(null)")  # how `scontrol show config` prints a setting with no value


@dataclass
class Check:
    name: str
    ok: bool
    message: str
    fix: str = ""


@dataclass
class Note:
    """What doctor found that is no failure: the Slurm release and cgroup version in use
    ("info"), and settings that change or weaken what is measured ("warning", with how to
    avoid it). Notes never make a host not ready."""
    name: str
    level: str
    message: str
    fix: str = ""


def run(command: list[str], timeout: float = 15.0,
        runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
        **options: object) -> subprocess.CompletedProcess[str] | None:
    try:
        return runner(command, capture_output=True, text=True, timeout=timeout, check=False, **options)
    except (OSError, subprocess.SubprocessError):
        return None


def ancestors(path: str) -> list[tuple[str, bool]]:
    """The existing directories above `path`, from / down: (directory, made_here), where
    made_here says that `path` (or its first missing part) is still to be made there."""
    path = os.path.abspath(path)
    parts = []
    parent = os.path.dirname(path)
    while True:
        parts.append(parent)
        if os.path.dirname(parent) == parent:
            break
        parent = os.path.dirname(parent)
    parts.reverse()
    chain = []
    for directory in parts:
        if not os.path.isdir(directory):
            break
        chain.append(directory)
    missing = len(chain) < len(parts) or not os.path.lexists(path)
    return [(d, missing and i == len(chain) - 1) for i, d in enumerate(chain)]


def unsafe_dirs(path: str, owners: tuple[int, ...] = (0,)) -> list[tuple[str, str]]:
    """The directories above `path`, as written and as links resolve it, that someone not
    among `owners` could change: (directory, what it is). Whoever may rename entries in one
    can put a link where root (or SlurmUser) then writes or reads. A sticky directory
    (/tmp) lets no user rename what is not theirs: safe above an existing path, not where
    the path is still to be made (a user could make it first)."""
    bad: list[tuple[str, str]] = []
    seen: set[str] = set()
    for directory, made_here in ancestors(path) + ancestors(os.path.realpath(path)):
        if directory in seen:
            continue
        seen.add(directory)
        try:
            info = os.stat(directory)
        except OSError:
            continue
        open_ = info.st_mode & 0o022 and (made_here or not info.st_mode & stat.S_ISVTX)
        if info.st_uid not in owners or open_:
            bad.append((directory, f"{directory} ({perms(info)})"))
    return bad


def dir_fix(directory: str) -> str:
    return f"chown root {directory}; chmod go-w {directory} (or keep the file elsewhere)"


def perms(info: os.stat_result) -> str:
    return f"owner {user(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):o}"


def user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def existing_parent(path: str) -> str | None:
    parent = os.path.dirname(path.rstrip("/"))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent or None
