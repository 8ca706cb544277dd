"""A site install (issue 12): the wheel, built with the standard tools, installed into a
fresh venv outside the checkout; the development cluster's Prolog, Epilog and MailProg
pointed at that venv's bin/; a GPU job of alice's run through to `gpueff` and the mail,
with the checkout unreadable to everyone but root (the job, its workload and alice's
`gpueff` could not run a line of it), and the hooks' processes running the venv's own
interpreter, whose import path holds nothing of the checkout."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.smtp import Server

from .conftest import REPO, Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # the hooks of every job are the site's meanwhile
HOOKS = {"prolog": "gpueff-prolog", "epilog": "gpueff-epilog", "mailprog": "gpueff-mail"}


@pytest.fixture(scope="module")
def site(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, and a venv of the system's python (the release root's, where the cluster
    has one) with it installed (its dependencies from the package index, as a site would)."""
    wheels = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                            str(REPO)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("slurm_gpu_eff-*.whl")
    venv = cluster.dir / "site"
    subprocess.run(["rm", "-rf", str(venv)], check=True)
    for step in (["/usr/bin/python3", "-m", "venv", str(venv)],
                 [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                 [str(venv / "bin" / "python"), "-c",
                  "from slurm_gpu_eff.report.render import precompile; precompile()"]):
        done = cluster.run(step, timeout=600, env={"HOME": "/tmp"})
        assert done.code == 0, (step, done.err)
    return venv


@pytest.fixture
def installed(cluster: Cluster, site: Path) -> Iterator[Path]:
    """slurm.conf's hooks run the site's executables (the wrappers slurmctld and slurmd
    run are read at every run), and the checkout is root's alone, until the test ends."""
    etc = cluster.dir / "etc"
    before = {name: (etc / name).read_text() for name in HOOKS}
    mode = REPO.stat().st_mode & 0o777
    try:
        for name, program in HOOKS.items():
            text = before[name].replace(_target(before[name]), str(site / "bin" / program))
            # the interpreter the hook wrappers name (the release's venv): the site's
            (etc / name).write_text(text.replace(cluster.python, str(site / "bin" / "python")))
        os.chmod(REPO, 0o700)
        yield site
    finally:
        os.chmod(REPO, mode)
        for name, text in before.items():
            (etc / name).write_text(text)


def _target(wrapper: str) -> str:
    """The program a wrapper of cluster.sh's execs (its last `exec PATH "$@"` line)."""
    line = [line for line in wrapper.splitlines() if line.startswith("exec ")][-1]
    return shlex.split(line)[1]


def test_a_gpu_job_through_the_site_install(cluster: Cluster, installed: Path, smtp: Server) -> None:
    site = installed
    assert not cluster.run(["test", "-r", str(REPO / "slurm_gpu_eff")], user="alice").code == 0
    profile = cluster.profile([{"seconds": 8, "gpus": {"0": {"util": 85, "power_w": 400},
                                                      "1": {"util": 0}}}])
    body = f"exec {site / 'bin' / 'gpueff-sim'} run {profile}"
    job = cluster.submit("alice", body, "--gres=gpu:2", "--mail-type=END")
    sampler = _wait_for_sampler(job)
    assert sampler[0] == str(site / "bin" / "python"), sampler
    # the site's interpreter, isolated (-I): its import path is the site venv's and the
    # standard library's, nothing of the checkout
    probe = "import json, sys; print(json.dumps(sys.path))"
    path = json.loads(cluster.run([sampler[0], "-I", "-c", probe]).out)
    assert path and not [p for p in path if p.startswith(str(REPO))], path
    assert cluster.wait_done(job) == "COMPLETED", cluster.output(job)
    report = cluster.run([str(site / "bin" / "gpueff"), job], user="alice")
    assert report.code == 0, report.err
    assert "Idle GPUs: 1 of 2" in report.out and "GPU Utilisation: " in report.out
    (to, message), = smtp.inbox.wait(job)
    text = message.get_payload()[0].get_content()  # type: ignore[index]
    assert message.is_multipart() and "Idle GPUs: 1 of 2" in text
    log = "".join(path.read_text() for path in (cluster.dir / "log").glob("gpueff-*.log"))
    # the final summary posted: by the sampler when the shell epilog told it (the usual
    # way, issue 21), or by the Python epilog
    assert re.search(rf"job={job} (sampler|epilog)\[\d+\]: posted complete summary", log), log[-2000:]


def _wait_for_sampler(job: str, timeout: float = 60) -> list[str]:
    """The running job's sampler's command line."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                parts = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            # The hook starts it through setsid, whose own command line names the same
            # arguments until it execs the interpreter: wait for the interpreter.
            if "slurm_gpu_eff.node.sampler" in parts and job in parts and Path(parts[0]).name != "setsid":
                return parts
        time.sleep(0.1)
    raise AssertionError(f"no sampler for job {job} within {timeout:g} s")
