"""`gpueff doctor`: is this host ready? Each check says in plain words what it found and,
when it failed, the fix. On a GPU node (slurmd knows GPUs for it), on the controller or a
login node: what does not apply to the host is skipped, and says so."""

from __future__ import annotations

import os
import socket
from dataclasses import asdict

from ..config import Config, config_path, load_config
from ..errors import GpuEffError
from . import controller, gpunode, install, notes, services, slurmconf
from .base import Check, Note

__all__ = ["Check", "Note", "as_dict", "examine"]

EXAMPLE = "etc/gpueff.toml.example"


def examine(path: str | None = None, node: str = "") -> tuple[bool, list[Check], list[Note]]:
    """Every check, in the order a site installs, and the notes: (ready, checks, notes).

    Not run as root, the checks of what only root (the hooks) and SlurmUser (the MailProg,
    the idle watch) may see are left out, and a failed `root` check says so: as a user,
    doctor would see a private spool or store as broken and give a wrong fix."""
    config, checks = _config(path)
    checks.append(install.config_file(config, path))
    uid = _euid()
    root = uid == 0
    if not root:
        checks.append(install.not_root(uid))
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    # as slurmd runs the hooks: the node's name and the config in the environment (what
    # the sampler sees; the simulated NVML of the development cluster reads them too)
    os.environ["SLURMD_NODENAME"] = node
    if config.path:
        os.environ["GPUEFF_CONFIG"] = config.path
    slurm = slurmconf.slurm_config(config)
    checks.append(install.venv(config))
    checks += slurmconf.hooks(slurm)
    files, unreadable = gpunode.gres(config, node)
    if not files and not unreadable:
        checks.append(Check("gpus", True, f"slurmd knows no GPU for node {node!r}: not a GPU node, "
                                          "the GPU checks are skipped (--node NAME to name one)"))
    else:
        checks += [gpunode.nvml(config, files or []), gpunode.devices(files or [], unreadable, node)]
        checks += [gpunode.spool(config, node)] if root else []
        checks += [gpunode.export(config)] if config.export_dir else []
    checks += [services.store(config)] if root else []
    checks += controller.checks(config, slurm) if root else []
    checks += [services.accounting(config), services.backend(config)]
    return all(c.ok for c in checks), checks, notes.notes(slurm) + notes.path_note(config)


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


def _euid() -> int:
    return os.geteuid()
