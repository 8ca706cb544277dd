"""`gpueff doctor`: is this host ready? Each check says in plain words what it found and,
when it failed, the fix. On a GPU node (slurmd knows GPUs for it), on the controller or a
login node: what does not apply to the host is skipped, and says so."""

from __future__ import annotations

import glob
import grp
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .config import Config, config_path, find_command, load_config
from .errors import BindingError, GpuEffError

NVIDIA_MAJOR = 195  # /dev/nvidia[0-9]*: the driver's character devices
EXAMPLE = "etc/gpueff.toml.example"
MOUNTS = "/proc/self/mounts"  # what this host mounts (os.statvfs cannot tell cgroup2 from tmpfs)
UNSET = ("", "(null)")  # how `scontrol show config` prints a setting with no value
USER_PATH = "/usr/local/bin:/usr/bin:/bin"  # the PATH a login shell gives users (Debian's, less games)
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for the probes


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


def examine(path: str | None = None, node: str = "") -> tuple[bool, list[Check], list[Note]]:
    """Every check, in the order a site installs, and the notes: (ready, checks, notes).

    Not run as root, the checks of what only root (the hooks) and SlurmUser (the MailProg,
    the idle watch) may see are left out, and a failed `root` check says so: as a user,
    doctor would see a private spool or store as broken and give a wrong fix."""
    config, checks = _config(path)
    checks.append(_config_file(config, path))
    root = _euid() == 0
    if not root:
        checks.append(_not_root())
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    # as slurmd runs the hooks: the node's name and the config in the environment (what
    # the sampler sees; the simulated NVML of the development cluster reads them too)
    os.environ["SLURMD_NODENAME"] = node
    if config.path:
        os.environ["GPUEFF_CONFIG"] = config.path
    slurm = _slurm_config(config)
    checks.append(_venv(config))
    checks += _hooks(slurm)
    files, unreadable = _gres(config, node)
    if not files and not unreadable:
        checks.append(Check("gpus", True, f"slurmd knows no GPU for node {node!r}: not a GPU node, "
                                          "the GPU checks are skipped (--node NAME to name one)"))
    else:
        checks += [_nvml(config, files or []), _devices(files or [], unreadable, node)]
        checks += [_spool(config, node)] if root else []
        checks += [_export(config)] if config.export_dir else []
    checks += [_store(config)] if root else []
    checks += _controller(config, slurm) if root else []
    checks += [_accounting(config), _backend(config)]
    return all(c.ok for c in checks), checks, _notes(slurm) + _path_note(config)


def as_dict(ready: bool, checks: list[Check], notes: list[Note] | None = None) -> dict[str, object]:
    return {"ready": ready, "checks": [asdict(c) for c in checks],
            "notes": [asdict(n) for n in notes or []]}


def _config(path: str | None) -> tuple[Config, list[Check]]:
    where = config_path(path)
    try:
        config = load_config(path)
    except GpuEffError as exc:
        return Config(), [Check("config", False, str(exc),
                                f"correct the file ({EXAMPLE} lists every key, its type and default); "
                                "`gpueff config` shows what is read. The checks below use the defaults")]
    if config.path is None:
        return config, [Check("config", True, f"no {where}: the defaults are in force")]
    return config, [Check("config", True, f"{where} is valid")]


# -- who may change what root runs -------------------------------------------------------------

def _euid() -> int:
    return os.geteuid()


def _not_root() -> Check:
    uid = _euid()
    return Check("root", False, (
        f"doctor runs as {_user(uid)}, not root: the node spool, the store, and SlurmUser's mail spool, "
        "mail log and store access are root's (and SlurmUser's) alone to see, so those checks are left "
        "out rather than reported broken"),
        "run it as root: sudo gpueff doctor (on each GPU node, on slurmctld's host, on a login node)")


def _config_file(config: Config, path: str | None) -> Check:
    """The file names the interpreter root's hooks start ([hooks] python) and the NVML
    library they load: no user may change it, nor make it where there is none."""
    where = config_path(path)
    fix = f"chown root:root {where}; chmod 0644 {where}"
    try:
        info = os.stat(where)
    except OSError:
        info = None
    if info is not None and (info.st_uid != 0 or info.st_mode & 0o022):
        return Check("config-file", False, f"{where} is {_said(info)}: a user who can change it names the "
                                           "python that root's hooks run", fix)
    bad = _unsafe_dirs(where)
    if bad:
        return Check("config-file", False, (
            f"{bad[0][1]} is above {where}: a user who can change it can put a config of their own there, "
            "which names the python that root's hooks run"), _dir_fix(bad[0][0]))
    if info is None:
        return Check("config-file", True, f"no {where}; only root can make one")
    return Check("config-file", True, f"{where}: root's, mode {stat.S_IMODE(info.st_mode):o}, "
                                      "in directories only root can change")


