"""`gpueff JOBID`'s fast path (issue 21): sacct started before the TOML reader, typing or
subprocess load; what does not depend on the job made ready while sacct answers; the
process left without the interpreter's teardown. Each keeps what the slow way did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu_eff.config import sacct_settings
from slurm_gpu_eff.errors import SlurmError
from slurm_gpu_eff.slurm.sacct import SacctRun
from tests.configfile import write_config
from tests.unit.test_slurm import FIXTURES, fake_sacct

ROOT = Path(__file__).resolve().parents[2]


# --- the config's sacct and comment field, read without the TOML reader ---------------------

@pytest.mark.parametrize("text", [
    "", "[store]\npath = \"/x.db\"\n", "[slurm]\nscontrol = \"/usr/bin/scontrol\"\nlive_mirror_s = 5\n",
    "not toml at all [[[",  # load_config() says so later, as ever
])
def test_a_file_that_names_neither_key_leaves_both_at_their_defaults(tmp_path: Path, text: str) -> None:
    (tmp_path / "gpueff.toml").write_text(text)
    assert sacct_settings(str(tmp_path / "gpueff.toml")) == ("sacct", "AdminComment")


@pytest.mark.parametrize("text", [
    '[slurm]\nsacct = "/opt/slurm/bin/sacct"\n', '[slurm]\ncomment_field = "SystemComment"\n',
    '[slurm]\nbackend = "pyslurm"\n',  # no sacct at all then
    'slurm.sacct = "/x"\n', 'slurm = { sacct = "/x" }\n', '[slurm]\n"s\\u0061cct" = "/x"\n',
    "[report]\ncurrency = \"\\u20ac\"\n",  # any backslash: the TOML reader decides
])
def test_a_file_that_may_name_them_is_left_to_the_toml_reader(tmp_path: Path, text: str) -> None:
    (tmp_path / "gpueff.toml").write_text(text)
    assert sacct_settings(str(tmp_path / "gpueff.toml")) is None


def test_an_unreadable_or_absent_file_is_left_to_load_config(tmp_path: Path) -> None:
    assert sacct_settings(str(tmp_path / "absent.toml")) is None
    (tmp_path / "latin1.toml").write_bytes(b"# caf\xe9\n")
    assert sacct_settings(str(tmp_path / "latin1.toml")) is None


def test_a_sacct_named_with_escapes_is_the_one_run(tmp_path: Path) -> None:
    from slurm_gpu_eff.cli import main

    ran = tmp_path / "ran"
    script = fake_sacct(tmp_path, f"touch {ran}\nexit 0\n")
    config = tmp_path / "gpueff.toml"
    config.write_text(f'[slurm]\n"s\\u0061cct" = "{script}"\n[store]\npath = "{tmp_path / "absent.db"}"\n')
    assert main(["4242", "--config", str(config)]) == 3  # JobNotFound
    assert ran.exists()


# --- sacct started as Popen started it -----------------------------------------------------------

def test_sacct_gets_no_file_of_ours_and_sigpipe_at_its_default(tmp_path: Path) -> None:
    listing, status = tmp_path / "listing", tmp_path / "status"
    listing.write_text("#!/bin/sh\nexec ls /proc/self/fd\n")
    status.write_text("#!/bin/sh\nexec grep SigIgn /proc/self/status\n")
    for script in (listing, status):
        script.chmod(0o755)
    opened = os.open(os.devnull, os.O_RDONLY)
    inherited = os.dup2(opened, 100)  # inheritable: as a shell leaves one open for its commands
    try:
        fds = SacctRun("4242", str(listing)).text().split()
    finally:
        os.close(opened)
        os.close(inherited)
    assert {"0", "1", "2"} <= set(fds) and "100" not in fds
    ignored = int(SacctRun("4242", str(status)).text().split()[1], 16)
    assert not ignored & (1 << 12)  # SIGPIPE (13): the default, not Python's SIG_IGN


def test_sacct_that_does_not_answer_is_killed_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SacctRun, "TIMEOUT_S", 0.3)
    script = fake_sacct(tmp_path, "exec sleep 30\n")
    run = SacctRun("4242", str(script))
    started = time.monotonic()
    with pytest.raises(SlurmError, match="sacct did not answer within 0.3 s"):
        run.text()
    assert time.monotonic() - started < 5
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(run.pid, os.WNOHANG)


def test_a_sacct_on_path_is_found_and_a_missing_one_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_sacct(tmp_path, f"emit {FIXTURES / 'completed_2gpu.txt'}\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert SacctRun("4242").text().startswith("4242")
    with pytest.raises(SlurmError, match="no-such-sacct not found: is Slurm's client installed"):
        SacctRun("4242", "no-such-sacct")


# --- the command, as a process of its own --------------------------------------------------------

def gpueff(path: Path, *args: str, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """`gpueff ARGS` in a process of its own, the sacct in `path` first on PATH."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{path}:{os.environ['PATH']}"}
    env.pop("PYTHONUNBUFFERED", None)  # as a user runs it: stdout buffered, flushed at the end
    return subprocess.run([sys.executable, "-m", "slurm_gpu_eff.cli", *args], env=env, text=True,
                          stdout=stdout, stderr=subprocess.PIPE, timeout=60, check=False)


