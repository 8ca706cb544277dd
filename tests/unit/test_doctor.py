"""`gpueff doctor` on a site in tmp_path: the real pynvml over the stand-in NVML library,
real device files (mknod, as root), a real SQLite store, and stand-ins for Slurm's
commands: scontrol prints a release's `scontrol show config` (tests/fixtures/slurm, its
hooks moved into the site), slurmd its GPU list, sacct answers. Ready when all is right;
each broken setup named with its fix and a non-zero exit status; the notes name the
release, the cgroup version and the settings that weaken measurement."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff import cli, doctor
from slurm_gpu_eff.doctor import examine
from slurm_gpu_eff.store import open_store
from tests import standin
from tests.configfile import write_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
CLUSTER_ETC = "/var/tmp/gpueff-cluster/etc/"  # where the fixtures' hooks and slurm.conf are
RELEASES = ("22.05", "24.11", "26.05")
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
V1_MOUNTS = ("tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0\n"
             "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
             "cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0\n"
             "cgroup /sys/fs/cgroup/devices cgroup rw,nosuid,nodev,noexec,relatime,devices 0 0\n"
             "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0\n")
# `slurmd -G` for gres.conf `Name=gpu Count=2` without File=, in 24.11's format
# (_log_gres_slurmd_conf: "Gres Name=%s Type=%s Count=%lu ID=%u Links=%s Flags=%s")
FILELESS_GRES = ("slurmd: Gres Name=gpu Type=(null) Count=2 ID=7696487 Links=(null) "
                 "Flags=ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT")

HOOKS = (("prolog", "gpueff-prolog"), ("epilog", "gpueff-epilog"), ("mailprog", "gpueff-mail"))

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


def gres_line(files: str) -> str:
    return f"slurmd: Gres Name=gpu Type=h100 Count=2 Index=0 ID=1 File={files} (null)"


def show_config(release: str, etc: Path, changes: dict[str, str | None], cgroup: bool = True) -> str:
    """The release's `scontrol show config` with its slurm.conf and hooks in `etc`, each key
    of `changes` set to its value (None: its line left out; a new key goes at the end of
    the main section), and without the "Cgroup Support Configuration:" section when not
    `cgroup` (what slurmctld sends when no cgroup plugin is in use)."""
    text = (FIXTURES / f"scontrol-show-config-{release}.txt").read_text().replace(CLUSTER_ETC, f"{etc}/")
    if not cgroup:
        head, _, rest = text.partition("\nCgroup Support Configuration:\n")
        text = head + "\n" + rest.partition("\n\n")[2]
    present = {line.partition(" = ")[0].strip() for line in text.splitlines()}
    new = [f"{k:<23} = {v}" for k, v in changes.items() if k not in present and v is not None]
    lines = []
    for line in text.splitlines():
        key = line.partition(" = ")[0].strip()
        if not line and new:  # the end of the main section
            lines, new = lines + new, []
        if key in changes:
            lines += [] if changes[key] is None else [f"{key:<23} = {changes[key]}"]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


class Site:
    """A node `gpu1` with two GPUs under Slurm `release`; `slurm_conf` changes that
    release's `scontrol show config`, `settings` are the config file's, changed by a test."""

    def __init__(self, root: Path, release: str = "24.11") -> None:
        self.root = root
        self.release = release
        dev = root / "dev"
        dev.mkdir()
        for minor in (0, 1):
            try:
                os.mknod(dev / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
            except PermissionError:
                pytest.skip("mknod needs root (CI runs as root)")
        (root / "devices.json").write_text(json.dumps(SIM_DEVICES))
        (root / "state" / "gpu1").mkdir(parents=True)
        self.slurm_conf: dict[str, str | None] = {}
        self.etc = root / "etc"  # the site's wrappers, as the development cluster's
        self.etc.mkdir()
        for hook, name in HOOKS:
            command(self.etc / hook, f'exec /opt/venv/bin/{name} "$@"\n')
        self.cgroup_section = True
        self.gres = f'echo "{gres_line(f"{dev}/nvidia[0-1]")}" >&2'
        (root / "spool").mkdir(mode=0o700)
        # the venv root's hooks run: root's (made by the test, as root), its python the test's
        (root / "venv" / "bin").mkdir(parents=True)
        (root / "venv" / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
        (root / "venv" / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
        # not the live cluster's slurmctld: no pid file
        self.slurm_conf["SlurmctldPidFile"] = str(root / "slurmctld.pid")
        self.settings: dict[str, dict[str, Any]] = {
            "gpu": {"library": standin.library_path()},
            "sim": {"devices": str(root / "devices.json"), "state_dir": str(root / "state")},
            "spool": {"dir": str(root / "spool" / "%n")},
            "store": {"path": str(root / "store" / "gpueff.db")},
            "log": {"file": str(root / "log" / "%n.log")},
            "hooks": {"python": str(root / "venv" / "bin" / "python")},
            "slurm": {"scontrol": str(root / "scontrol"), "slurmd": str(root / "slurmd"),
                      "sacct": command(root / "sacct", "exit 0\n")},
        }
        (root / "store").mkdir()
        open_store(f"sqlite://{root / 'store' / 'gpueff.db'}").close()  # made by a delivery

    def hook_key(self, key: str) -> str:
        """How the release prints the first script of Prolog or Epilog."""
        return key if self.release == "22.05" else f"{key}[0]"

    def write(self) -> str:
        text = show_config(self.release, self.etc, self.slurm_conf, self.cgroup_section)
        (self.root / "show-config.txt").write_text(text)
        shown = self.root / "show-config.txt"
        command(self.root / "scontrol", f'[ "$1 $2" = "show config" ] && exec cat {shown}\n')
        command(self.root / "slurmd", self.gres + "\n")
        return str(write_config(self.root / "gpueff.toml", self.settings))

    def examine(self) -> tuple[bool, dict[str, Any], dict[str, Any]]:
        ready, checks, notes = examine(self.write(), "gpu1")
        return ready, {c.name: c for c in checks}, {n.name: n for n in notes}


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """doctor sets SLURMD_NODENAME and GPUEFF_CONFIG as slurmd would: undone after each test.
    The host's mounts are a file of the test's (a cgroup v2 host unless a test says else)."""
    monkeypatch.setenv("SLURMD_NODENAME", "")
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)
    # not slurmctld's host (the fixtures' SlurmctldHost is "vm", this machine's name too)
    monkeypatch.setattr(doctor.controller, "_host_names", lambda: {"testhost"})
    users = tmp_path / "users-bin"  # the PATH users get: gpueff is on it
    users.mkdir()
    command(users / "gpueff", "exit 0\n")
    monkeypatch.setattr(doctor.notes, "USER_PATH", str(users))
    mounts = tmp_path / "mounts"
    mounts.write_text(V2_MOUNTS)
    monkeypatch.setattr(doctor.notes, "MOUNTS", str(mounts))
    return mounts


@pytest.mark.parametrize("release", RELEASES)
def test_a_ready_node(tmp_path: Path, capsys: pytest.CaptureFixture[str], release: str,
                      _own_environment: Path) -> None:
    site = Site(tmp_path, release)
    _own_environment.write_text(V1_MOUNTS if release == "22.05" else V2_MOUNTS)  # as its cgroup.conf says
    ready, checks, notes = site.examine()
    assert ready, [c for c in checks.values() if not c.ok]
    assert list(checks) == ["config", "config-file", "venv", "Prolog", "Epilog", "MailProg", "PrologFlags",
                            "nvml", "gres", "spool", "store", "mail", "accounting", "slurm backend"]
    assert checks["Prolog"].message == f"{site.hook_key('Prolog')}={site.etc}/prolog"
    assert checks["nvml"].message.startswith("driver ") and "2 GPU(s): minor 0 NVIDIA H100 (sim)" in \
        checks["nvml"].message and "GPM " in checks["nvml"].message
    assert "schema current" in checks["store"].message
    assert notes["slurm"].message == f"Slurm {release}.{ {'22.05': 8, '24.11': 5, '26.05': 5}[release]}"
    assert {n.level for n in notes.values()} == {"info"}
    assert cli.main(["doctor", "--json", "--node", "gpu1", "--config", site.write()]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ready"] is True and {tuple(c) for c in out["checks"]} == {("name", "ok", "message", "fix")}
    assert {tuple(n) for n in out["notes"]} == {("name", "level", "message", "fix")}
    assert out["notes"][0] == {"name": "slurm", "level": "info", "message": notes["slurm"].message, "fix": ""}
    assert cli.main(["doctor", "--node", "gpu1", "--config", site.write()]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().endswith("Ready.") and f"\ninfo slurm: Slurm {release}." in text


def no_prolog(site: Site) -> None:
    # 22.05 prints an unset Prolog as "(null)"; 24.11 and 26.05 print no Prolog[N] line at all
    site.slurm_conf[site.hook_key("Prolog")] = "(null)" if site.release == "22.05" else None


def broken_spool(site: Site) -> None:
    (site.root / "afile").write_text("")
    site.settings["spool"]["dir"] = str(site.root / "afile" / "spool" / "%n")


def broken_key(site: Site) -> None:
    site.settings["sampler"] = {"intervall_s": 1}


def broken_gres(site: Site) -> None:
    (site.root / "notadevice").write_text("")
    files = f"{site.root / 'dev' / 'nvidia0'},{site.root / 'notadevice'}"
    site.gres = f'echo "{gres_line(files)}" >&2'


def fileless_gres(site: Site) -> None:
    site.gres = f'echo "{FILELESS_GRES}" >&2'


def broken_store(site: Site) -> None:
    site.settings["store"] = {"url": "postgresql://gpueff@127.0.0.1:1/gpueff?connect_timeout=2"}


def broken_nvml(site: Site) -> None:
    site.settings["gpu"]["library"] = str(site.root / "no" / "libnvidia-ml.so.1")


def broken_flags(site: Site) -> None:
    site.slurm_conf["PrologFlags"] = "Contain"


def broken_accounting(site: Site) -> None:
    command(site.root / "sacct", 'echo "sacct: error: Problem talking to the database" >&2; exit 1\n')


@pytest.mark.parametrize(("breaks", "name", "said", "fix"), [
    (no_prolog, "Prolog", "slurm.conf has no Prolog line", "Prolog=/PATH/TO/VENV/bin/gpueff-prolog"),
    (broken_spool, "spool", "does not exist and cannot be made", "install -d -m 0700 -o root"),
    (broken_key, "config", "line 19: [sampler] intervall_s: unknown setting", "etc/gpueff.toml.example"),
    (broken_gres, "gres", "notadevice is not a character device", "gres.conf's File= must name"),
    (fileless_gres, "gres", "slurmd -G lists GPUs without device files", "AutoDetect=nvml"),
    (broken_store, "store", "postgresql://gpueff@127.0.0.1:1/gpueff", "PostgreSQL URL whose server answers"),
    (broken_nvml, "nvml", "cannot load the NVML library", "install the NVIDIA driver"),
    (broken_flags, "PrologFlags", "PrologFlags=Contain", "PrologFlags=Alloc"),
    (broken_accounting, "accounting", "Problem talking to the database", "slurmdbd must run"),
], ids=lambda x: getattr(x, "__name__", None))
def test_each_broken_setup_is_named_with_its_fix(site: Site, capsys: pytest.CaptureFixture[str],
                                                breaks: Any, name: str, said: str, fix: str) -> None:
    breaks(site)
    ready, checks, _ = site.examine()
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


@pytest.mark.parametrize("release", RELEASES)
def test_a_missing_prolog_is_named_on_every_release(tmp_path: Path, release: str) -> None:
    site = Site(tmp_path, release)
    no_prolog(site)
    ready, checks, _ = site.examine()
    assert not ready and checks["Prolog"].message == "slurm.conf has no Prolog line"


def test_the_slurm_backend_is_named_and_pyslurm_asked_for_but_unusable_fails_with_its_fix(
    site: Site, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.slurm import inproc

    monkeypatch.setattr(inproc, "usable", lambda: (False, "pyslurm is not installed (no module)"))
    _, checks, _ = site.examine()
    backend = checks["slurm backend"]
    assert backend.ok and backend.message.startswith("commands: pyslurm is not")
    site.settings.setdefault("slurm", {})["backend"] = "pyslurm"
    ready, checks, _ = site.examine()
    assert not ready and [c.name for c in checks.values() if not c.ok] == ["slurm backend"]
    assert "pyslurm is not installed" in checks["slurm backend"].message
    assert "docs/install.md" in checks["slurm backend"].fix


def test_a_host_that_is_no_gpu_node_skips_the_gpu_checks(site: Site) -> None:
    command(site.root / "slurmd", 'echo "slurmd: error: no such node" >&2; exit 1\n')
    ready, checks, _ = examine(str(write_config(site.root / "gpueff.toml", site.settings)), "login1")
    names = [c.name for c in checks]
    assert "nvml" not in names and "gpus" in names


def test_an_open_store_file_is_named(site: Site) -> None:
    os.chmod(site.root / "store" / "gpueff.db", 0o644)
    ready, checks, _ = site.examine()
    assert not ready and "mode 644" in checks["store"].message and "chmod 0640" in checks["store"].fix


def test_numbered_hooks_are_one_list_each_entry_a_glob(site: Site) -> None:
    """24.11 prints one Prolog[N] per Prolog= line of slurm.conf; slurmd globs each."""
    (site.etc / "prolog.d").mkdir()
    command(site.etc / "prolog.d" / "10-site", "exit 0\n")
    command(site.etc / "prolog.d" / "20-gpueff", 'exec /opt/venv/bin/gpueff-prolog "$@"\n')
    command(site.etc / "site-prolog", "exit 0\n")
    site.slurm_conf.update({"Prolog[0]": f"{site.etc}/site-prolog", "Prolog[1]": f"{site.etc}/prolog.d/*"})
    ready, checks, _ = site.examine()
    assert checks["Prolog"].ok, checks["Prolog"]
    assert checks["Prolog"].message == f"Prolog[0]={site.etc}/site-prolog, Prolog[1]={site.etc}/prolog.d/*"
    site.slurm_conf["Prolog[1]"] = f"{site.etc}/prolog.d/10-*"
    ready, checks, _ = site.examine()
    assert not checks["Prolog"].ok and "does not run gpueff-prolog" in checks["Prolog"].message
    assert "Prolog[0]=" in checks["Prolog"].message and "Prolog[1]=" in checks["Prolog"].message


def test_a_relative_hook_is_found_beside_slurm_conf(site: Site) -> None:
    """Since 23.11 Prolog= may name a file relative to slurm.conf's directory."""
    site.slurm_conf["Prolog[0]"] = "prolog"
    ready, checks, _ = site.examine()
    assert checks["Prolog"].ok and checks["Prolog"].message == "Prolog[0]=prolog"


