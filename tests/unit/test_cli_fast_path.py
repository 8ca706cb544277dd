"""`gpueff JOBID`'s fast path (issue 21): sacct started before the TOML reader, typing or
subprocess load; what does not depend on the job made ready while sacct answers; the
process left without the interpreter's teardown. Each keeps what the slow way did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu_eff.config import sacct_settings
from slurm_gpu_eff.errors import SlurmError
from slurm_gpu_eff.slurm.sacct import FIELDS, SacctRun, sacct_command
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
    assert "exec \"$py\" -I -c 'import sys; from slurm_gpu_eff.cli import main; sys.exit(main())'" in script
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


# --- bin/gpueff: sacct started before the interpreter, taken only if it is Python's own ----------

LAUNCHER = ROOT / "bin" / "gpueff"


def counting_sacct(directory: Path, rows: Path, answer_after_s: float = 0.0) -> Path:
    """A sacct that says each run (its arguments, a line) in directory/runs, then answers
    (after `answer_after_s`: a real one takes 20-90 ms)."""
    wait = f"sleep {answer_after_s}\n" if answer_after_s else ""
    return fake_sacct(directory, f'printf "%s\\n" "$*" >> {directory / "runs"}\n{wait}emit {rows}\n')


def launched(path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gpueff ARGS` as users run it (bin/gpueff), the sacct in `path` first on PATH."""
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}", **(env or {})}
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run([str(LAUNCHER), *args], env=env, text=True, capture_output=True, timeout=60,
                          check=False)