@pytest.fixture
def job_site(tmp_path: Path, make_summary: object) -> Path:
    """A finished 2-GPU job whose line holds its figures, sacct on PATH, no sacct key."""
    from slurm_gpu_eff.mirror import admin_comment

    line = admin_comment([make_summary(node="gpu2", utils=(90.0, 10.0))], 2).lower()  # type: ignore[operator]
    rows = (FIXTURES / "completed_2gpu.txt").read_text().splitlines()
    rows[0] += line
    (tmp_path / "rows.txt").write_text("\n".join(rows) + "\n")
    fake_sacct(tmp_path, f"emit {tmp_path / 'rows.txt'}\n")
    return write_config(tmp_path / "gpueff.toml", {"store": {"path": str(tmp_path / "absent.db")}})


def test_the_report_of_the_command_is_the_report_of_main(
    tmp_path: Path, job_site: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.cli import main

    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    shown = []
    for form in ([], ["--json"]):
        assert main(["4242", *form, "--config", str(job_site)]) == 0
        shown.append(capsys.readouterr().out)
        done = gpueff(tmp_path, "4242", *form, "--config", str(job_site))
        assert (done.returncode, done.stdout, done.stderr) == (0, shown[-1], "")
    assert "GPU Utilisation: 50.0% mean over 2 measured GPU(s)" in shown[0]
    assert json.loads(shown[1])["job_id"] == "4242"


def test_the_command_s_errors_and_exit_statuses_are_as_ever(tmp_path: Path, job_site: Path) -> None:
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    fake_sacct(unknown, "exit 0\n")
    done = gpueff(unknown, "999", "--config", str(job_site))
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == "gpueff: job 999 is not in Slurm's accounting\n" or "999" in done.stderr
    with open("/dev/full", "w") as full:  # the report cannot be written: the interpreter's
        done = gpueff(tmp_path, "4242", "--config", str(job_site), stdout=full)  # own exit says so
    assert done.returncode == 120 and "No space left on device" in done.stderr


def test_gpueff_starts_sacct_before_the_toml_reader_typing_or_subprocess_load(tmp_path: Path) -> None:
    """What a fresh `gpueff JOBID` (bin/gpueff) has loaded when it starts sacct: the
    standard library's least, and none of what costs (re and enum, functools and
    collections, typing, the TOML reader, subprocess, argparse, jinja2...)."""
    # (not under tmp_path: its name holds "sacct", which leaves the file to the TOML reader)
    config = write_config(tmp_path / "gpueff.toml", {"store": {"path": "/var/lib/x.db"}})
    script = (ROOT / "bin" / "gpueff").read_text()
    assert "import sys\n\nfrom slurm_gpu_eff.cli import main\n" in script and "import re" not in script
    probe = (
        "import os, sys\n"
        "def spawn(*args, **kwargs):\n"
        "    print(' '.join(sorted(sys.modules)))\n"
        "    os._exit(0)\n"
        "os.posix_spawnp = spawn\n"
        f"sys.argv = ['gpueff', '4242', '--config', {str(config)!r}]\n"
        "from slurm_gpu_eff.cli import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, check=True)
    loaded = set(done.stdout.split())
    assert "slurm_gpu_eff.slurm.sacct" in loaded
    assert not loaded & {"re", "enum", "functools", "collections", "typing", "signal", "tomllib", "tomli",
                         "subprocess", "argparse", "json", "jinja2", "dataclasses"}


@pytest.mark.parametrize("text", [
    "1234", "1234_7", "1234+1", "1234_7+1", "0", "12\u0663",  # a Unicode decimal digit, as \d
    "", "_7", "1234_", "1234+", "+1", "1234_7_8", "1234+1+2", "1234+1_7", "12 34", "12a", "1234\n5",
    "\u00b2", "1234_\u00b2", "-1", "1.5", "1234;touch /tmp/x",
])
def test_is_job_id_is_the_regular_expression_of_job_ids(text: str) -> None:
    from slurm_gpu_eff.slurm.commands import JOB_ID
    from slurm_gpu_eff.slurm.sacct import is_job_id

    assert is_job_id(text) == bool(JOB_ID.match(text))


# --- our figures' line decoded at C speed ----------------------------------------------------------

def _either(decode: Callable[[], bytes]) -> object:
    try:
        return decode()
    except Exception as exc:  # the same error, said the same way
        return type(exc), str(exc)


def test_b32decode_is_base64_s_for_every_length_and_every_wrong_input() -> None:
    import base64
    import random

    from slurm_gpu_eff.mirror import b32decode

    def padded(text: str) -> str:
        return text + "=" * (-len(text) % 8)

    for n in [*range(0, 120), 37_500]:  # 37,500 bytes: a full comment field's 60,000 digits
        raw = random.randbytes(n)
        text = base64.b32encode(raw).decode().rstrip("=")
        assert b32decode(text) == raw
    for n in range(0, 40):  # any digits, leftover bits set, lengths no padding makes whole
        text = "".join(random.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(n))
        assert _either(lambda t=text: b32decode(t)) == _either(lambda t=text: base64.b32decode(padded(t)))
    for text in ["A0", "AB=C", "ab", "A B", "1", "\u00c4B", "_AB", "+AB", "AAAAAAA-", "A" * 9, "-1"]:
        assert _either(lambda t=text: b32decode(t)) == _either(lambda t=text: base64.b32decode(padded(t)))
