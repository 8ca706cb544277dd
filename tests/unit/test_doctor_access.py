"""`gpueff doctor` on who may change what root runs, and on what SlurmUser needs (issue 20,
findings 6, 9 and 10): the directories above the spool, the config file's mode, the venv
whose python the hooks run as root, the hook scripts, the export directory; on
slurmctld's host the mail spool, the mail log and the store as SlurmUser reaches them
(checked as that user: `nobody` here); and doctor run as a user, which says it must run
as root instead of calling root's files broken. Each on a site in tmp paths, as root
(the Site of test_doctor.py makes device files)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff import cli, doctor
from slurm_gpu_eff.store import open_store
from tests.unit.test_doctor import Site, _own_environment, command  # noqa: F401 (an autouse fixture)

NOBODY = 65534  # Debian's nobody and nogroup: SlurmUser here, a user without any of root's rights


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory that `nobody` can pass through (pytest's tmp_path is under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="gpueff-doctor-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def names(checks: dict[str, Any]) -> list[str]:
    return [name for name, check in checks.items() if not check.ok]


# -- who may change what root runs ----------------------------------------------------------------

def test_a_directory_above_the_spool_that_others_can_write_fails(site: Site) -> None:
    shared = site.root / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may rename the spool away and put a link there
    (shared / "spool").mkdir(mode=0o700)
    site.settings["spool"]["dir"] = str(shared / "spool")
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["spool"]
    assert f"{shared} (owner root, mode 777) is above {shared / 'spool'}" in checks["spool"].message
    assert checks["spool"].fix.startswith(f"chown root {shared}; chmod go-w {shared}")


def test_a_sticky_directory_is_safe_above_a_spool_but_not_where_one_is_still_to_be_made(site: Site) -> None:
    sticky = site.root / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: no user may rename what is not theirs
    (sticky / "spool").mkdir(mode=0o700)
    site.settings["spool"]["dir"] = str(sticky / "spool")
    ready, checks, _ = site.examine()
    assert ready, checks["spool"]
    (sticky / "spool").rmdir()  # a user could make it first, and root would use theirs
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["spool"] and "mode 1777" in checks["spool"].message


def test_a_config_file_any_user_can_write_fails(site: Site) -> None:
    config = site.write()
    os.chmod(config, 0o666)
    ready, checks, _ = doctor_on(site, config)
    assert not ready and names(checks) == ["config-file"]
    assert checks["config-file"].message == (f"{config} is owner root, mode 666: a user who can change it "
                                             "names the python that root's hooks run")
    assert checks["config-file"].fix == f"chown root:root {config}; chmod 0644 {config}"
    os.chmod(config, 0o644)
    (site.root / "conf").mkdir()
    (site.root / "conf").chmod(0o775)  # a group may write the directory
    config = site.root / "conf" / "gpueff.toml"
    shutil.copy(site.root / "gpueff.toml", config)
    ready, checks, _ = doctor_on(site, str(config))
    assert not ready and names(checks) == ["config-file"]
    assert f"{site.root / 'conf'} (owner root, mode 775) is above {config}" in checks["config-file"].message


def doctor_on(site: Site, config: str) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    ready, checks, notes = doctor.examine(config, "gpu1")
    return ready, {c.name: c for c in checks}, {n.name: n for n in notes}


def test_a_venv_owned_by_another_user_fails(site: Site) -> None:
    venv = site.root / "venv"
    site.write()
    if os.geteuid() == 0:
        os.chown(venv / "bin", NOBODY, NOBODY)  # that user could put any python there
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["venv"]
    assert checks["venv"].message.startswith(f"{venv} holds the python that root's hooks run, and users "
                                              f"could change it: {venv / 'bin'} (owner nobody, mode 755)")
    assert checks["venv"].fix == f"chown -R root:root {venv}; chmod -R go-w {venv}"
    os.chown(venv / "bin", 0, 0)
    (venv / "lib").mkdir()
    (venv / "lib" / "sitecustomize.py").write_text("")
    os.chmod(venv / "lib" / "sitecustomize.py", 0o664)  # a file its group may write, deep inside
    ready, checks, _ = site.examine()
    assert not ready
    assert f"{venv / 'lib' / 'sitecustomize.py'} (owner root, mode 664)" in checks["venv"].message
    os.chmod(venv / "lib" / "sitecustomize.py", 0o644)
    assert site.examine()[0]


def test_a_venv_in_a_directory_users_can_write_fails(site: Site) -> None:
    (site.root / "opt").mkdir()
    (site.root / "opt").chmod(0o777)
    venv = site.root / "opt" / "venv"
    shutil.move(site.root / "venv", venv)
    site.settings["hooks"]["python"] = str(venv / "bin" / "python")
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["venv"]
    assert f"{site.root / 'opt'} (owner root, mode 777)" in checks["venv"].message
    assert f"chmod go-w {site.root / 'opt'}" in checks["venv"].fix


def test_a_hook_script_users_can_write_fails(site: Site) -> None:
    os.chmod(site.etc / "prolog", 0o777)
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["Prolog"]
    assert (f"{site.etc / 'prolog'} is owner root, mode 777, and it runs as root in every GPU job"
            in checks["Prolog"].message)
    assert checks["Prolog"].fix == f"chown root:root {site.etc / 'prolog'}; chmod 0755 {site.etc / 'prolog'}"


def test_the_export_directory(site: Site) -> None:
    export = site.root / "textfile"
    site.settings["export"] = {"textfile_dir": str(export)}
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["export"] and "is not a directory" in checks["export"].message
    assert checks["export"].fix.startswith(f"install -d -m 0755 -o root -g root {export}")
    export.mkdir()
    export.chmod(0o777)
    ready, checks, _ = site.examine()
    assert not ready and "owner root, mode 777: a user could put files there" in checks["export"].message
    export.chmod(0o755)
    ready, checks, _ = site.examine()
    assert ready and checks["export"].message == f"{export}: root's, mode 755"


# -- slurmctld's host: SlurmUser's mail spool, mail log and store ----------------------------------

@pytest.fixture
def controller(site: Site, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """The site as slurmctld's host (the fixtures' SlurmctldHost is "vm"), SlurmUser
    `nobody`, its mail spool and log made as install.md makes them, the store where it
    can be reached, 0640 root:nogroup ([store] admin_group, nobody's group)."""
    if os.geteuid() != 0:
        pytest.skip("checks as another user need root")
    monkeypatch.setattr(doctor.controller, "_host_names", lambda: {"vm"})
    site.slurm_conf["SlurmUser"] = f"nobody({NOBODY})"
    (open_dir / "mail").mkdir(mode=0o700)
    os.chown(open_dir / "mail", NOBODY, NOBODY)
    (open_dir / "mail-log").mkdir(mode=0o700)
    os.chown(open_dir / "mail-log", NOBODY, NOBODY)
    (open_dir / "store").mkdir()
    store = open_dir / "store" / "gpueff.db"
    open_store(f"sqlite://{store}", admin_group="nogroup").close()
    site.settings["store"] = {"path": str(store), "admin_group": "nogroup"}
    site.settings["mail"] = {"spool_dir": str(open_dir / "mail"),
                             "log_file": str(open_dir / "mail-log" / "mail.log")}
    site.open_dir = open_dir  # type: ignore[attr-defined]
    return site


def test_a_controller_made_as_install_md_says_is_ready(controller: Site) -> None:
    ready, checks, _ = controller.examine()
    assert ready, [c for c in checks.values() if not c.ok]
    assert list(checks)[-5:] == ["mail-spool", "mail-log", "store-slurmuser", "accounting", "slurm backend"]
    where = controller.open_dir  # type: ignore[attr-defined]
    assert checks["mail-spool"].message == f"{where / 'mail'}: nobody's alone"
    log = where / "mail-log" / "mail.log"
    assert checks["mail-log"].message == f"{log}: nobody writes it, users cannot read it"
    store = where / "store" / "gpueff.db"
    assert checks["store-slurmuser"].message.startswith(f"nobody (SlurmUser) reads sqlite://{store}")


def test_a_mail_spool_in_root_s_node_spool_tree_fails(controller: Site) -> None:
    """Finding 6: the old defaults put the mail spool in the node spool's directory, which
    root's hooks make 0700: the MailProg (SlurmUser) cannot reach it."""
    node_root = controller.open_dir / "slurm-gpu-eff"  # type: ignore[attr-defined]
    node_root.mkdir(mode=0o700)
    controller.settings["mail"]["spool_dir"] = str(node_root / "mail")
    ready, checks, _ = controller.examine()
    assert not ready and names(checks) == ["mail-spool"]
    assert checks["mail-spool"].message == (
        f"nobody (SlurmUser) cannot pass through {node_root}, so cannot make the mail spool "
        f"{node_root / 'mail'}: the MailProg then sends Slurm's plain notice and the job's GPU report is "
        "silently dropped")
    assert checks["mail-spool"].fix == (
        f'[mail] spool_dir = "/var/spool/slurm-gpu-eff-mail" (the default: outside {node_root}, which is '
        "closed to nobody), and install -d -o nobody -g nogroup -m 0700 /var/spool/slurm-gpu-eff-mail")


def test_a_mail_spool_slurm_user_cannot_write_fails(controller: Site) -> None:
    spool = controller.open_dir / "mail"  # type: ignore[attr-defined]
    os.chown(spool, 0, 0)  # root's, 0700
    ready, checks, _ = controller.examine()
    assert not ready and names(checks) == ["mail-spool"]
    assert checks["mail-spool"].message.startswith(
        f"{spool} is owner root, mode 700, not nobody's alone (0700)")
    assert "GPU report is silently dropped" in checks["mail-spool"].message
    assert checks["mail-spool"].fix == f"chown -R nobody:nogroup {spool}; chmod 0700 {spool}"
    spool.rmdir()  # not there, and nobody may not make it in a root's 0755 directory
    ready, checks, _ = controller.examine()
    assert not ready and checks["mail-spool"].message.startswith(
        f"nobody (SlurmUser) cannot make entries in {spool.parent}, so cannot make the mail spool {spool}")
    assert checks["mail-spool"].fix == f"install -d -o nobody -g nogroup -m 0700 {spool}"
    os.chown(spool.parent, NOBODY, NOBODY)  # now it may (and makes it 0700, its own)
    ready, checks, _ = controller.examine()
    assert checks["mail-spool"].ok and "will be made by nobody's first mail" in checks["mail-spool"].message


def test_the_mail_log_as_slurm_user_writes_it(controller: Site) -> None:
    logs = controller.open_dir / "mail-log"  # type: ignore[attr-defined]
    os.chown(logs, 0, 0)  # root's, as the hooks' log directory is
    ready, checks, _ = controller.examine()
    assert not ready and names(checks) == ["mail-log"]
    assert checks["mail-log"].message.startswith(f"nobody (SlurmUser) cannot pass through {logs}")
    os.chown(logs, NOBODY, NOBODY)
    os.chmod(logs, 0o755)  # the MailProg would make its log 0644 there: readable by every user
    ready, checks, _ = controller.examine()
    assert not ready and checks["mail-log"].message == (
        f"{logs / 'mail.log'} would be made readable by every user (mode 644): it names users, jobs and "
        "their addresses")
    assert checks["mail-log"].fix == f"install -m 0600 -o nobody -g nogroup /dev/null {logs / 'mail.log'}"
    (logs / "mail.log").write_text("")
    os.chmod(logs / "mail.log", 0o600)  # root's file: nobody cannot append
    ready, checks, _ = controller.examine()
    log = logs / "mail.log"
    assert not ready and checks["mail-log"].message.startswith(f"nobody (SlurmUser) cannot write {log}")
    assert checks["mail-log"].fix == f"chown nobody:nogroup {log}; chmod 0600 {log}"
    os.chown(logs / "mail.log", NOBODY, NOBODY)
    assert controller.examine()[0]
    shutil.rmtree(logs)
    ready, checks, _ = controller.examine()
    assert not ready and checks["mail-log"].fix == f"install -d -o nobody -g nogroup -m 0700 {logs}"


def test_a_store_slurm_user_cannot_read_fails(controller: Site) -> None:
    store = controller.open_dir / "store" / "gpueff.db"  # type: ignore[attr-defined]
    os.chown(store, 0, 0)
    del controller.settings["store"]["admin_group"]  # root's alone, 0600, as without admin_group
    os.chmod(store, 0o600)
    ready, checks, _ = controller.examine()
    assert not ready and names(checks) == ["store-slurmuser"]
    assert checks["store-slurmuser"].message.startswith(
        f"nobody (SlurmUser, as whom the MailProg and the idle watch run) cannot read sqlite://{store}: "
        "StoreError: ")
    assert checks["store-slurmuser"].fix.startswith('[store] admin_group = "GROUP" (the file is then 0640 '
                                                    "root:GROUP); usermod -a -G GROUP nobody; then restart")
    store.unlink()  # not made yet: it will be 0600, root's
    ready, checks, _ = controller.examine()
    assert not ready and checks["store-slurmuser"].message.startswith(
        f"{store} will be made 0600, root's, which nobody (SlurmUser) cannot read")
    controller.settings["store"]["admin_group"] = "nogroup"
    ready, checks, _ = controller.examine()
    assert ready
    said = checks["store-slurmuser"].message
    assert said == f"{store} will be made 0640 root:nogroup; nobody is in nogroup"


def test_a_slurmctld_started_before_slurm_user_joined_the_group_fails(
        controller: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """usermod -a -G reaches processes started after it: slurmctld keeps its groups, and its
    MailProg with them."""
    store = controller.open_dir / "store" / "gpueff.db"  # type: ignore[attr-defined]
    os.chown(store, 0, 4242)  # a group nobody joined (in the account's groups below)
    nobody = doctor.controller.Account("nobody", NOBODY, NOBODY, (NOBODY, 4242))
    monkeypatch.setattr(doctor.controller, "_slurm_user", lambda slurm: nobody)
    pid_file = controller.root / "slurmctld.pid"
    for groups, ok in (([], False), ([4242], True)):
        slurmctld = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY, extra_groups=groups)
        try:
            pid_file.write_text(f"{slurmctld.pid}\n")
            ready, checks, _ = controller.examine()
        finally:
            slurmctld.kill()
            slurmctld.wait()
        assert checks["store-slurmuser"].ok == ok, checks["store-slurmuser"]
        if not ok:
            assert checks["store-slurmuser"].message.startswith(
                f"slurmctld (pid {slurmctld.pid}) runs without group 4242, which reads {store}: it started "
                "before nobody joined the group")
            assert checks["store-slurmuser"].fix.startswith("restart slurmctld and gpueff-mail's service")


def test_a_slurm_user_unknown_here_is_named(controller: Site) -> None:
    controller.slurm_conf["SlurmUser"] = "nosuchslurmuser(64999)"
    ready, checks, _ = controller.examine()
    assert not ready and names(checks) == ["SlurmUser"]
    assert checks["SlurmUser"].message == "SlurmUser 'nosuchslurmuser' is not a user on this host"


# -- doctor as a user ----------------------------------------------------------------------------

def test_doctor_as_a_user_says_it_must_run_as_root(site: Site, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """As a user, the spool and the store (root's alone) would read as broken, with a wrong
    fix: they are left out, and the `root` check says why."""
    monkeypatch.setattr(doctor, "_euid", lambda: NOBODY)
    monkeypatch.setattr(doctor.controller, "_host_names", lambda: {"vm"})  # slurmctld's host: no mail checks
    ready, checks, _ = site.examine()
    assert not ready and names(checks) == ["root"]
    assert checks["root"].message.startswith(
        "doctor runs as nobody, not root: the node spool, the store, and SlurmUser's mail spool")
    assert checks["root"].fix.startswith("run it as root: sudo gpueff doctor")
    assert not {"spool", "store", "mail", "mail-spool", "mail-log", "store-slurmuser"} & set(checks)
    assert {"config", "venv", "Prolog", "nvml", "gres", "accounting"} <= set(checks)
    assert cli.main(["doctor", "--node", "gpu1", "--config", site.write()]) == cli.NOT_READY
    out = capsys.readouterr().out
    assert "FAIL root: doctor runs as nobody, not root" in out and "Not ready: 1 check(s) failed." in out


# -- notes: what a site misses in slurm.conf and on users' PATH ---------------------------------------

def test_no_job_accounting_gather_is_a_warning(site: Site) -> None:
    site.slurm_conf["JobAcctGatherType"] = "jobacct_gather/none"
    ready, _, notes = site.examine()
    assert ready and notes["JobAcctGatherType"].level == "warning"
    assert "memory efficiency (and seff's) says n/a" in notes["JobAcctGatherType"].message
    assert notes["JobAcctGatherType"].fix.startswith("JobAcctGatherType=jobacct_gather/cgroup")


def test_gpueff_missing_from_users_path_is_a_warning(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.notes, "USER_PATH", str(site.root / "nothing-here"))
    ready, _, notes = site.examine()
    assert ready and notes["PATH"].level == "warning"
    gpueff = site.root / "venv" / "bin" / "gpueff"
    assert notes["PATH"].fix.startswith(f"ln -s {gpueff} /usr/local/bin/gpueff")
