"""slurmctld's host: what SlurmUser needs there. slurmctld runs the MailProg as SlurmUser,
and gpueff-mail --watch (the idle watch) runs as SlurmUser beside it: the mail spool and
log, and the store read. What SlurmUser may do is asked of the kernel, as SlurmUser."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass

from ..config import Config
from .base import UNSET, Check, ancestors, dir_fix, perms, run, unsafe_dirs

# The directory slurm_gpu_eff is in, for the probe that opens the store as SlurmUser
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Account:
    """A user as it logs in: the uid, its primary group and every group it is a member of."""
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


# Run as SlurmUser (its uid and groups): os.access then answers as the kernel would for it,
# ACLs included. argv[1]: [[path, "rwx" letters], ...]; prints a list of true/false.
_ACCESS = ("import json, os, sys\n"
           "modes = {'r': os.R_OK, 'w': os.W_OK, 'x': os.X_OK}\n"
           "asks = json.loads(sys.argv[1])\n"
           "print(json.dumps([os.access(p, sum(modes[c] for c in want)) for p, want in asks]))\n")
# Run as SlurmUser: the store opened as the MailProg and the idle watch open it (read_url,
# read only). argv[1]: where slurm_gpu_eff is; argv[2]: the URL.
_STORE = ("import sys\n"
          "sys.path.insert(0, sys.argv[1])\n"
          "from slurm_gpu_eff.store import open_store\n"
          "try:\n"
          "    with open_store(sys.argv[2], readonly=True) as store:\n"
          "        store.schema()\n"
          "except Exception as exc:\n"
          "    print(f'{type(exc).__name__}: {exc}')\n"
          "    sys.exit(1)\n")
_VERBS = {"x": "pass through", "r": "read", "w": "write", "wx": "make entries in", "rwx": "use"}
DROPPED = "the MailProg then sends Slurm's plain notice and the job's GPU report is silently dropped"


def checks(config: Config, slurm: dict[str, str] | None) -> list[Check]:
    """On slurmctld's host (a SlurmctldHost of slurm.conf): slurmctld runs the MailProg as
    SlurmUser, and gpueff-mail --watch runs as SlurmUser beside it. They need the mail
    spool and log, and to read the store; elsewhere these checks do not apply."""
    if slurm is None:
        return []  # the slurm.conf check says why
    hosts = _controllers(slurm)
    if not hosts & _host_names():
        return [Check("mail", True, (
            f"not slurmctld's host ({', '.join(sorted(hosts)) or 'none named'}): the MailProg and "
            "gpueff-mail --watch run there, as SlurmUser; their checks are skipped here"))]
    who = _slurm_user(slurm)
    if isinstance(who, str):
        return [Check("SlurmUser", False, who, "create the user slurm.conf's SlurmUser names on this "
                                               "host (slurmctld runs as it), or name the right one")]
    try:
        return [_mail_spool(config, who), _mail_log(config, who), _store_reader(config, who, slurm)]
    except _ProbeFailed as exc:
        return [Check("SlurmUser", False, f"cannot check as {who.name} what it may do: {exc}",
                      "run doctor as root on slurmctld's host")]


class _ProbeFailed(Exception):
    pass


def _controllers(slurm: dict[str, str]) -> set[str]:
    """slurm.conf's SlurmctldHost names: `SlurmctldHost[N] = name` or `name(address)`."""
    names = set()
    for key, value in slurm.items():
        if (key == "SlurmctldHost" or re.fullmatch(r"SlurmctldHost\[\d+\]", key)) and value not in UNSET:
            names.add(value.partition("(")[0].strip())
    return names


def _host_names() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0]}


def _slurm_user(slurm: dict[str, str]) -> Account | str:
    """SlurmUser as `scontrol show config` prints it ("slurm(64030)"; unset: root)."""
    name = slurm.get("SlurmUser", "").partition("(")[0].strip() or "root"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return f"SlurmUser {name!r} is not a user on this host"
    return Account(name, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(name, entry.pw_gid)))


def _as(who: Account, code: str, *args: str) -> subprocess.CompletedProcess[str] | None:
    """A short Python program run as `who`, with the uid and groups it logs in with, in an
    environment as bare as the MailProg's."""
    return run([sys.executable, "-I", "-c", code, *args], user=who.uid, group=who.gid,
                extra_groups=list(who.groups), cwd="/", env={"PATH": os.defpath, "LANG": "C.UTF-8"})


