"""mirror.py and the deliverer's AdminComment mirror (issue 8: optional, off by default):
one line that survives Slurm 22.05's lowercasing and carries no user-chosen text."""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config, load_config
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.mirror import admin_comment, parse_admin_comment
from slurm_gpu_eff.model import RUNNING
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.store.deliver import admin_comments, deliver_until_done
from slurm_gpu_eff.store.sqlite import SqliteStore

Factory = Callable[..., Any]
GIB = 1024**3


def test_the_line_says_what_the_report_says_in_words_slurm_keeps(
    make_summary: Factory, make_gpu: Factory,
) -> None:
    busy = make_gpu(node="gpu1", minor=0, util=90.0, mem_used=60 * GIB)
    idle = make_gpu(node="gpu1", minor=1, util=0.5, mem_used=1 * GIB)
    shared = make_gpu(node="gpu2", minor=0, util=80.0, mem_used=8 * GIB)
    shared.shared_s = 100.0  # another job ran on it: this job is charged its own share
    shared.metrics["own_util"] = {"mean": 20.0}
    for g, joules in ((busy, 3.6e6), (idle, 0.0), (shared, 1.8e6)):
        g.sampled_s, g.energy_j = 3600.0, joules
    line = admin_comment([make_summary(node="gpu2", gpus=[shared]),
                          make_summary(node="gpu1", gpus=[busy, idle])])
    assert line == ("gpueff1 status=complete nodes=2 gpus=3 util=36.8 gpu_util=90.0,0.5,20.0 "
                    "idle=1 mem_peak=75.0 energy_kwh=1.500")
    allowed = set(string.ascii_lowercase + string.digits + " =.,-_")
    assert set(line) <= allowed  # nothing for sacctmgr's lowercasing to change
    assert parse_admin_comment(line.upper()) == parse_admin_comment(line) != None  # noqa: E711
    assert parse_admin_comment("ticket 4711: node rebooted") is None  # a site's own comment


def test_figures_not_measured_are_dashes_not_zeros(make_summary: Factory) -> None:
    line = admin_comment([make_summary(status="missing", reason="no sampler", utils=())])
    assert line == ("gpueff1 status=missing nodes=1 gpus=0 util=- gpu_util=- idle=0 "
                    "mem_peak=- energy_kwh=-")


def fake_slurm(tmp_path: Path, scontrol: str = "", sacctmgr: str = "", sacct: str = "") -> Config:
    """scontrol, sacctmgr and sacct that record their arguments (one call a line, in
    calls.log) and say or print what they are given (an error: exit 1)."""
    def command(name: str, answer: str) -> str:
        path = tmp_path / name
        fail = answer.startswith("error:")
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls.log\n'
                        + (f"echo '{answer[6:]}' >&2\nexit 1\n" if fail else f"printf '%s\\n' '{answer}'\n"))
        path.chmod(0o755)
        return str(path)

    return Config(admin_comment=True, scontrol=command("scontrol", scontrol),
                  sacctmgr=command("sacctmgr", sacctmgr), sacct=command("sacct", sacct))


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


LINE = ("gpueff1 status=complete nodes=2 gpus=2 util=50.0 gpu_util=90.0,10.0 idle=0 "
        "mem_peak=25.0 energy_kwh=0.500")


def deliver_two_nodes(tmp_path: Path, config: Config, make_summary: Factory) -> None:
    spool = Spool(str(tmp_path / "spool"))
    store_path = str(tmp_path / "gpueff.db")
    with SqliteStore(store_path) as store:
        store.put(make_summary(node="gpu2", utils=(10.0,)))  # the other node came first
    spool.post(make_summary(node="gpu1", utils=(90.0,)))
    spool.post(make_summary(job_id="77", status=RUNNING))  # a live copy is not mirrored
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    result = deliver_until_done(spool, lambda: SqliteStore(store_path), config, log)
    assert result is not None and result.delivered == 2


def test_while_slurmctld_holds_the_job_the_line_goes_through_it(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """Checked on Slurm 22.05: the job's end record carries slurmctld's AdminComment into
    the database over anything written there before; so slurmctld's copy first."""
    deliver_two_nodes(tmp_path, fake_slurm(tmp_path), make_summary)
    assert calls(tmp_path) == [f"scontrol update jobid=4242 AdminComment={LINE}"]


def test_a_finished_job_gets_it_in_the_database_read_back_and_written_again_if_overtaken(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, scontrol="error:Job has already finished for job 4242",
                        sacct="")  # the end record overtook our write: nothing there
    deliver_two_nodes(tmp_path, config, make_summary)
    database = f"sacctmgr -i modify job where jobid=4242 cluster=gpueffdev set AdminComment={LINE}"
    assert calls(tmp_path) == [
        f"scontrol update jobid=4242 AdminComment={LINE}", database,
        "sacct -j 4242 -X -n -P --format=AdminComment",
        f"scontrol update jobid=4242 AdminComment={LINE}", database]


def test_a_line_read_back_lowercased_is_not_written_twice(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, scontrol="error:Invalid job id specified", sacct=LINE.lower())
    deliver_two_nodes(tmp_path, config, make_summary)
    assert len(calls(tmp_path)) == 3  # scontrol, sacctmgr, the read-back: no second write


def test_a_mirror_that_fails_is_logged_and_costs_the_store_nothing(
    tmp_path: Path, make_summary: Factory,
) -> None:
    spool = Spool(str(tmp_path / "spool"))
    store_path = str(tmp_path / "gpueff.db")
    spool.post(make_summary())
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    config = fake_slurm(tmp_path, scontrol="error:Access/permission denied")
    from slurm_gpu_eff.store import deliver as module

    result = module._attempt(spool, lambda: SqliteStore(store_path), log, mirror=admin_comments(config))
    assert result is not None and result.delivered == 1
    assert ("job 4242: its AdminComment was not written: scontrol could not set job 4242's "
            "AdminComment: Access/permission denied") in (tmp_path / "log").read_text()


def test_admin_comment_is_a_true_or_false_setting_off_by_default(tmp_path: Path) -> None:
    assert Config().admin_comment is False
    conf = tmp_path / "gpueff.conf"
    conf.write_text("[slurm]\nadmin_comment = yes\nsacctmgr = /opt/slurm/bin/sacctmgr\n")
    config = load_config(str(conf))
    assert config.admin_comment is True and config.sacctmgr == "/opt/slurm/bin/sacctmgr"
    conf.write_text("[slurm]\nadmin_comment = maybe\n")
    with pytest.raises(ConfigError, match="admin_comment = 'maybe': say true or false"):
        load_config(str(conf))

