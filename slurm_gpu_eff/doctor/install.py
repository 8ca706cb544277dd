"""Who may change what root runs: the config file (it names the hooks' python) and the venv
that python is in. A file or directory a user can change there is root for that user."""

from __future__ import annotations

import os
import stat

from ..config import Config, config_path
from .base import Check, dir_fix, perms, unsafe_dirs, user


def not_root(uid: int) -> Check:
    return Check("root", False, (
        f"doctor runs as {user(uid)}, not root: the node spool, the store, and SlurmUser's mail spool, "
        "mail log and store access are root's (and SlurmUser's) alone to see, so those checks are left "
        "out rather than reported broken"),
        "run it as root: sudo gpueff doctor (on each GPU node, on slurmctld's host, on a login node)")


def config_file(config: Config, path: str | None) -> Check:
    """The file names the interpreter root's hooks start ([hooks] python) and the NVML
    library they load: no user may change it, nor make it where there is none."""
    where = config_path(path)
    fix = f"chown root:root {where}; chmod 0644 {where}"
    try:
        info = os.stat(where)
    except OSError:
        info = None
    if info is not None and (info.st_uid != 0 or info.st_mode & 0o022):
        return Check("config-file", False, f"{where} is {perms(info)}: a user who can change it names the "
                                           "python that root's hooks run", fix)
    bad = unsafe_dirs(where)
    if bad:
        return Check("config-file", False, (
            f"{bad[0][1]} is above {where}: a user who can change it can put a config of their own there, "
            "which names the python that root's hooks run"), dir_fix(bad[0][0]))
    if info is None:
        return Check("config-file", True, f"no {where}; only root can make one")
    return Check("config-file", True, f"{where}: root's, mode {stat.S_IMODE(info.st_mode):o}, "
                                      "in directories only root can change")


def venv(config: Config) -> Check:
    """[hooks] python (by default the python running doctor, as the hooks run the one
    beside them) runs as root in every GPU job's prolog and epilog: its venv, every file
    in it, and the directories above it must be root's alone. A venv a user can write is
    root for that user."""
    python = config.python
    if not os.access(python, os.X_OK):
        return Check("venv", False, f"{python} ([hooks] python) is not an executable file here",
                     "point [hooks] python at the venv's bin/python, or leave it out (the hooks' own)")
    base = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    venv = base if os.path.isfile(os.path.join(base, "pyvenv.cfg")) else None
    real = os.path.realpath(python)
    where = venv or python
    above = unsafe_dirs(where)
    found = (_open_entries(venv) if venv else []) + [said for _, said in above + unsafe_dirs(real)]
    info = os.stat(real)
    if info.st_uid != 0 or info.st_mode & 0o022:
        found.append(f"{real} ({perms(info)})")
    found = list(dict.fromkeys(found))  # a directory above both the venv and its python, once
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        fix = f"chown -R root:root {where}; chmod -R go-w {where}"
        if above:
            fix += "; " + "; ".join(f"chown root {d}; chmod go-w {d}" for d, _ in above)
        return Check("venv", False, (
            f"{where} holds the python that root's hooks run, and users could change it: "
            f"{'; '.join(found[:3])}{more}"), fix)
    return Check("venv", True, f"{where}: root's alone (the python root's hooks run)")


def _open_entries(top: str) -> list[str]:
    """What in the tree under `top` (itself included) is not root's or is writable by its
    group or by others. Links are not followed (their own mode means nothing)."""
    found = []
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            info = os.lstat(directory)
            entries = list(os.scandir(directory))
        except OSError:
            continue
        if info.st_uid != 0 or info.st_mode & 0o022:
            found.append(f"{directory} ({perms(info)})")
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if entry.is_symlink():
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid != 0 or info.st_mode & 0o022:
                found.append(f"{entry.path} ({perms(info)})")
    return sorted(found)