def _blocked(who: Account, path: str, want: str, make: str = "wx") -> tuple[str, str] | None:
    """Where `who` is stopped on its way to `want` ("r", "w", "rwx") on `path`: every
    directory above it passed through, and `path`, or where it is still to be made (`make`
    on that directory; "" asks nothing of it). None: nowhere."""
    chain = ancestors(path)
    asks = [(d, "x") for d, _ in chain]
    if os.path.lexists(path):
        asks.append((path, want))
    elif chain and make:
        asks.append((chain[-1][0], make))
    done = _as(who, _ACCESS, json.dumps(asks))
    if done is None or done.returncode != 0:
        said = "" if done is None else (done.stderr.strip().splitlines() or [""])[-1]
        raise _ProbeFailed(f"{sys.executable} did not run as {who.name}" + (f" ({said})" if said else ""))
    try:  # the probe prints one JSON line; anything else (a sitecustomize's chatter) is a failure
        answers = json.loads(done.stdout.strip().splitlines()[-1])
        found = list(zip(asks, answers, strict=True))
    except (ValueError, IndexError) as exc:
        raise _ProbeFailed(f"{sys.executable} as {who.name} answered no list of {len(asks)}: {exc}") from exc
    for (where, what), can in found:
        if not can:
            return where, what
    return None


def _unsafe_above(name: str, what: str, path: str, who: Account) -> Check | None:
    """A directory above SlurmUser's `path` that someone else can change: a failed check."""
    bad = unsafe_dirs(path, owners=(0, who.uid))
    if not bad:
        return None
    return Check(name, False, (f"{bad[0][1]} is above {what} {path}: a user who can change it can put a "
                               "link where SlurmUser writes"), dir_fix(bad[0][0]))


def _mail_spool(config: Config, who: Account) -> Check:
    path = config.mail_spool_dir
    group = _group(who.gid)
    make = f"install -d -o {who.name} -g {group} -m 0700 {path}"
    unsafe = _unsafe_above("mail-spool", "the mail spool", path, who)
    if unsafe is not None:
        return unsafe
    if os.path.isdir(path):
        info = os.stat(path)
        if info.st_uid != who.uid or info.st_mode & 0o077:
            return Check("mail-spool", False, (
                f"{path} is {perms(info)}, not {who.name}'s alone (0700): the MailProg and gpueff-mail "
                f"--watch run as {who.name} (SlurmUser)" + (
                    f"; {DROPPED}" if info.st_uid != who.uid else "; users could read the waiting mail")),
                f"chown -R {who.name}:{group} {path}; chmod 0700 {path}")
    blocked = _blocked(who, path, "rwx")
    if blocked:
        where, what = blocked
        said = (f"{who.name} (SlurmUser) cannot {_VERBS[what]} {where}" + (
            f", so cannot make the mail spool {path}" if where != path else ""))
        return Check("mail-spool", False, f"{said}: {DROPPED}",
                     _closed_fix(where, what, path, "mail_spool_dir", who) or make)
    if not os.path.isdir(path):
        return Check("mail-spool", True, f"{path} will be made by {who.name}'s first mail")
    return Check("mail-spool", True, f"{path}: {who.name}'s alone")


def _closed_fix(where: str, what: str, directory: str, key: str, who: Account) -> str:
    """The fix when a directory above the mail side's `directory` is closed to SlurmUser
    (the node spool's or log's root-only tree, say): its own place, outside it, as the
    default is. "": not that case."""
    if what != "x":
        return ""
    default = getattr(Config(), key)
    made = default if key == "mail_spool_dir" else os.path.dirname(default)
    if os.path.abspath(directory) == os.path.abspath(made):
        return f"chmod o+x {where} (or give it a group of {who.name}'s, with g+x)"
    return (f'[mail] {key.removeprefix("mail_")} = "{default}" (the default: outside {where}, which is '
            f"closed to {who.name}), and install -d -o {who.name} -g {_group(who.gid)} -m 0700 {made}")


