"""`gpueff doctor`: is this host ready? Each check says in plain words what it found and,
when it failed, the fix. On a GPU node (slurmd knows GPUs for it), on the controller or a
login node: what does not apply to the host is skipped, and says so."""

from __future__ import annotations

import glob
import os
import re
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .config import Config, config_path, find_command, load_config
from .errors import BindingError, GpuEffError

NVIDIA_MAJOR = 195  # /dev/nvidia[0-9]*: the driver's character devices
EXAMPLE = "etc/gpueff.toml.example"
MOUNTS = "/proc/self/mounts"  # what this host mounts (os.statvfs cannot tell cgroup2 from tmpfs)
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


def examine(path: str | None = None, node: str = "") -> tuple[bool, list[Check], list[Note]]:
    """Every check, in the order a site installs, and the notes: (ready, checks, notes)."""
    config, checks = _config(path)
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    # as slurmd runs the hooks: the node's name and the config in the environment (what
    # the sampler sees; the simulated NVML of the development cluster reads them too)
    os.environ["SLURMD_NODENAME"] = node
    if config.path:
        os.environ["GPUEFF_CONFIG"] = config.path
    slurm = _slurm_config(config)
    checks += _hooks(slurm)
    files, unreadable = _gres(config, node)
    if not files and not unreadable:
        checks.append(Check("gpus", True, f"slurmd knows no GPU for node {node!r}: not a GPU node, "
                                          "the GPU checks are skipped (--node NAME to name one)"))
    else:
        checks += [_nvml(config, files or []), _devices(files or [], unreadable, node), _spool(config, node)]
    checks += [_store(config), _accounting(config)]
    return all(c.ok for c in checks), checks, _notes(slurm)


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
    return notes


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


def _accounting(config: Config) -> Check:
    done = _run([find_command(config.sacct), "-n", "-X", "-j", "1", "--format=JobID"])
    if done is None or done.returncode != 0:
        said = "no answer" if done is None else (done.stderr.strip().splitlines() or ["exit status"])[-1]
        return Check("accounting", False, f"sacct: {said}",
                     "slurmdbd must run and slurm.conf name it (AccountingStorageType="
                     "accounting_storage/slurmdbd): reports and users' figures come from sacct")
    return Check("accounting", True, "sacct answers")


def _run(command: list[str], timeout: float = 15.0,
         runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
         ) -> subprocess.CompletedProcess[str] | None:
    try:
        return runner(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
