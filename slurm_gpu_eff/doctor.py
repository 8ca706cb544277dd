"""`gpueff doctor`: is this host ready? Each check says in plain words what it found and,
when it failed, the fix. On a GPU node (slurmd knows GPUs for it), on the controller or a
login node: what does not apply to the host is skipped, and says so."""

from __future__ import annotations

import glob
import os
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .config import Config, config_path, find_command, load_config
from .errors import GpuEffError

NVIDIA_MAJOR = 195  # /dev/nvidia[0-9]*: the driver's character devices
EXAMPLE = "etc/gpueff.toml.example"


@dataclass
class Check:
    name: str
    ok: bool
    message: str
    fix: str = ""


def examine(path: str | None = None, node: str = "") -> tuple[bool, list[Check]]:
    """Every check, in the order a site installs: (ready, checks)."""
    config, checks = _config(path)
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    # as slurmd runs the hooks: the node's name and the config in the environment (what
    # the sampler sees; the simulated NVML of the development cluster reads them too)
    os.environ["SLURMD_NODENAME"] = node
    if config.path:
        os.environ["GPUEFF_CONFIG"] = config.path
    slurm = _slurm_config(config)
    checks += _hooks(slurm)
    files = _gres(config, node)
    if files is None:
        checks.append(Check("gpus", True, f"slurmd knows no GPU for node {node!r}: not a GPU node, "
                                          "the GPU checks are skipped (--node NAME to name one)"))
    else:
        checks += [_nvml(config, files), _devices(files), _spool(config, node)]
    checks += [_store(config), _accounting(config)]
    return all(c.ok for c in checks), checks


def as_dict(ready: bool, checks: list[Check]) -> dict[str, object]:
    return {"ready": ready, "checks": [asdict(c) for c in checks]}


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
    """`scontrol show config` as {key: value}; None when slurmctld cannot be asked."""
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


def _hook(slurm: dict[str, str], key: str, name: str) -> Check:
    value = slurm.get(key, "")
    fix = (f"{key}=/PATH/TO/VENV/bin/{name} in slurm.conf (an absolute path; the venv's own), "
           "then `scontrol reconfigure`")
    if value in ("", "(null)"):
        return Check(key, False, f"slurm.conf has no {key} line", fix)
    # Prolog and Epilog may be comma-separated lists, each entry a glob (prolog.d/*)
    paths = [p for entry in value.split(",") for p in (glob.glob(entry.strip()) or [entry.strip()])]
    ours = [p for p in paths if os.path.basename(p) == name or _mentions(p, name)]
    if not ours:
        return Check(key, False, f"{key}={value} does not run {name}", fix)
    if not all(os.access(p, os.X_OK) for p in ours):
        return Check(key, False, f"{key}={value}: {ours[0]} is not an executable file here", fix)
    return Check(key, True, f"{key}={value}")


def _mentions(path: str, name: str) -> bool:
    """A site's own wrapper that calls ours (the development cluster's do)."""
    try:
        with open(path, "rb") as handle:
            return name.encode() in handle.read(65536)
    except OSError:
        return False


# -- the node ----------------------------------------------------------------------------------

def _gres(config: Config, node: str) -> list[list[str]] | None:
    from .node.binding import gres_gpu_files

    files = gres_gpu_files(node, config.slurmd)
    return files or None


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


def _devices(files: list[list[str]]) -> Check:
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