def _mail_log(config: Config, who: Account) -> Check:
    """The MailProg's log (why a report was not sent is said there), written as SlurmUser.
    It names users, jobs and addresses: no user may read it."""
    path = config.mail_log_file
    directory = os.path.dirname(path)
    group = _group(who.gid)
    make = f"install -d -o {who.name} -g {group} -m 0700 {directory}"
    unsafe = _unsafe_above("mail-log", "the mail log", path, who)
    if unsafe is not None:
        return unsafe
    if not os.path.isdir(directory):
        # the MailProg would make it (the last part only) with slurmctld's umask: readable by all
        return Check("mail-log", False, f"{directory} does not exist: {who.name} cannot make it, or would "
                                        "make it and the log readable by every user", make)
    exists = os.path.exists(path)
    blocked = _blocked(who, path, "w")
    if blocked:
        where, what = blocked
        return Check("mail-log", False, (
            f"{who.name} (SlurmUser) cannot {_VERBS[what]} {where}: the MailProg's log (why a report was "
            "not sent) is lost"), _closed_fix(where, what, directory, "mail_log_file", who)
            or (f"chown {who.name}:{group} {path}; chmod 0600 {path}" if where == path else make))
    mode = stat.S_IMODE(os.stat(path).st_mode) if exists else 0o644  # the MailProg's umask: 022
    if mode & 0o004 and os.stat(directory).st_mode & 0o001:
        return Check("mail-log", False, (
            f"{path} {'is' if exists else 'would be made'} readable by every user (mode {mode:o}): it names "
            "users, jobs and their addresses"),
            f"chmod 0600 {path}" if exists else f"install -m 0600 -o {who.name} -g {group} /dev/null {path}")
    return Check("mail-log", True, f"{path}: {who.name} writes it, users cannot read it")


def _store_reader(config: Config, who: Account, slurm: dict[str, str]) -> Check:
    """SlurmUser reads the store (read_url): the MailProg for each job-end report, the idle
    watch for the running jobs. It never writes there."""
    from ..store.base import shown_url

    url = config.store_read_url
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else None
    admin = config.store_admin_group
    name = "store-slurmuser"
    join = (f'[store] admin_group = "{admin or "GROUP"}" (the file is then 0640 root:{admin or "GROUP"}); '
            f"usermod -a -G {admin or 'GROUP'} {who.name}; then restart slurmctld and gpueff-mail's service "
            "(each keeps the groups it started with)")
    if path is not None and not os.path.exists(path):
        gid = _gid(admin)
        if who.uid != 0 and (gid is None or gid not in who.groups):
            made = f"0640 root:{admin}" if gid is not None else "0600, root's"
            return Check(name, False, (
                f"{path} will be made {made}, which {who.name} (SlurmUser) cannot read: the job-end "
                "reports and the idle watch need it"), join)
        blocked = _blocked(who, path, "r", make="")
        if blocked:
            return Check(name, False, f"{who.name} (SlurmUser) cannot pass through {blocked[0]}, above the "
                                      f"store {path}", f"chmod o+x {blocked[0]} (or chgrp it to {admin})")
        return Check(name, True, f"{path} will be made 0640 root:{admin}; {who.name} is in {admin}")
    done = _as(who, _STORE, PACKAGE_PARENT, url)
    if done is None:
        raise _ProbeFailed(f"{sys.executable} did not run as {who.name}")
    if done.returncode != 0:
        said = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["exit status"])[-1]
        return Check(name, False, (
            f"{who.name} (SlurmUser, as whom the MailProg and the idle watch run) cannot read "
            f"{shown_url(url)}: {said}"), join if path is not None else (
            f"let {who.name} log in as [store] read_url's role: a passfile of its own (0600, {who.name}'s) "
            "named by passfile= in read_url (docs/install.md, PostgreSQL)"))
    if path is not None:
        running = _running_groups(slurm, who)
        info = os.stat(path)
        if (running is not None and info.st_uid != who.uid and not info.st_mode & 0o004
                and info.st_gid not in running[1]):
            return Check(name, False, (
                f"slurmctld (pid {running[0]}) runs without group {_group(info.st_gid)}, which reads {path}: "
                f"it started before {who.name} joined the group, so its MailProg cannot read the store"),
                "restart slurmctld and gpueff-mail's service (each keeps the groups it started with)")
    return Check(name, True, f"{who.name} (SlurmUser) reads {shown_url(url)} (read only: all the MailProg "
                             "and the idle watch do with it)")


def _gid(group: str) -> int | None:
    try:
        return grp.getgrnam(group).gr_gid if group else None
    except KeyError:
        return None


def _running_groups(slurm: dict[str, str], who: Account) -> tuple[int, set[int]] | None:
    """The running slurmctld's pid and groups (/proc: what its MailProg inherits), when its
    pid file names a live process of SlurmUser's."""
    try:
        with open(slurm.get("SlurmctldPidFile", ""), encoding="ascii") as handle:
            pid = int(handle.read().split()[0])
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            fields = dict(line.partition(":")[::2] for line in handle)
    except (OSError, ValueError, IndexError):
        return None
    try:
        if int(fields["Uid"].split()[0]) != who.uid:
            return None
        return pid, {int(fields["Gid"].split()[0]), *map(int, fields["Groups"].split())}
    except (KeyError, ValueError, IndexError):
        return None


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