def test_the_launcher_s_query_is_the_one_the_report_reads(
    tmp_path: Path, job_site: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (its name holds no "sacct": the config written under tmp_path would then be left to Python)
    from slurm_gpu_eff.cli import main

    # A sacct that answers before bash has exec'd Python is reaped by bash (its SIGCHLD
    # handler), and Python, finding no child of its own, asks again: right, only slower.
    # A real sacct takes 20-90 ms against bash's ~1 ms to exec; this one takes 0.3 s, so
    # that a loaded machine (one CI run: two runs where one was due) cannot make that race.
    counting_sacct(tmp_path, tmp_path / "rows.txt", answer_after_s=0.3)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for form in ([], ["--json"]):
        assert main(["4242", *form, "--config", str(job_site)]) == 0
        shown = capsys.readouterr().out
        (tmp_path / "runs").unlink()
        done = launched(tmp_path, "4242", *form, "--config", str(job_site))
        runs = (tmp_path / "runs").read_text().splitlines()
        (tmp_path / "runs").unlink()
        # one sacct, bin/gpueff's (its delimiter: 32 digits, Python's has 16), taken as it was
        assert len(runs) == 1 and re.search("--delimiter=\x1f[0-9a-f]{32}\x1f ", runs[0]), runs
        assert runs[0].endswith("--format=" + ",".join(FIELDS))
        assert (done.returncode, done.stdout, done.stderr) == (0, shown, "")


def test_a_config_that_may_name_sacct_leaves_it_to_python(tmp_path: Path, job_site: Path) -> None:
    on_path, named = tmp_path / "path", tmp_path / "named"
    for directory in (on_path, named):
        directory.mkdir()
        counting_sacct(directory, tmp_path / "rows.txt")
    config = tmp_path / "gpueff.toml"
    config.write_text(f'[slurm]\nsacct = "{named / "sacct"}"\n[store]\npath = "{tmp_path / "absent.db"}"\n')
    done = launched(on_path, "4242", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert not (on_path / "runs").exists()  # the launcher started none
    assert len((named / "runs").read_text().splitlines()) == 1


def test_a_query_missing_from_path_is_said_as_python_says_it(tmp_path: Path, job_site: Path) -> None:
    # (no "sacct" in its name: the config under tmp_path would be left to the TOML reader)
    bare = tmp_path / "bare"
    bare.mkdir()  # PATH: nothing but this
    env = {**os.environ, "PATH": str(bare)}
    done = subprocess.run([str(LAUNCHER), "4242", "--config", str(job_site)], env=env, text=True,
                          capture_output=True, timeout=60, check=False)
    slow = subprocess.run([sys.executable, "-m", "slurm_gpu_eff.cli", "4242", "--config", str(job_site)],
                          env={**env, "PYTHONPATH": str(ROOT)}, text=True, capture_output=True, timeout=60,
                          check=False)
    # (Python then looks in the usual places too: config.find_command; what it finds or
    # says depends on the machine, the same either way)
    assert done.returncode != 0 and (done.returncode, done.stderr) == (slow.returncode, slow.stderr)


@pytest.mark.parametrize("args", [["--help"], ["config", "--json"], ["report", "--help"], ["4242x"]])
def test_the_launcher_leaves_every_other_call_as_it_was(
    tmp_path: Path, job_site: Path, args: list[str],
) -> None:
    counting_sacct(tmp_path, tmp_path / "rows.txt")
    args = [*args, "--config", str(job_site)] if args[0] in ("config", "4242x") else args
    done = launched(tmp_path, *args)
    assert not (tmp_path / "runs").exists()
    slow = subprocess.run([sys.executable, "-m", "slurm_gpu_eff.cli", *args], text=True,
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout, done.stderr) == (slow.returncode, slow.stdout, slow.stderr)


def spawned(command: list[str]) -> tuple[int, int, int]:
    """A child as bin/gpueff leaves one: (pid, its output's pipe, its errors' pipe)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.posix_spawnp(command[0], command, os.environ,
                          file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r


def described(pid: int, out: int, err: int, command: list[str]) -> str:
    return "\x1e".join([str(pid), str(out), str(err), *command])


DELIMITER_32 = "\x1f" + "0123456789abcdef" * 2 + "\x1f"


def test_a_handed_sacct_of_another_command_is_stopped_and_python_asks_itself(tmp_path: Path) -> None:
    script = counting_sacct(tmp_path, FIXTURES / "completed_2gpu.txt")
    other = sacct_command("4243", str(script), "AdminComment", DELIMITER_32)  # another job's
    pid, out, err = spawned(["sleep", "30"])
    run = SacctRun("4242", str(script), handed=described(pid, out, err, other))
    with pytest.raises(ChildProcessError):  # stopped and reaped
        os.waitpid(pid, os.WNOHANG)
    assert run.text().startswith("4242") and len((tmp_path / "runs").read_text().splitlines()) == 1
    assert run.delimiter != DELIMITER_32


def test_a_handed_sacct_that_has_ended_is_read_and_its_status_kept(tmp_path: Path) -> None:
    script = counting_sacct(tmp_path, FIXTURES / "completed_2gpu.txt")
    command = sacct_command("4242", str(script), "AdminComment", DELIMITER_32)
    pid, out, err = spawned(command)
    deadline = time.monotonic() + 30
    while not (tmp_path / "runs").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # and has exited
    run = SacctRun("4242", str(script), handed=described(pid, out, err, command))
    assert (run.pid, run.delimiter) == (pid, DELIMITER_32)
    assert run.text().startswith("4242") and len((tmp_path / "runs").read_text().splitlines()) == 1
    (tmp_path / "failing").mkdir()
    failing = fake_sacct(tmp_path / "failing", "echo 'sacct: error: slurmdbd down' >&2\nexit 1\n")
    command = sacct_command("4242", str(failing), "AdminComment", DELIMITER_32)
    pid, out, err = spawned(command)
    with pytest.raises(SlurmError, match="sacct failed: sacct: error: slurmdbd down"):
        SacctRun("4242", str(failing), handed=described(pid, out, err, command)).text()


@pytest.mark.parametrize("handed", [
    "", "x", "1\x1e5\x1e6", "1\x1e5\x1e6\x1esacct\x1e-j\x1e4242", "0\x1e5\x1e6\x1esacct",
    "-5\x1e5\x1e6", "12\x1e1\x1e2\x1esacct", "12\x1e7\x1e7\x1esacct",
])
def test_a_description_that_is_not_of_our_child_is_ignored(tmp_path: Path, handed: str) -> None:
    script = counting_sacct(tmp_path, FIXTURES / "completed_2gpu.txt")
    kept_r, kept_w = os.pipe()  # a pipe of ours the description names: not its to close
    try:
        handed = handed.replace("\x1e5\x1e6", f"\x1e{kept_r}\x1e{kept_w}")
        run = SacctRun("4242", str(script), handed=handed)
        assert run.text().startswith("4242") and run.pid != 1
        os.fstat(kept_r)
        os.fstat(kept_w)
    finally:
        os.close(kept_r)
        os.close(kept_w)
    assert len((tmp_path / "runs").read_text().splitlines()) == 1


def test_a_handed_sacct_that_is_not_a_report_after_all_is_stopped() -> None:
    from slurm_gpu_eff.cli import early_sacct

    pid, out, err = spawned(["sleep", "30"])
    assert early_sacct(["doctor"], described(pid, out, err, ["sacct"])) is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("argv", [
    ["1234"], ["1234", "--json"], ["1234_7", "--config", "/x.toml"], ["1234+1", "--config=/x.toml"],
    ["1234", "--debug", "--json", "--config", "a", "--config", "b"], ["1234", "--config="],
    ["1234", "--conf", "/x"], ["1234", "--json=1"], ["1234", "5678"], ["1234", "--config"],
    ["1234", "--config", "--json"], ["1234", "--help"], ["--json", "1234"], ["1234", "--", "x"],
    ["1234", "-h"], [],
])
def test_the_everyday_call_reads_as_argparse_reads_it(argv: list[str]) -> None:
    from slurm_gpu_eff.cli import plain_report, report_parser

    plain = plain_report(argv)
    try:
        parsed: object = vars(report_parser().parse_args(argv))
    except SystemExit as exc:
        parsed = exc.code
    if plain is not None:
        assert vars(plain) == parsed
    else:  # left to argparse: what it refuses, asks for help with, or reads otherwise
        assert argv == [] or parsed in (0, 2) or argv[0].startswith("-") or "--conf" in argv or "--" in argv


def test_a_link_to_the_launcher_runs_its_venv_s_python(tmp_path: Path, job_site: Path) -> None:
    """Sites link it onto users' PATH (docs/install.md): the interpreter is still the one
    beside the script it links to, not a `python` beside the link."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "gpueff").symlink_to(LAUNCHER)
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\necho wrong python\nexit 9\n")
    (tmp_path / "bin" / "python").chmod(0o755)
    counting_sacct(tmp_path, tmp_path / "rows.txt")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run([str(tmp_path / "bin" / "gpueff"), "4242", "--config", str(job_site)], env=env,
                          text=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("Job ID: 4242"), done.stderr