def _venv(config: Config) -> Check:
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
    above = _unsafe_dirs(where)
    found = (_open_entries(venv) if venv else []) + [said for _, said in above + _unsafe_dirs(real)]
    info = os.stat(real)
    if info.st_uid != 0 or info.st_mode & 0o022:
        found.append(f"{real} ({_said(info)})")
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
            found.append(f"{directory} ({_said(info)})")
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
                found.append(f"{entry.path} ({_said(info)})")
    return sorted(found)


def _ancestors(path: str) -> list[tuple[str, bool]]:
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


def _unsafe_dirs(path: str, owners: tuple[int, ...] = (0,)) -> list[tuple[str, str]]:
    """The directories above `path`, as written and as links resolve it, that someone not
    among `owners` could change: (directory, what it is). Whoever may rename entries in one
    can put a link where root (or SlurmUser) then writes or reads. A sticky directory
    (/tmp) lets no user rename what is not theirs: safe above an existing path, not where
    the path is still to be made (a user could make it first)."""
    bad: list[tuple[str, str]] = []
    seen: set[str] = set()
    for directory, made_here in _ancestors(path) + _ancestors(os.path.realpath(path)):
        if directory in seen:
            continue
        seen.add(directory)
        try:
            info = os.stat(directory)
        except OSError:
            continue
        open_ = info.st_mode & 0o022 and (made_here or not info.st_mode & stat.S_ISVTX)
        if info.st_uid not in owners or open_:
            bad.append((directory, f"{directory} ({_said(info)})"))
    return bad


def _dir_fix(directory: str) -> str:
    return f"chown root {directory}; chmod go-w {directory} (or keep the file elsewhere)"


def _said(info: os.stat_result) -> str:
    return f"owner {_user(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):o}"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


# -- Slurm's configuration ---------------------------------------------------------------------

def _slurm_config(config: Config) -> dict[str, str] | None:
    """`scontrol show config` as {key: value}; None when slurmctld cannot be asked.

    Slurm prints every setting as "%-23s = %s" (slurm_print_key_pairs, src/api/config_info.c),
    then the cgroup.conf in force under "Cgroup Support Configuration:" in the same shape
    when a cgroup plugin is in use (_fill_ctld_conf, src/slurmctld/proc_req.c). Keys do not
    repeat across the sections, so one dict holds them all."""
    done = _run([find_command(config.scontrol), "show", "config"])
    if done is None or done.returncode != 0:
        return None
    settings = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.strip()] = value.strip()
    return settings


def _hooks(slurm: dict[str, str] | None) -> list[Check]:
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
            return Check(key, False, f"{shown}: {path} is {_said(info)}, and it runs {runs}",
                         f"chown root:root {path}; chmod 0755 {path}")
        bad = _unsafe_dirs(path)
        if bad:
            return Check(key, False, f"{shown}: {bad[0][1]} is above {path}, which runs {runs}",
                         _dir_fix(bad[0][0]))
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


# -- the release, the cgroup version, what weakens measurement (notes) -----------------------

def _notes(slurm: dict[str, str] | None) -> list[Note]:
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


def _path_note(config: Config) -> list[Note]:
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


# -- the node ----------------------------------------------------------------------------------

def _gres(config: Config, node: str) -> tuple[list[list[str]] | None, str]:
    """The node's GPU positions and their device files, or why they cannot be read (GPU
    lines without File=: Slurm accepts gres.conf's `Name=gpu Count=N`, but the sampler then
    has no device to bind a job's GPUs to). From the node's GPU map, as the sampler reads
    it: on 24.11+ each run of `slurmd -G` disturbs the node's running steps, so slurmd is
    asked only where the map is missing or stale (and root then renews it)."""
    from .node.binding import gpu_files

    try:
        return gpu_files(node, config.slurmd, config.gpu_map_for(node)), ""
    except BindingError as exc:
        return None, str(exc)


