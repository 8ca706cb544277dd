"""slurm/commands.py: sacct -P text -> rows -> SlurmJob, checked against fixtures in tests/fixtures/sacct.

Fixture files use slurm.FIELDS in order and the \\x1f delimiter, one per job shape. Their
AdminComments are empty (no line of ours): their GPU count is the AllocTRES that
SacctQuery.jobs() asks sacct for in a second call, which `allocated` adds here.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import GpuEffError, JobNotFound, NotPermitted, SlurmError, UsageError
from slurm_gpu_eff.slurm.commands import (
    Commands,
    SacctQuery,
    get_admin_comment,
    get_job,
    get_jobs,
    job_from_rows,
    parse_rows,
)
from slurm_gpu_eff.slurm.records import parse_duration, parse_size, parse_tres, requested_memory
from slurm_gpu_eff.slurm.sacct import DELIMITER, FIELDS, check_job_id
from tests.configfile import write_config

KIB, MIB, GIB = 1024, 1024**2, 1024**3
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sacct"


def allocated(rows: list[dict[str, str]], tres: str) -> list[dict[str, str]]:
    """The rows as SacctQuery.jobs() completes them for a job without our line."""
    return [{**r, "AllocTRES": tres} for r in rows]


# --- parse_rows ----------------------------------------------------------------------------

def test_fixtures_have_exactly_the_fields_asked_for() -> None:
    for path in sorted(FIXTURES.glob("*.txt")):
        text = path.read_bytes().decode("utf-8", errors="replace")
        rows = parse_rows(text)
        assert rows, path.name
        assert all(list(r) == list(FIELDS) for r in rows), path.name


def test_parse_rows_of_a_completed_2gpu_job(sacct_fixture: Callable[[str], str]) -> None:
    rows = parse_rows(sacct_fixture("completed_2gpu.txt"))
    assert [r["JobID"] for r in rows] == ["4242", "4242.batch", "4242.extern", "4242.0"]
    assert (rows[0]["ReqMem"], rows[0]["AdminComment"]) == ("4000M", "")
    assert rows[0]["MaxRSS"] == ""
    assert rows[3]["MaxRSS"] == "2048000K"
    assert rows[1]["User"] == "" and rows[1]["TimelimitRaw"] == ""


def test_parse_rows_stitches_a_name_split_by_a_newline(sacct_fixture: Callable[[str], str]) -> None:
    rows = parse_rows(sacct_fixture("name_with_newline.txt"))
    assert [r["JobID"] for r in rows] == ["4244", "4244.batch"]
    assert rows[0]["JobName"] == "evil\nBcc: root@example.org"
    assert rows[0]["State"] == "CANCELLED by 1000"
    assert rows[0]["JobIDRaw"] == "4244"  # nothing shifted


def test_parse_rows_stitches_names_with_several_and_empty_lines(
    sacct_line: Callable[..., str],
) -> None:
    text = sacct_line(JobName="a\n\nb\n") + sacct_line(JobID="4242.batch", JobName="batch")
    rows = parse_rows(text)
    assert [r["JobName"] for r in rows] == ["a\n\nb\n", "batch"]
    assert rows[0]["NodeList"] == "gpu1"


def test_parse_rows_of_nothing() -> None:
    assert parse_rows("") == []
    assert parse_rows("\n") == []


def test_too_many_columns_is_an_error(sacct_line: Callable[..., str]) -> None:
    text = sacct_line().rstrip("\n") + DELIMITER + "extra\n"
    with pytest.raises(SlurmError) as raised:
        parse_rows(text)
    assert str(raised.value) == f"sacct returned {len(FIELDS) + 1} columns, expected {len(FIELDS)}"


def test_a_missing_column_is_an_error_not_a_shift(sacct_line: Callable[..., str]) -> None:
    short = DELIMITER.join(sacct_line().rstrip("\n").split(DELIMITER)[:-1])  # an older Slurm
    with pytest.raises(SlurmError, match="sacct output ended in the middle of a row"):
        parse_rows(short + "\n")
    # two short rows stitch into one too long (2 x len(FIELDS) - 3 columns): never two rows
    with pytest.raises(SlurmError, match=f"sacct returned {2 * len(FIELDS) - 3} columns"):
        parse_rows(short + "\n" + short + "\n")


# --- job_from_rows -------------------------------------------------------------------------

def test_completed_2gpu_job_efficiencies_as_seff(sacct_fixture: Callable[[str], str]) -> None:
    rows = allocated(parse_rows(sacct_fixture("completed_2gpu.txt")),
                     "billing=4,cpu=4,gres/gpu=2,mem=4000M,node=1")
    job = job_from_rows("4242", rows)
    assert (job.job_id, job.job_id_raw, job.name) == ("4242", "4242", "train-resnet")
    assert (job.cluster, job.user, job.account, job.partition) == (
        "gpueffdev", "alice", "physics", "gpu")
    assert (job.state, job.exit_code, job.running) == ("COMPLETED", "0:0", False)
    assert (job.elapsed_s, job.timelimit_s) == (3600, 7200)
    assert (job.ncpus, job.nnodes, job.nodelist, job.gpus) == (4, 1, "gpu2", 2)
    assert job.total_cpu_s == 8640.0  # 02:24:00
    assert job.alloc_mem_bytes == 4000 * MIB  # ReqMem
    assert job.max_rss_bytes == 2048000 * KIB  # the largest step, step 0
    # seff: TotalCPU / (ElapsedRaw * NCPUS); max step MaxRSS / allocated memory
    assert job.cpu_efficiency == pytest.approx(100 * 8640 / (3600 * 4), abs=1e-12)  # 60 %
    assert job.mem_efficiency == pytest.approx(100 * 2048000 * KIB / (4000 * MIB), abs=1e-12)


def test_running_1gpu_job_has_no_efficiencies_yet(sacct_fixture: Callable[[str], str]) -> None:
    rows = allocated(parse_rows(sacct_fixture("running_1gpu.txt")),
                     "billing=1,cpu=1,gres/gpu=1,mem=1000M,node=1")
    job = job_from_rows("1", rows)
    assert (job.state, job.running, job.end) == ("RUNNING", True, "Unknown")
    assert (job.elapsed_s, job.timelimit_s, job.gpus) == (2, None, 1)  # UNLIMITED
    assert job.max_rss_bytes is None  # no step has reported yet
    assert job.cpu_efficiency is None
    assert job.mem_efficiency is None


def test_cancelled_job_state_drops_by_whom(sacct_fixture: Callable[[str], str]) -> None:
    job = job_from_rows("4244", parse_rows(sacct_fixture("name_with_newline.txt")))
    assert job.state == "CANCELLED"
    assert job.name == "evil\nBcc: root@example.org"
    assert job.total_cpu_s == 30.5
    assert job.cpu_efficiency == pytest.approx(100 * 30.5 / (61 * 2), abs=1e-12)  # 25 %
    assert job.mem_efficiency == pytest.approx(100 * 524288 * KIB / (2000 * MIB), abs=1e-12)


def test_cpu_only_two_node_job(sacct_fixture: Callable[[str], str]) -> None:
    job = job_from_rows("4245", parse_rows(sacct_fixture("cpu_only.txt")))
    assert (job.gpus, job.nnodes, job.nodelist, job.state) == (0, 2, "gpu[1-2]", "FAILED")
    assert job.total_cpu_s == 93784.0  # 1-02:03:04
    assert job.cpu_efficiency == pytest.approx(100 * 93784 / (23446 * 8), abs=1e-12)  # 50 %
    assert job.max_rss_bytes == 4096000 * KIB
    assert job.mem_efficiency == pytest.approx(50.0, abs=1e-12)
    assert job.timelimit_s == 1440 * 60


def test_steps_of_another_job_are_not_counted(sacct_row: Callable[..., dict[str, str]]) -> None:
    rows = [
        sacct_row(),
        sacct_row(JobID="4242.0", JobIDRaw="4242.0", MaxRSS="100K"),
        sacct_row(JobID="42420", JobIDRaw="42420"),
        sacct_row(JobID="42420.0", JobIDRaw="42420.0", MaxRSS="999999K"),
    ]
    job = job_from_rows("4242", rows)
    assert (job.job_id, job.max_rss_bytes) == ("4242", 100 * KIB)


def test_the_job_asked_for_is_chosen_by_raw_id(sacct_row: Callable[..., dict[str, str]]) -> None:
    rows = [sacct_row(JobID="100_1", JobIDRaw="101", JobName="task1"),
            sacct_row(JobID="100_2", JobIDRaw="102", JobName="task2")]
    assert job_from_rows("102", rows).name == "task2"
    assert job_from_rows("100_1", rows).name == "task1"


def test_typed_gres_counts_when_there_is_no_plain_gres(
    sacct_row: Callable[..., dict[str, str]],
) -> None:
    rows = [sacct_row(AdminComment="", AllocTRES="cpu=8,gres/gpu:a100=2,gres/gpu:v100=1,mem=8G,node=1")]
    assert job_from_rows("4242", rows).gpus == 3
    rows = [sacct_row(AdminComment="", AllocTRES="cpu=8,gres/gpu=2,gres/gpu:a100=2,mem=8G,node=1")]
    assert job_from_rows("4242", rows).gpus == 2  # not counted twice


def test_our_line_counts_the_gpus_before_alloc_tres(sacct_row: Callable[..., dict[str, str]]) -> None:
    line = "ticket 4711 gpueff1 status=complete nodes=1 gpus=3 alloc_gpus=4"  # after a site's text
    assert job_from_rows("4242", [sacct_row(AdminComment=line, AllocTRES="gres/gpu=9")]).gpus == 4
    older = "gpueff1 status=complete nodes=1 gpus=3"  # written before alloc_gpus= was
    assert job_from_rows("4242", [sacct_row(AdminComment=older)]).gpus == 3
    assert job_from_rows("4242", [sacct_row(AdminComment="ticket 4711")]).gpus == 0  # no AllocTRES


def test_pending_job_has_no_efficiency(sacct_row: Callable[..., dict[str, str]]) -> None:
    job = job_from_rows("4242", [sacct_row(State="PENDING", ElapsedRaw="0", AdminComment="",
                                           AllocTRES="")])
    assert (job.running, job.elapsed_s, job.gpus, job.alloc_mem_bytes) == (True, 0, 0, 4000 * MIB)
    assert job.cpu_efficiency is None and job.mem_efficiency is None


def test_only_steps_or_nothing_is_job_not_found(sacct_row: Callable[..., dict[str, str]]) -> None:
    with pytest.raises(JobNotFound, match="job 4242 is not in Slurm's accounting"):
        job_from_rows("4242", [])
    with pytest.raises(JobNotFound):
        job_from_rows("4242", [sacct_row(JobID="4242.batch")])


# --- field parsers ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "nnodes", "ncpus", "expected"),
    [
        ("1400M", 2, 4, 1400 * MIB),  # Slurm >= 21.08: the job's total, whatever its nodes
        ("700Mn", 2, 4, 1400 * MIB),  # older: per node
        ("300Mc", 1, 3, 900 * MIB),  # older: per CPU
        ("0", 1, 4, 0),
        ("", 1, 4, None),
    ],
)
def test_requested_memory(text: str, nnodes: int, ncpus: int, expected: int | None) -> None:
    assert requested_memory(text, nnodes, ncpus) == expected


def test_parse_tres() -> None:
    assert parse_tres("billing=4,cpu=4,gres/gpu=2,mem=4000M,node=1") == {
        "billing": 4, "cpu": 4, "gres/gpu": 2, "mem": 4000 * MIB, "node": 1,
    }
    assert parse_tres("cpu=2,mem=1.5G,energy=,junk") == {"cpu": 2, "mem": int(1.5 * GIB)}
    assert parse_tres("") == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1234K", 1234 * KIB), ("4000M", 4000 * MIB), ("1.5G", int(1.5 * GIB)),
        ("2T", 2 * 1024**4), ("0", 0), ("512", 512), ("4000Mn", 4000 * MIB),
        ("100Kc", 100 * KIB), (" 8G ", 8 * GIB),
        ("", None), ("abc", None), ("1.2.3K", None), ("12X", None), ("-5K", None),
    ],
)
def test_parse_size(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
        ("02:03:04", 2 * 3600 + 3 * 60 + 4),
        ("02:03", 2 * 60 + 3),  # MM:SS, as sacct prints times under an hour
        ("00:01.500", 1.5),
        ("12:34.567", 12 * 60 + 34.567),
        ("1-02:03", 86400 + 2 * 3600 + 3 * 60),  # D-HH:MM
        ("00:00:00", 0.0),
        ("", 0.0),
        ("  ", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize("job_id", ["1234", "1234_7", "1234+1", " 1234 ", "1234_7+0"])
def test_check_job_id_accepts(job_id: str) -> None:
    assert check_job_id(job_id) == job_id.strip()


@pytest.mark.parametrize(
    "job_id", ["12;rm", "", "-1", "1234.batch", "1234_[1-3]", "abc", "12 34", "$(id)", "1234\n5"],
)
def test_check_job_id_rejects(job_id: str) -> None:
    with pytest.raises(UsageError) as raised:
        check_job_id(job_id)
    assert str(raised.value) == (
        f"{job_id.strip()!r} is not a Slurm job id (like 1234, 1234_7 or 1234+1)"
    )


# --- get_job, through a fake sacct on PATH -------------------------------------------------------

# A fake sacct's `emit FILE` prints a fixture as sacct would for this call: the fixture's
# \x1f delimiters become the one asked for with --delimiter (new for every call).
# `tres JOBIDRAW ALLOCTRES` answers the second call (--format=JobIDRaw,AllocTRES) that
# SacctQuery.jobs() makes for jobs without our line, and ends the script there.
EMIT = """for a in "$@"; do
  case $a in --delimiter=*) d=${a#--delimiter=};; --format=*) f=${a#--format=};; esac
done
emit() { sed "s/$(printf '\\037')/$d/g" "$1"; }
tres() { if [ "$f" = JobIDRaw,AllocTRES ]; then printf '%s%s%s\\n' "$1" "$d" "$2"; exit 0; fi; }
"""
TRES_4242 = "tres 4242 billing=4,cpu=4,gres/gpu=2,mem=4000M,node=1\n"


def fake_sacct(directory: Path, body: str) -> Path:
    script = directory / "sacct"
    script.write_text("#!/bin/sh\n" + EMIT + body, encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_get_job_runs_sacct_from_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args_file = tmp_path / "args"
    fake_sacct(tmp_path, TRES_4242 + f'printf "%s\\n" "$@" > {args_file}\n'
                         f'emit {FIXTURES / "completed_2gpu.txt"}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    job = get_job("4242")
    assert job.gpus == 2  # no line of ours in the fixture: AllocTRES, asked a second time
    assert (job.job_id, job.max_rss_bytes) == ("4242", 2048000 * KIB)
    assert job.cpu_efficiency == pytest.approx(60.0, abs=1e-12)
    args = args_file.read_text().splitlines()
    assert args[:4] == ["-j", "4242", "-P", "-n"] and args[5] == "--format=" + ",".join(FIELDS)
    assert re.fullmatch("--delimiter=\x1f[0-9a-f]{16}\x1f", args[4])
    get_job("4242")
    assert args_file.read_text().splitlines()[4] != args[4]  # new for every call


def test_get_jobs_asks_for_alloc_tres_of_a_job_without_our_line(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, TRES_4242 + f'emit {FIXTURES / "completed_2gpu.txt"}\n')
    assert [job.gpus for job in get_jobs("4242", str(script))] == [2]


def test_get_job_counts_the_gpus_of_a_job_without_our_line(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, TRES_4242 + f'emit {FIXTURES / "completed_2gpu.txt"}\n')
    assert get_job("4242", str(script)).gpus == 2


def test_get_job_with_an_explicit_sacct_path(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, '[ "$f" = JobIDRaw,AllocTRES ] && exit 0\n'
                                  f'emit {FIXTURES / "name_with_newline.txt"}\n')
    assert get_job("4244", str(script)).name == "evil\nBcc: root@example.org"


def test_sacct_failure_is_a_slurm_error_with_its_message(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, 'echo "sacct: error: Problem talking to the database: '
                                  'Connection refused" >&2\necho "second line" >&2\nexit 1\n')
    with pytest.raises(SlurmError) as raised:
        get_job("4242", str(script))
    assert str(raised.value) == (
        "sacct failed: sacct: error: Problem talking to the database: Connection refused"
    )


def test_sacct_failure_without_a_message(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, "exit 2\n")
    with pytest.raises(SlurmError, match="sacct failed: no message"):
        get_job("4242", str(script))


def test_missing_sacct_binary_is_a_slurm_error(tmp_path: Path) -> None:
    with pytest.raises(SlurmError) as raised:
        get_job("4242", str(tmp_path / "nonexistent" / "sacct"))
    assert "not found: is Slurm's client installed and on PATH?" in str(raised.value)


def test_sacct_knows_nothing_of_the_job(tmp_path: Path) -> None:
    script = fake_sacct(tmp_path, "exit 0\n")
    with pytest.raises(JobNotFound, match="job 999 is not in Slurm's accounting"):
        get_job("999", str(script))


def fake_scontrol(directory: Path, private_data: str) -> Path:
    script = directory / "scontrol"
    script.write_text('#!/bin/sh\n[ "$*" = "show config" ] || exit 1\n'
                      'echo "PreemptMode             = OFF"\n'
                      f'echo "PrivateData             = {private_data}"\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("euid", "private_data", "error", "exit_code"),
    [(1000, "jobs,usage", NotPermitted, 10), (1000, "none", JobNotFound, 3),
     (0, "jobs,usage", JobNotFound, 3)],  # root sees every job: nothing hidden from it
)
def test_no_rows_where_slurm_hides_other_users_jobs_is_not_permitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int, private_data: str,
    error: type[GpuEffError], exit_code: int,
) -> None:
    monkeypatch.setattr("slurm_gpu_eff.slurm.commands.os.geteuid", lambda: euid)
    query = SacctQuery("4242", str(fake_sacct(tmp_path, "exit 0\n")),
                       str(fake_scontrol(tmp_path, private_data)))
    with pytest.raises(error) as raised:
        query.jobs()
    assert raised.value.exit_code == exit_code


def test_alloc_tres_is_asked_once_for_the_id_asked_when_a_job_has_no_line_of_ours(
    tmp_path: Path, sacct_line: Callable[..., str],
) -> None:
    fixture = tmp_path / "array.txt"
    fixture.write_text(
        sacct_line(JobID="900_1", JobIDRaw="901", AdminComment="gpueff1 status=complete alloc_gpus=1")
        + sacct_line(JobID="900_2", JobIDRaw="902", AdminComment="")
        + sacct_line(JobID="900_2.batch", JobIDRaw="902.batch", AdminComment="")
        + sacct_line(JobID="900_3", JobIDRaw="903", AdminComment="ticket 4711"))
    script = fake_sacct(tmp_path, f'echo "$*" >> {tmp_path / "calls"}\n'
                                  '[ "$f" = JobIDRaw,AllocTRES ] && printf '
                                  '"902${d}gres/gpu=2\\n903${d}gres/gpu:a100=4\\n" && exit 0\n'
                                  f"emit {fixture}\n")
    assert [job.gpus for job in get_jobs("900", str(script))] == [1, 2, 4]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    # The id asked, not the tasks': an array of 20,000 would not fit in one argument.
    assert calls[1].startswith("-j 900 -X -P -n --delimiter=")
    assert calls[1].endswith(" --format=JobIDRaw,AllocTRES")


def test_a_bad_job_id_never_reaches_sacct(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = fake_sacct(tmp_path, f"touch {ran}\n")
    with pytest.raises(UsageError):
        get_job("1;touch /tmp/x", str(script))
    assert not ran.exists()


def test_a_job_name_that_is_not_utf8_does_not_break_the_report(
    tmp_path: Path, sacct_line: Callable[..., str],
) -> None:
    fixture = tmp_path / "latin1_name.txt"
    fixture.write_bytes(sacct_line(JobName="caf\udce9").encode("utf-8", "surrogateescape"))
    assert b"caf\xe9\x1f" in fixture.read_bytes()  # as sbatch -J $'caf\xe9' stores it
    script = fake_sacct(tmp_path, f"emit {fixture}\n")
    job = get_job("4242", str(script))
    assert job.name.startswith("caf") and job.gpus == 2


# --- issue 8: forged rows, seff's memory rule, big arrays ------------------------------------

def hostile_rows(delimiter: str) -> str:
    """Job 500 of mallory, named to cut sacct's row where she likes: after a newline, a
    whole row of her making claims JobIDRaw 77 (someone else's job) for her allocation."""
    row = {**DEFAULT_ROWS_500}
    forged = "\x1f".join(("500", "x", "77", *["" for _ in FIELDS[3:]]))
    row["JobName"] = "x\x1f" + forged + "\nrest"
    step = {**row, "JobID": "500.batch", "JobIDRaw": "500.batch", "JobName": "batch", "NTasks": "1"}
    return "".join(delimiter.join(r[f] for f in FIELDS) + "\n" for r in (row, step))


DEFAULT_ROWS_500 = {f: "" for f in FIELDS} | {
    "JobID": "500", "JobIDRaw": "500", "Cluster": "c", "User": "mallory", "State": "COMPLETED",
    "ExitCode": "0:0", "ElapsedRaw": "60", "NCPUS": "1", "NNodes": "1", "NodeList": "gpu1",
    "TotalCPU": "00:01", "ReqMem": "100M",
    "AdminComment": "gpueff1 status=complete nodes=1 gpus=1 alloc_gpus=1",
}


def test_a_job_name_cannot_forge_a_row_under_a_fresh_delimiter() -> None:
    """With the fixed \\x1f the name's own delimiters count: the row is cut in the wrong
    place and the allocation is lost or rewritten. With this call's own delimiter, the
    name is just a name."""
    with pytest.raises(SlurmError):  # the old way: a shifted row, refused at best
        job_from_rows("500", parse_rows(hostile_rows("\x1f"), "\x1f"))
    delimiter = "\x1fa1b2c3d4e5f60718\x1f"
    job = job_from_rows("500", parse_rows(hostile_rows(delimiter), delimiter))
    assert (job.job_id, job.job_id_raw, job.user, job.gpus) == ("500", "500", "mallory", 1)
    assert job.name.startswith("x\x1f500\x1fx\x1f77") and job.name.endswith("\nrest")


def test_peak_memory_counts_the_largest_steps_rss_once_per_task(
    sacct_row: Callable[..., dict[str, str]],
) -> None:
    """seff 22.05's rule (its MaxRSS is one task's peak): a 4-task step at 150 MiB a task
    in 1000 MiB is 60%, not 15%. The step with the largest MaxRSS decides."""
    rows = [
        sacct_row(ReqMem="1000M", MaxRSS="", NTasks=""),
        sacct_row(JobID="4242.batch", JobIDRaw="4242.batch", MaxRSS="20M", NTasks="1"),
        sacct_row(JobID="4242.0", JobIDRaw="4242.0", MaxRSS="150M", NTasks="4"),
        sacct_row(JobID="4242.1", JobIDRaw="4242.1", MaxRSS="100M", NTasks="8"),
    ]
    job = job_from_rows("4242", rows)
    assert job.max_rss_bytes == 4 * 150 * MIB
    assert job.mem_efficiency == pytest.approx(60.0)
    rows[2]["NTasks"] = "garbage"  # an odd value counts one task, never crashes
    assert job_from_rows("4242", rows).max_rss_bytes == 150 * MIB


def test_an_array_of_ten_thousand_tasks_is_parsed_in_one_pass(tmp_path: Path) -> None:
    lines = []
    for task in range(1, 10_001):
        base = {**DEFAULT_ROWS_500, "JobID": f"900_{task}", "JobIDRaw": str(900 + task)}
        step = {**base, "JobID": f"900_{task}.batch", "JobIDRaw": f"{900 + task}.batch",
                "MaxRSS": f"{task}K", "NTasks": "1"}
        lines += ["\x1f".join(r[f] for f in FIELDS) for r in (base, step)]
    fixture = tmp_path / "array.txt"
    fixture.write_text("\n".join(lines) + "\n")
    jobs = get_jobs("900", str(fake_sacct(tmp_path, f"emit {fixture}\n")))
    assert len(jobs) == 10_000
    assert (jobs[0].job_id, jobs[-1].job_id, jobs[-1].max_rss_bytes) == ("900_1", "900_10000", 10_000 * KIB)


# --- gpueff JOBID: sacct asked first, the store opened while it answers ---------------------------

def test_gpueff_reports_with_sacct_started_before_the_store_is_read(
    tmp_path: Path, make_summary: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    from slurm_gpu_eff.cli import main
    from slurm_gpu_eff.store import open_store

    script = fake_sacct(tmp_path, f"{TRES_4242}sleep 0.2\nemit {FIXTURES / 'completed_2gpu.txt'}\n")
    store = tmp_path / "gpueff.db"
    started = time.mktime(time.strptime("2026-11-20T10:00:00", "%Y-%m-%dT%H:%M:%S"))  # its Start
    with open_store(f"sqlite://{store}") as opened:
        opened.put(make_summary(node="gpu2", utils=(90.0, 10.0), run_started_at=started + 1))
    config = write_config(tmp_path / "gpueff.toml", {"store": {"path": str(store)},
                                                     "slurm": {"sacct": str(script)}})
    assert main(["4242", "--json", "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["job_id"] == "4242" and len(report["gpus"]) == 2


def test_an_unknown_job_is_said_before_a_missing_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from slurm_gpu_eff.cli import main
    from slurm_gpu_eff.errors import JobNotFound, NoSummary

    script = fake_sacct(tmp_path, "exit 0\n")  # sacct knows no such job
    config = write_config(tmp_path / "gpueff.toml", {"store": {"path": str(tmp_path / "absent.db")},
                                                     "slurm": {"sacct": str(script)}})
    assert main(["999", "--config", str(config)]) == JobNotFound.exit_code
    assert "job 999 is not in Slurm's accounting" in capsys.readouterr().err
    fake_sacct(tmp_path, f"{TRES_4242}emit {FIXTURES / 'completed_2gpu.txt'}\n")  # now it does
    assert main(["4242", "--config", str(config)]) == NoSummary.exit_code  # no line, no store
    said = capsys.readouterr().err
    assert "no GPU figures for job 4242 in Slurm's accounting" in said
    assert "no GPU data has been stored yet" in said


def test_an_array_task_s_admin_comment_is_written_with_its_own_id(tmp_path: Path) -> None:
    """Checked on 22.05: the last task of array 59 keeps the raw id 59, and `sacctmgr
    modify job where jobid=59` (or scontrol's) writes every task of the array. The mirror
    must write with 59_2, the task's own id."""
    rows = "".join(f"gpueff1 status=complete{{d}}gres/gpu=1{{d}}{raw}{{d}}{shown}\\n"
                   for raw, shown in (("60", "59_1"), ("59", "59_2")))
    script = fake_sacct(tmp_path, f'printf "{rows.format(d="${d}")}"\n')
    assert get_admin_comment("59", str(script))[:3] == ("gpueff1 status=complete", "gres/gpu=1", "59_2")
    assert get_admin_comment("60", str(script))[2] == "59_1"
    het = fake_sacct(tmp_path, 'printf "${d}${d}20${d}20+0\\n${d}${d}21${d}20+1\\n"\n')
    assert get_admin_comment("20", str(het))[2] == "20+0"  # 20 alone: both components
    plain = fake_sacct(tmp_path, 'printf "%s${d}%s${d}4242${d}4242\\n" "" "gres/gpu=2"\n')
    assert get_admin_comment("4242", str(plain))[:3] == ("", "gres/gpu=2", "4242")


def test_gpueff_reads_our_line_from_the_system_comment_where_the_site_keeps_it_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_summary: Callable[..., Any],
) -> None:
    """[slurm] comment_field = "SystemComment": sacct is asked for it in the AdminComment's
    place (one call, as ever), and the report's figures come from it."""
    from slurm_gpu_eff.cli import main
    from slurm_gpu_eff.mirror import admin_comment

    line = admin_comment([make_summary(node="gpu2", utils=(90.0, 10.0))], 2).lower()
    fixture = (FIXTURES / "completed_2gpu.txt").read_text().splitlines()
    fixture[0] += line  # the allocation's row, whose last column is empty: our line there
    (tmp_path / "rows.txt").write_text("\n".join(fixture) + "\n")
    args = tmp_path / "args"
    script = fake_sacct(tmp_path, f'printf "%s\\n" "$@" > {args}\nemit {tmp_path / "rows.txt"}\n')
    config = write_config(tmp_path / "gpueff.toml", {"store": {"path": str(tmp_path / "absent.db")},
                                                     "slurm": {"sacct": str(script),
                                                               "comment_field": "SystemComment"}})
    assert main(["4242", "--json", "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["util_mean"] for g in report["gpus"]] == [90.0, 10.0]
    assert args.read_text().splitlines()[5] == "--format=" + ",".join(FIELDS).replace(
        "AdminComment", "SystemComment")


def test_a_cancel_writes_its_reason_into_the_field_that_holds_our_line(tmp_path: Path) -> None:
    """[slurm] comment_field = "SystemComment": the reason goes there too, before our line,
    through sacctmgr; the AdminComment (a site's jobstats summary) is left alone."""
    calls = tmp_path / "calls"
    sacct = fake_sacct(tmp_path, f'echo "sacct $*" >> {calls}\n'
                                 'printf "%s${d}%s${d}500${d}500\\n" "gpueff1 status=running" "cpu=1"\n')
    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text(f'#!/bin/sh\necho "sacctmgr $*" >> {calls}\n')
    sacctmgr.chmod(0o755)
    scancel = tmp_path / "scancel"
    scancel.write_text("#!/bin/sh\nexit 0\n")
    scancel.chmod(0o755)
    commands = {"sacct": str(sacct), "sacctmgr": str(sacctmgr), "scancel": str(scancel),
                "scontrol": "/bin/false"}
    Commands(Config(**commands, comment_field="SystemComment")).cancel("500", "c", "gpueff: cancelled",
                                                                       sleep=lambda s: None)
    said = calls.read_text().splitlines()
    assert said[0].endswith("--format=SystemComment,AllocTRES,JobIDRaw,JobID")
    assert said[1] == ("sacctmgr -i modify job where jobid=500 cluster=c set "
                       "SystemComment=gpueff: cancelled gpueff1 status=running")


def test_memory_is_what_slurm_allocated_not_what_was_asked(sacct_row: Callable[..., dict[str, str]]) -> None:
    """`-n 4 --mem=1000M`, spread by Slurm over two nodes: sacct's ReqMem says 1000M (the
    request, for its one node), AllocTRES mem=2000M, and seff counts 2000M (seen on 22.05:
    63% where seff said 32%). Our line carries the allocation, else AllocTRES, else ReqMem."""
    job = {"JobID": "21", "JobIDRaw": "21", "NNodes": "2", "NCPUS": "4", "ReqMem": "1000M",
           "State": "COMPLETED"}
    step = {"JobID": "21.0", "JobIDRaw": "21.0", "NTasks": "4", "MaxRSS": "161824K", "ReqMem": ""}
    line = "gpueff1 status=complete nodes=2 gpus=2 alloc_gpus=2 alloc_mem=2097152000"
    for comment, tres in ((line, ""), ("", "billing=4,cpu=4,gres/gpu=2,mem=2000M,node=2")):
        rows = [sacct_row(**job, AdminComment=comment, AllocTRES=tres), sacct_row(**step)]
        found = job_from_rows("21", rows)
        assert found.alloc_mem_bytes == 2000 * MIB
        assert found.mem_efficiency == pytest.approx(100 * 4 * 161824 * KIB / (2000 * MIB))  # seff: 31.61
    asked_only = job_from_rows("21", [sacct_row(**job), sacct_row(**step)])
    assert asked_only.alloc_mem_bytes == 1000 * MIB  # no allocation at hand: the request, as before
