"""`gpueff doctor` on a site in tmp_path: the real pynvml over the stand-in NVML library,
real device files (mknod, as root), a real SQLite store, and stand-ins for Slurm's
commands (scontrol's config, slurmd's GPU list, sacct). Ready when all is right; each
broken setup named with its fix and a non-zero exit status."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff import cli
from slurm_gpu_eff.doctor import examine
from slurm_gpu_eff.store import open_store
from tests import standin
from tests.configfile import write_config

SIM_DEVICES = {"gpu1": [
    {"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": "NVIDIA H100 (sim)",
     "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 0.5},
    {"minor": 1, "uuid": "GPU-11111111-1111-1111-1111-111111111111", "name": "NVIDIA H100 (sim)",
     "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 0.5},
]}


def command(path: Path, script: str) -> str:
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


class Site:
    """A node `gpu1` with two GPUs; `settings` are the config file's, changed by a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        dev = root / "dev"
        dev.mkdir()
        for minor in (0, 1):
            try:
                os.mknod(dev / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
            except PermissionError:
                pytest.skip("mknod needs root (CI runs as root)")
        (root / "devices.json").write_text(json.dumps(SIM_DEVICES))
        (root / "state" / "gpu1").mkdir(parents=True)
        hooks = {name: command(root / name, f"exec /opt/venv/bin/{name} \"$@\"\n")
                 for name in ("gpueff-prolog", "gpueff-epilog", "gpueff-mail")}
        self.slurm_conf = {"Prolog": hooks["gpueff-prolog"], "Epilog": hooks["gpueff-epilog"],
                           "MailProg": hooks["gpueff-mail"], "PrologFlags": "Alloc,Contain"}
        self.gres = f"{dev}/nvidia[0-1]"
        (root / "spool").mkdir(mode=0o700)
        self.settings: dict[str, dict[str, Any]] = {
            "gpu": {"library": standin.library_path()},
            "sim": {"devices": str(root / "devices.json"), "state_dir": str(root / "state")},
            "spool": {"dir": str(root / "spool" / "%n")},
            "store": {"path": str(root / "store" / "gpueff.db")},
            "log": {"file": str(root / "log" / "%n.log")},
            "slurm": {"scontrol": str(root / "scontrol"), "slurmd": str(root / "slurmd"),
                      "sacct": command(root / "sacct", "exit 0\n")},
        }
        (root / "store").mkdir()
        open_store(f"sqlite://{root / 'store' / 'gpueff.db'}").close()  # made by a delivery

    def write(self) -> str:
        lines = "".join(f"{k} = {v}\\n" for k, v in self.slurm_conf.items())
        command(self.root / "scontrol", f'[ "$1 $2" = "show config" ] && printf "{lines}"\n')
        command(self.root / "slurmd", f'echo "slurmd: Gres Name=gpu Type=h100 Count=2 Index=0 ID=1 '
                                      f'File={self.gres} (null)" >&2\n')
        return str(write_config(self.root / "gpueff.toml", self.settings))

    def examine(self) -> tuple[bool, dict[str, Any]]:
        ready, checks = examine(self.write(), "gpu1")
        return ready, {c.name: c for c in checks}


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def test_a_ready_node(site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    ready, checks = site.examine()
    assert ready, [c for c in checks.values() if not c.ok]
    assert list(checks) == ["config", "Prolog", "Epilog", "MailProg", "PrologFlags", "nvml", "gres",
                            "spool", "store", "accounting"]
    assert checks["nvml"].message.startswith("driver ") and "2 GPU(s): minor 0 NVIDIA H100 (sim)" in \
        checks["nvml"].message and "GPM " in checks["nvml"].message
    assert "schema current" in checks["store"].message
    assert cli.main(["doctor", "--json", "--node", "gpu1", "--config", site.write()]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ready"] is True and {tuple(c) for c in out["checks"]} == {("name", "ok", "message", "fix")}
    assert cli.main(["doctor", "--node", "gpu1", "--config", site.write()]) == 0
    assert capsys.readouterr().out.rstrip().endswith("Ready.")


def broken_prolog(site: Site) -> None:
    del site.slurm_conf["Prolog"]


def broken_spool(site: Site) -> None:
    (site.root / "afile").write_text("")
    site.settings["spool"]["dir"] = str(site.root / "afile" / "spool" / "%n")


def broken_key(site: Site) -> None:
    site.settings["sampler"] = {"intervall_s": 1}


def broken_gres(site: Site) -> None:
    (site.root / "notadevice").write_text("")
    site.gres = f"{site.root / 'dev' / 'nvidia0'},{site.root / 'notadevice'}"


def broken_store(site: Site) -> None:
    site.settings["store"] = {"url": "postgresql://gpueff@127.0.0.1:1/gpueff?connect_timeout=2"}


def broken_nvml(site: Site) -> None:
    site.settings["gpu"]["library"] = str(site.root / "no" / "libnvidia-ml.so.1")


def broken_flags(site: Site) -> None:
    site.slurm_conf["PrologFlags"] = "Contain"


def broken_accounting(site: Site) -> None:
    command(site.root / "sacct", 'echo "sacct: error: Problem talking to the database" >&2; exit 1\n')


@pytest.mark.parametrize(("breaks", "name", "said", "fix"), [
    (broken_prolog, "Prolog", "slurm.conf has no Prolog line", "Prolog=/PATH/TO/VENV/bin/gpueff-prolog"),
    (broken_spool, "spool", "does not exist and cannot be made", "install -d -m 0700 -o root"),
    (broken_key, "config", "line 17: [sampler] intervall_s: unknown setting", "etc/gpueff.toml.example"),
    (broken_gres, "gres", "notadevice is not a character device", "gres.conf's File= must name"),
    (broken_store, "store", "postgresql://gpueff@127.0.0.1:1/gpueff", "PostgreSQL URL whose server answers"),
    (broken_nvml, "nvml", "cannot load the NVML library", "install the NVIDIA driver"),
    (broken_flags, "PrologFlags", "PrologFlags=Contain", "PrologFlags=Alloc"),
    (broken_accounting, "accounting", "Problem talking to the database", "slurmdbd must run"),
], ids=lambda x: getattr(x, "__name__", None))
def test_each_broken_setup_is_named_with_its_fix(site: Site, capsys: pytest.CaptureFixture[str],
                                                breaks: Any, name: str, said: str, fix: str) -> None:
    breaks(site)
    ready, checks = site.examine()
    assert not ready
    failed = [c.name for c in checks.values() if not c.ok]
    if name == "config":  # the checks after it run on the defaults, which this site is not
        assert failed[0] == name and "The checks below use the defaults" in checks[name].fix
    else:
        assert failed == [name], [checks[n] for n in failed]
    assert said in checks[name].message and fix in checks[name].fix
    assert cli.main(["doctor", "--node", "gpu1", "--config", site.write()]) == cli.NOT_READY
    out = capsys.readouterr().out
    assert f"FAIL {name}: " in out and "Not ready: " in out


def test_a_host_that_is_no_gpu_node_skips_the_gpu_checks(site: Site) -> None:
    command(site.root / "slurmd", 'echo "slurmd: error: no such node" >&2; exit 1\n')
    ready, checks = examine(str(write_config(site.root / "gpueff.toml", site.settings)), "login1")
    names = [c.name for c in checks]
    assert "nvml" not in names and "gpus" in names


def test_an_open_store_file_is_named(site: Site) -> None:
    os.chmod(site.root / "store" / "gpueff.db", 0o644)
    ready, checks = site.examine()
    assert not ready and "mode 644" in checks["store"].message and "chmod 0640" in checks["store"].fix


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor sets SLURMD_NODENAME and GPUEFF_CONFIG as slurmd would: undone after each test."""
    monkeypatch.setenv("SLURMD_NODENAME", "")
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)


def test_a_prolog_list_with_a_glob_that_runs_ours_is_fine(site: Site) -> None:
    (site.root / "prolog.d").mkdir()
    command(site.root / "prolog.d" / "10-site", "exit 0\n")
    command(site.root / "prolog.d" / "20-gpueff", 'exec /opt/venv/bin/gpueff-prolog "$@"\n')
    site.slurm_conf["Prolog"] = f"{site.root / 'other'},{site.root / 'prolog.d'}/*"
    ready, checks = site.examine()
    assert checks["Prolog"].ok, checks["Prolog"]
    site.slurm_conf["Prolog"] = f"{site.root / 'prolog.d'}/10-*"
    ready, checks = site.examine()
    assert not checks["Prolog"].ok and "does not run gpueff-prolog" in checks["Prolog"].message