def _nvml(config: Config, files: list[list[str]]) -> Check:
    from .node.binding import char_minor
    from .node.gpu import inventory

    try:
        driver, gpus = inventory(config)
    except GpuEffError as exc:
        return Check("nvml", False, str(exc),
                     "install the NVIDIA driver (its libnvidia-ml.so.1), or name the library in "
                     "[gpu] library; `nvidia-smi` must work on this node")
    described = "; ".join(
        f"minor {g['minor']} {g['name']}: persistence {_word(g['persistence'])}, GPM {_word(g['gpm'])}"
        for g in gpus)
    found = {int(g["minor"]) for g in gpus if g["minor"] is not None}
    wanted = {m for m in (char_minor(f[0]) for f in files if not any("nvidia-caps" in p for p in f))
              if m is not None}
    if not wanted <= found:
        return Check("nvml", False, f"driver {driver}: slurmd's GPUs (minors {sorted(wanted)}) are not all "
                                    f"among NVML's (minors {sorted(found)})",
                     "make gres.conf name this node's /dev/nvidiaN files (or AutoDetect=nvml)")
    return Check("nvml", True, f"driver {driver or 'unknown'}, {len(gpus)} GPU(s): {described}")


def _word(flag: bool | None) -> str:
    return "unknown" if flag is None else ("on" if flag else "off")


def _devices(files: list[list[str]], unreadable: str = "", node: str = "") -> Check:
    if unreadable:
        return Check("gres", False, f"`slurmd -G -N {node}`: {unreadable}",
                     "name each GPU's device file in gres.conf (File=/dev/nvidia[0-3], MIG: the "
                     "/dev/nvidia-caps files) or use AutoDetect=nvml, then restart slurmd")
    bad = []
    for path in (p for position in files for p in position):
        try:
            info = os.stat(path)
        except OSError as exc:
            bad.append(f"{path}: {exc.strerror}")
            continue
        if not stat.S_ISCHR(info.st_mode):
            bad.append(f"{path} is not a character device")
        elif "nvidia-caps" not in path and os.major(info.st_rdev) != NVIDIA_MAJOR:
            bad.append(f"{path} is device {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}, "
                       f"not NVIDIA's (major {NVIDIA_MAJOR})")
    if bad:
        return Check("gres", False, "; ".join(bad),
                     "gres.conf's File= must name the GPUs' /dev/nvidiaN (MIG: /dev/nvidia-caps/...) "
                     "files; `slurmd -G` shows what slurmd reads")
    return Check("gres", True, f"{len(files)} GPU(s) in gres.conf, each an NVIDIA device")


def _spool(config: Config, node: str) -> Check:
    path = config.spool_for(node)
    fix = f"install -d -m 0700 -o root {path} (node-local storage; the hooks run as root)"
    bad = _unsafe_dirs(path)
    if bad:
        return Check("spool", False, (
            f"{bad[0][1]} is above {path}: a user who can change it can put a link in the spool's place, "
            "and root's hooks write through it"), _dir_fix(bad[0][0]))
    if os.path.isdir(path):
        info = os.stat(path)
        if info.st_uid != 0 or info.st_mode & 0o077:
            return Check("spool", False, f"{path} is owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}: "
                                         "others could read or forge summaries", fix)
        if not os.access(path, os.W_OK):
            return Check("spool", False, f"{path} is not writable", fix)
        return Check("spool", True, f"{path}: root's, 0700")
    parent = _existing_parent(path)
    if parent is None or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        return Check("spool", False, f"{path} does not exist and cannot be made ({parent} is not a "
                                     "writable directory)", fix)
    return Check("spool", True, f"{path} will be made by the first GPU job (under {parent})")


def _existing_parent(path: str) -> str | None:
    parent = os.path.dirname(path.rstrip("/"))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent or None


def _export(config: Config) -> Check:
    """node_exporter's textfile directory: root's sampler writes each job's figures there,
    node_exporter serves what it finds. The sampler does not make it."""
    path = config.export_dir
    fix = (f"install -d -m 0755 -o root -g root {path} (node_exporter's --collector.textfile.directory: "
           "root writes, the exporter reads)")
    if not os.path.isdir(path):
        return Check("export", False, f"[export] textfile_dir {path} is not a directory: no job's figures "
                                      "are exported", fix)
    info = os.stat(path)
    if info.st_uid != 0 or info.st_mode & 0o022:
        return Check("export", False, (
            f"{path} is {_said(info)}: a user could put files there that node_exporter serves beside ours, "
            "or replace ours"), f"chown root:root {path}; chmod 0755 {path}")
    bad = _unsafe_dirs(path)
    if bad:
        return Check("export", False, f"{bad[0][1]} is above {path}: a user could put another directory "
                                      "in its place", _dir_fix(bad[0][0]))
    return Check("export", True, f"{path}: root's, mode {stat.S_IMODE(info.st_mode):o}")


