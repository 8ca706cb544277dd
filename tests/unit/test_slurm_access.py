"""The choice of backend (slurm/access.py): `[slurm] backend` and what auto does where
pyslurm is absent or built for another release."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_eff.config import Config, load_config
from slurm_gpu_eff.errors import ConfigError, SlurmError
from slurm_gpu_eff.slurm import inproc
from slurm_gpu_eff.slurm.access import connect
from slurm_gpu_eff.slurm.commands import Commands
from tests.configfile import write_config


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """usable()'s answer is kept for the process: each test asks anew."""
    monkeypatch.setattr(inproc, "_USABLE", [])
    monkeypatch.setattr(inproc, "_MODULE", [])
    monkeypatch.setattr(inproc, "_CONTROLLER", [])
    yield


def test_commands_when_asked_for() -> None:
    slurm = connect(Config(slurm_backend="commands", comment_field="SystemComment"))
    assert isinstance(slurm, Commands) and slurm.field == "SystemComment"
    assert "commands" in slurm.why


def test_auto_without_pyslurm_takes_the_commands_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # `import pyslurm` fails
    slurm = connect(Config())
    assert isinstance(slurm, Commands)
    assert "pyslurm" in slurm.why and "not installed" in slurm.why and "commands" in slurm.why


def test_without_a_slurm_conf_pyslurm_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    monkeypatch.setattr(inproc.importlib.util, "find_spec", lambda name: object())  # "installed"
    ok, why = inproc.usable()
    assert not ok and "no slurm.conf here" in why and "would end this process" in why
    assert "no slurm.conf here" in connect(Config()).why


@pytest.mark.skipif(importlib.util.find_spec("pyslurm") is None, reason="pyslurm is not built here")
@pytest.mark.skipif(any(os.path.exists(p) for p in inproc.CONFIG_PATHS), reason="this host has a slurm.conf")
def test_why_real_pyslurm_is_never_imported_without_a_slurm_conf() -> None:
    """libslurm, finding no configuration, looks for a configless controller in DNS and
    then ends the process (fatal()): no exception a caller could catch. (A SLURM_CONF
    naming a missing file is worse: libslurm retries for 60 s, then ends it.)"""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    done = subprocess.run([sys.executable, "-c", "import pyslurm; print('alive')"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 1 and "alive" not in done.stdout and "fatal" in done.stderr


def test_pyslurm_asked_for_but_unusable_is_an_error_not_a_silent_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    why = "pyslurm 24.11 is built for Slurm 24.11, this is 22.05"
    monkeypatch.setattr(inproc, "usable", lambda: (False, why))
    with pytest.raises(SlurmError, match="backend = \"pyslurm\", but pyslurm 24.11 is built for Slurm 24.11"):
        connect(Config(slurm_backend="pyslurm"))
    assert isinstance(connect(Config(slurm_backend="auto")), Commands)


def test_an_unknown_backend_is_refused_by_the_config(tmp_path: Path) -> None:
    path = write_config(tmp_path / "gpueff.toml", {"slurm": {"backend": "rest"}})
    with pytest.raises(ConfigError, match="backend"):
        load_config(str(path))
    with pytest.raises(SlurmError, match="one of auto, commands, pyslurm"):
        connect(Config(), want="rest")
