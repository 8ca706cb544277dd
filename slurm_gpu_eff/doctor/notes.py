"""What doctor notes that is no failure: the Slurm release, the cgroup version in use, and
the settings that weaken what is measured (with how to avoid them)."""

from __future__ import annotations

import os
import re
import shutil

from ..config import Config
from .base import UNSET, Note

MOUNTS = "/proc/self/mounts"  # what this host mounts (os.statvfs cannot tell cgroup2 from tmpfs)
USER_PATH = "/usr/local/bin:/usr/bin:/bin"  # the PATH a login shell gives users (Debian's, less games)


def notes(slurm: dict[str, str] | None) -> list[Note]:
    if slurm is None:  # the slurm.conf check already says why
        return []
    version = slurm.get("SLURM_VERSION", "")  # printed by every release (config_info.c)
    notes = [Note("slurm", "info", f"Slurm {version}" if version not in UNSET else
                  "Slurm's release is unknown: `scontrol show config` printed no SLURM_VERSION")]
    settings, source = _cgroup_conf(slurm)
    used, note = _cgroup(settings, source)
    notes.append(note)
    if (_release(version) >= (26, 5) and used == "v2"
            and settings.get("cgroupjobidpaths", "no").lower() != "yes"):
        notes.append(Note("CgroupJobIdPaths", "info", (
            f"Slurm {version} on cgroup v2 names each job's cgroup after its SLUID "
            "(.../slurmstepd.scope/s0HSM8BCSN1K00/step_batch/...), not job_N, as cgroup.conf does not set "
            "CgroupJobIdPaths=yes: gpueff reads both; other tools that look for job_N need the setting")))
    if "runinjob" in slurm.get("PrologFlags", "").lower():
        notes.append(_run_in_job(slurm["PrologFlags"]))
    gather = slurm.get("JobAcctGatherType", "")
    if gather in UNSET or gather.endswith("/none"):
        notes.append(Note("JobAcctGatherType", "warning", (
            f"JobAcctGatherType={gather or '(none)'}: Slurm records no job's memory use, so the reports' "
            "memory efficiency (and seff's) says n/a"),
            "JobAcctGatherType=jobacct_gather/cgroup (or jobacct_gather/linux) in slurm.conf, then restart "
            "slurmctld and every slurmd"))
    return notes


def path_note(config: Config) -> list[Note]:
    """Users read their figures with `gpueff JOBID`: it must be on the PATH they get."""
    if shutil.which("gpueff", path=USER_PATH):
        return []
    here = os.path.join(os.path.dirname(config.python), "gpueff")
    return [Note("PATH", "warning", f"no gpueff on the PATH users get ({USER_PATH}): they cannot run "
                                    "`gpueff JOBID`", f"ln -s {here} /usr/local/bin/gpueff "
                                                      "(on every login node and GPU node)")]


def _release(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _run_in_job(flags: str) -> Note:
    """PrologFlags=RunInJob (24.05; it implies Alloc and Contain, so the PrologFlags check
    passes): slurmd runs the prolog and epilog in the job's extern step. A warning, not a
    failure: the epilog, inside the job too, still stops the sampler and stores its
    summary, and a sampler killed before that leaves figures up to its last checkpoint,
    which the report marks as partial. Measurement is weakened, not lost. (Whether
    slurmstepd can kill the extern step's processes before the epilog has run was not
    read in Slurm's source.)"""
    return Note("PrologFlags", "warning", (
        f"PrologFlags={flags}: RunInJob runs the prolog and epilog inside the job's extern step cgroup, "
        "so the sampler lives inside the job: confined to the job's devices, its CPU time and memory "
        "counted in the job's accounting and limits, and killed with the job. The epilog still stops it "
        "first and stores its summary; a sampler killed sooner (a job over its memory limit) leaves "
        "figures up to its last checkpoint, marked partial: weakened, not lost, so not a failure"),
        "PrologFlags=Alloc,Contain without RunInJob (the sampler then runs outside the job's cgroup), "
        "then `scontrol reconfigure`")


def _cgroup_conf(slurm: dict[str, str]) -> tuple[dict[str, str], str]:
    """cgroup.conf's settings (keys lower-cased: Slurm's are case-insensitive) and where
    they were read. `scontrol show config` carries them while a cgroup plugin is in use;
    else the file beside slurm.conf. (No release from 22.05 to 26.05 has `scontrol show
    cgroup`: 24.11 answers "invalid entity:cgroup for keyword:show".)"""
    if "CgroupPlugin" in slurm:
        return {k.lower(): v for k, v in slurm.items() if k.startswith("Cgroup")}, "`scontrol show config`"
    path = os.path.join(os.path.dirname(slurm.get("SLURM_CONF", "")) or "/etc/slurm", "cgroup.conf")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}, f"no {path}"
    pairs = (word.split("=", 1) for line in lines for word in line.split("#", 1)[0].split() if "=" in word)
    return {key.lower(): value for key, value in pairs}, path


def _cgroup(settings: dict[str, str], source: str) -> tuple[str | None, Note]:
    """The cgroup version Slurm uses here ("v1", "v2", None) and the note that says so."""
    point = settings.get("cgroupmountpoint", "/sys/fs/cgroup")
    host, mounted = _host_cgroup(point)
    if not settings:
        return None, Note("cgroup", "info", f"no cgroup plugin in use ({source}); this host mounts {mounted}")
    plugin = settings.get("cgroupplugin", "autodetect")  # cgroup.conf's default
    said = f"CgroupPlugin={plugin} ({source}); this host mounts {mounted}"
    used = plugin[-2:] if plugin in ("cgroup/v1", "cgroup/v2") else host if plugin == "autodetect" else None
    if used and host and used != host:
        return used, Note("cgroup", "warning", (
            f"{said}: slurmd's cgroup/{used} plugin does not start on a cgroup {host} host unless it runs in "
            "a mount and cgroup namespace of its own"), "CgroupPlugin=autodetect in cgroup.conf")
    return used, Note("cgroup", "info", said)


def _host_cgroup(point: str) -> tuple[str | None, str]:
    """What the host mounts at `point`, from /proc/self/mounts: cgroup2 (v2), or a tmpfs
    holding v1 controllers (v1; a cgroup2 beside them is the hybrid layout)."""
    try:
        with open(MOUNTS, encoding="utf-8", errors="replace") as handle:
            mounts = [line.split() for line in handle]
    except OSError as exc:
        return None, f"an unknown cgroup version ({MOUNTS}: {exc.strerror})"
    at = None
    v1: list[str] = []
    unified: list[str] = []
    for fields in (f for f in mounts if len(f) >= 3):
        if fields[1] == point:
            at = fields[2]  # the last mount on a path is the one seen
        elif fields[1].startswith(point.rstrip("/") + "/") and fields[2] == "cgroup":
            v1.append(os.path.basename(fields[1]))
        elif fields[1].startswith(point.rstrip("/") + "/") and fields[2] == "cgroup2":
            unified.append(fields[1])
    if at == "cgroup2":
        return "v2", f"cgroup v2 (cgroup2 at {point})"
    if at == "tmpfs" and v1:
        hybrid = f", and cgroup2 at {unified[0]}: the hybrid layout" if unified else ""
        return "v1", f"cgroup v1 (a tmpfs at {point} holding {', '.join(sorted(v1))}{hybrid})"
    return None, f"no cgroup hierarchy at {point}" + (f" (a {at})" if at else "")
