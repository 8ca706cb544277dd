"""Issue 8, finding 7: Slurm gives a prolog no PATH. The sampler's Slurm tools (slurmd for
the GPU map, squeue for a job whose epilog never came) are configurable, found in the
usual places, and a failure to run them is logged, never silent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config, find_command
from slurm_gpu_eff.node import hooks
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.sampler import OrphanWatch, squeue_for


def test_a_bare_command_is_found_without_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert find_command("sh") in ("/usr/bin/sh", "/bin/sh", "/usr/sbin/sh")
    assert find_command("/opt/slurm/bin/squeue") == "/opt/slurm/bin/squeue"  # a path stays
    assert find_command("no-such-command-here") == "no-such-command-here"


def test_squeue_is_configurable_and_defaults_beside_sacct() -> None:
    assert squeue_for(Config(sacct="/opt/slurm/bin/sacct")) == "/opt/slurm/bin/squeue"
    assert squeue_for(Config(squeue="/site/bin/squeue")) == "/site/bin/squeue"


def test_a_squeue_that_cannot_run_is_logged_once(tmp_path: Path) -> None:
    log = tmp_path / "gpu1.log"
    watch = OrphanWatch(JobContext("42", "gpu1"), str(tmp_path / "absent" / "squeue"),
                        HookLog(str(log), "42", "sampler"))
    assert watch._listed_as_running() is True  # no proof the job ended: keep sampling
    assert watch._listed_as_running() is True
    lines = log.read_text().splitlines()
    assert len(lines) == 1
    assert "cannot run" in lines[0] and "[slurm] squeue" in lines[0]


def test_a_sampler_without_slurmds_gpu_map_says_so(hook_site: Any) -> None:
    hook_site.configure(slurm={"slurmd": str(hook_site.root / "absent" / "slurmd")})
    env = hook_site.export(hook_site.env())
    hooks.main(["prolog"], env)
    pid = hook_site.sampler_pid()
    end = time.monotonic() + 10
    while "sampling" not in hook_site.log():
        assert time.monotonic() < end, f"sampler {pid} did not start sampling"
        time.sleep(0.02)
    hooks.main(["epilog"], env)
    assert "-G' gave no GPU list ([slurm] slurmd): Slurm's GPU indexes are taken as device minors" \
        in hook_site.log()
