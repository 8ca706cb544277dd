"""Slurm's configuration as slurmctld has it (`scontrol show config`): are the prolog, the
epilog and the MailProg ours, root's, and in directories only root can change."""

from __future__ import annotations

import glob
import os
import re

from ..config import Config, find_command
from .base import UNSET, Check, dir_fix, perms, run, unsafe_dirs


def slurm_config(config: Config) -> dict[str, str] | None:
    """`scontrol show config` as {key: value}; None when slurmctld cannot be asked.

    Slurm prints every setting as "%-23s = %s" (slurm_print_key_pairs, src/api/config_info.c),
    then the cgroup.conf in force under "Cgroup Support Configuration:" in the same shape
    when a cgroup plugin is in use (_fill_ctld_conf, src/slurmctld/proc_req.c). Keys do not
    repeat across the sections, so one dict holds them all."""
    done = run([find_command(config.scontrol), "show", "config"])
    if done is None or done.returncode != 0:
        return None
    settings = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.strip()] = value.strip()
    return settings


def hooks(slurm: dict[str, str] | None) -> list[Check]:
    if slurm is None:
        return [Check("slurm.conf", False, "`scontrol show config` did not answer: slurmctld is down "
                                           "or this host is not in the cluster",
                      "start slurmctld, or run doctor where `scontrol ping` works")]
    checks = [_hook(slurm, key, name) for key, name in
              (("Prolog", "gpueff-prolog"), ("Epilog", "gpueff-epilog"), ("MailProg", "gpueff-mail"))]
    flags = slurm.get("PrologFlags", "")
    checks.append(Check("PrologFlags", "alloc" in flags.lower(), f"PrologFlags={flags or '(none)'}",
                        "" if "alloc" in flags.lower() else
                        "PrologFlags=Alloc in slurm.conf (the sampler starts when the job is given its "
                        "nodes, before any step), then `scontrol reconfigure`"))
    return checks


def _hook_entries(slurm: dict[str, str], key: str) -> list[tuple[str, str]]:
    """The scripts configured for `key`, as (the key as printed, its value).

    22.05's `scontrol show config` prints one key, `Prolog = PATH` (`(null)` when unset);
    24.11 and 26.05 print one numbered key per Prolog= line of slurm.conf and nothing when
    there is none: `Prolog[0] = PATH` (slurm_ctl_conf_2_key_pairs in src/api/config_info.c:
    xstrdup_printf("Prolog[%d]", i) over conf->prolog_cnt; the same for Epilog). The
    releases between were not looked at: both forms are read. MailProg stays one plain key
    in every release."""
    numbered = re.compile(re.escape(key) + r"\[(\d+)\]")
    entries = sorted((int(m.group(1)), name) for name in slurm if (m := numbered.fullmatch(name)))
    keys = ([key] if key in slurm else []) + [name for _, name in entries]
    return [(name, slurm[name]) for name in keys if slurm[name] not in UNSET]


def _hook(slurm: dict[str, str], key: str, name: str) -> Check:
    entries = _hook_entries(slurm, key)
    shown = ", ".join(f"{k}={v}" for k, v in entries)
    fix = (f"{key}=/PATH/TO/VENV/bin/{name} in slurm.conf (an absolute path; the venv's own; from "
           f"Slurm 24.11 it may be a {key}= line of its own beside the site's), then `scontrol reconfigure`")
    if not entries:
        return Check(key, False, f"slurm.conf has no {key} line", fix)
    where = os.path.dirname(slurm.get("SLURM_CONF", "")) or "/etc/slurm"
    paths = [p for _, value in entries for p in _scripts(value, where)]
    ours = [p for p in paths if os.path.basename(p) == name or _mentions(p, name)]
    if not ours:
        return Check(key, False, f"{shown} does not run {name}", fix)
    if not all(os.access(p, os.X_OK) for p in ours):
        return Check(key, False, f"{shown}: {ours[0]} is not an executable file here", fix)
    runs = "as SlurmUser at every job's end" if key == "MailProg" else "as root in every GPU job"
    for path in ours:
        info = os.stat(path)
        if info.st_uid != 0 or info.st_mode & 0o022:
            return Check(key, False, f"{shown}: {path} is {perms(info)}, and it runs {runs}",
                         f"chown root:root {path}; chmod 0755 {path}")
        bad = unsafe_dirs(path)
        if bad:
            return Check(key, False, f"{shown}: {bad[0][1]} is above {path}, which runs {runs}",
                         dir_fix(bad[0][0]))
    return Check(key, True, shown)


def _scripts(value: str, where: str) -> list[str]:
    """The files one configured entry runs. slurmd globs each entry as one pattern
    (_script_list_create in src/plugins/prep/script/prep_script_slurmd.c: glob(3), no comma
    splitting), and since 23.11 a relative entry is found beside slurm.conf (the
    get_extra_conf_path applied to each prolog in slurmd.c)."""
    pattern = value if os.path.isabs(value) else os.path.join(where, value)
    return glob.glob(pattern) or [pattern]


def _mentions(path: str, name: str) -> bool:
    """A site's own wrapper that calls ours (the development cluster's do)."""
    try:
        with open(path, "rb") as handle:
            return name.encode() in handle.read(65536)
    except OSError:
        return False