# -- the store and the accounting -------------------------------------------------------------

def _store(config: Config) -> Check:
    """Reachable with the writers' URL, and its schema, read without changing it (the
    next delivery migrates a store that is behind)."""
    from .store import open_store
    from .store.base import SCHEMA, shown_url

    url = config.store_url
    fix = ("make [store] name a store the hooks (root) can write: a SQLite path on storage every "
           "GPU node reaches, or a PostgreSQL URL whose server answers (see docs/install.md)")
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else None
    if path is not None and not os.path.exists(path):
        parent = _existing_parent(path)
        if parent is None or not os.access(parent, os.W_OK):
            return Check("store", False, f"{path} does not exist and {parent} is not writable", fix)
        return Check("store", True, f"{path} will be made by the first delivery")
    try:
        with open_store(url, readonly=True) as store:
            applied = store.schema()
    except GpuEffError as exc:
        return Check("store", False, f"{shown_url(url)}: {exc}", fix)
    except Exception as exc:  # a driver's own error: said, not raised
        return Check("store", False, f"{shown_url(url)}: {type(exc).__name__}: {exc}", fix)
    behind = [name for name in SCHEMA if name not in applied]
    if path is not None:
        info = os.stat(path)
        if info.st_uid != 0 or info.st_mode & 0o137:
            return Check("store", False, f"{path} is owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}: "
                                         "users could read it or stall the writers",
                         f"chown root:{config.store_admin_group or 'root'} {path}; chmod 0640 {path}")
    return Check("store", True, f"{shown_url(url)}: reachable, " + (
        f"schema behind by {', '.join(behind)} (the next delivery upgrades it)" if behind
        else f"schema current ({SCHEMA[-1]})"))


# -- slurmctld's host: what SlurmUser needs (the MailProg, the idle watch) ----------------------

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


def _controller(config: Config, slurm: dict[str, str] | None) -> list[Check]:
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
    return _run([sys.executable, "-I", "-c", code, *args], user=who.uid, group=who.gid,
                extra_groups=list(who.groups), cwd="/", env={"PATH": os.defpath, "LANG": "C.UTF-8"})


def _blocked(who: Account, path: str, want: str, make: str = "wx") -> tuple[str, str] | None:
    """Where `who` is stopped on its way to `want` ("r", "w", "rwx") on `path`: every
    directory above it passed through, and `path`, or where it is still to be made (`make`
    on that directory; "" asks nothing of it). None: nowhere."""
    chain = _ancestors(path)
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
    bad = _unsafe_dirs(path, owners=(0, who.uid))
    if not bad:
        return None
    return Check(name, False, (f"{bad[0][1]} is above {what} {path}: a user who can change it can put a "
                               "link where SlurmUser writes"), _dir_fix(bad[0][0]))


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
                f"{path} is {_said(info)}, not {who.name}'s alone (0700): the MailProg and gpueff-mail "
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
    from .store.base import shown_url

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


def _accounting(config: Config) -> Check:
    done = _run([find_command(config.sacct), "-n", "-X", "-j", "1", "--format=JobID"])
    if done is None or done.returncode != 0:
        said = "no answer" if done is None else (done.stderr.strip().splitlines() or ["exit status"])[-1]
        return Check("accounting", False, f"sacct: {said}",
                     "slurmdbd must run and slurm.conf name it (AccountingStorageType="
                     "accounting_storage/slurmdbd): reports and users' figures come from sacct")
    return Check("accounting", True, "sacct answers")


def _backend(config: Config) -> Check:
    """Which way gpueff asks Slurm here, and why ([slurm] backend)."""
    from .slurm.access import connect

    try:
        slurm = connect(config)
    except GpuEffError as exc:
        return Check("slurm backend", False, str(exc),
                     "build pyslurm for this Slurm's release (docs/install.md), or set [slurm] backend "
                     "= \"auto\" (pyslurm where it matches, else Slurm's commands)")
    return Check("slurm backend", True, f"{slurm.name}: {slurm.why}")


def _run(command: list[str], timeout: float = 15.0,
         runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
         **options: object) -> subprocess.CompletedProcess[str] | None:
    try:
        return runner(command, capture_output=True, text=True, timeout=timeout, check=False, **options)
    except (OSError, subprocess.SubprocessError):
        return None