def test_a_comma_does_not_make_a_list(tmp_path: Path) -> None:
    """slurmd globs the whole value as one pattern: "a,b" runs neither a nor b."""
    site = Site(tmp_path, "22.05")
    site.slurm_conf["Prolog"] = f"{site.etc}/epilog,{site.etc}/prolog"
    ready, checks, _ = site.examine()
    assert not ready and "does not run gpueff-prolog" in checks["Prolog"].message


def test_run_in_job_is_a_warning_not_a_failure(site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    site.slurm_conf["PrologFlags"] = "Alloc,Contain,RunInJob"  # as 24.11 prints PrologFlags=RunInJob
    ready, checks, notes = site.examine()
    assert ready and checks["PrologFlags"].ok
    warning = notes["PrologFlags"]
    assert warning.level == "warning" and "inside the job's extern step cgroup" in warning.message
    assert "killed with the job" in warning.message and "epilog still stops it" in warning.message
    assert "without RunInJob" in warning.fix
    assert cli.main(["doctor", "--node", "gpu1", "--config", site.write()]) == 0
    out = capsys.readouterr().out
    assert "\nwarn PrologFlags: PrologFlags=Alloc,Contain,RunInJob: " in out
    assert out.rstrip().endswith("Ready.")


@pytest.mark.parametrize(("release", "changes", "sluid"), [
    ("26.05", {}, True),  # the fixture's cgroup.conf leaves CgroupJobIdPaths unset: "no"
    ("26.05", {"CgroupJobIdPaths": "yes"}, False),
    ("26.05", {"CgroupPlugin": "cgroup/v1"}, False),
    ("24.11", {}, False),
])
def test_sluid_cgroup_names_are_said_on_26_05_v2(tmp_path: Path, release: str, changes: dict[str, str],
                                                 sluid: bool) -> None:
    site = Site(tmp_path, release)
    site.slurm_conf.update(changes)
    ready, _, notes = site.examine()
    assert ready and ("CgroupJobIdPaths" in notes) == sluid
    if sluid:
        note = notes["CgroupJobIdPaths"]
        assert note.level == "info" and "after its SLUID" in note.message
        assert "gpueff reads both" in note.message


def test_the_cgroup_version_in_use_is_named(site: Site, _own_environment: Path) -> None:
    ready, _, notes = site.examine()
    assert notes["cgroup"].level == "info"
    assert notes["cgroup"].message == ("CgroupPlugin=cgroup/v2 (`scontrol show config`); this host mounts "
                                       "cgroup v2 (cgroup2 at /sys/fs/cgroup)")
    _own_environment.write_text(V1_MOUNTS)
    ready, _, notes = site.examine()
    assert ready and notes["cgroup"].level == "warning"
    assert ("this host mounts cgroup v1 (a tmpfs at /sys/fs/cgroup holding devices, memory, systemd, and "
            "cgroup2 at /sys/fs/cgroup/unified: the hybrid layout)") in notes["cgroup"].message
    assert "cgroup/v2 plugin does not start on a cgroup v1 host" in notes["cgroup"].message
    site.slurm_conf["CgroupPlugin"] = "autodetect"
    ready, _, notes = site.examine()
    assert notes["cgroup"].level == "info" and notes["cgroup"].message.startswith("CgroupPlugin=autodetect")


def test_cgroup_conf_is_read_beside_slurm_conf_without_a_cgroup_plugin(site: Site) -> None:
    site.cgroup_section = False
    ready, _, notes = site.examine()
    assert notes["cgroup"].message == (f"no cgroup plugin in use (no {site.etc}/cgroup.conf); "
                                       "this host mounts cgroup v2 (cgroup2 at /sys/fs/cgroup)")
    (site.etc / "cgroup.conf").write_text("# site\ncgroupplugin=cgroup/v2   # lower case is Slurm's too\n"
                                          "ConstrainDevices=yes\n")
    ready, _, notes = site.examine()
    assert notes["cgroup"].message.startswith(f"CgroupPlugin=cgroup/v2 ({site.etc}/cgroup.conf); ")


def test_no_notes_when_slurmctld_does_not_answer(site: Site) -> None:
    site.write()
    command(site.root / "scontrol", "exit 1\n")
    ready, checks, notes = examine(str(site.root / "gpueff.toml"), "gpu1")
    assert not ready and notes == [] and not next(c for c in checks if c.name == "slurm.conf").ok
