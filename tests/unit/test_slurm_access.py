"""The choice of backend (slurm/access.py): `[slurm] backend` and what auto does where
pyslurm is absent or built for another release."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_gpu_eff.config import Config, load_config
from slurm_gpu_eff.errors import ConfigError, SlurmError
from slurm_gpu_eff.slurm import inproc
from slurm_gpu_eff.slurm.access import connect
from slurm_gpu_eff.slurm.commands import Commands
from tests.configfile import write_config


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
    """libslurm, finding no configuration, looks for a configless controller in DNS and
    then ends the process (fatal()): `import pyslurm` would kill gpueff with exit status 1."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    monkeypatch.setitem(sys.modules, "pyslurm", object())  # would be "usable" if looked at
    ok, why = inproc.usable()
    assert not ok and "no slurm.conf readable here" in why
    assert "no slurm.conf" in connect(Config()).why


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
