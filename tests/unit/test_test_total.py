"""scripts/test-total.py: the one line `make test` ends with, summed from each part's
JUnit XML, and its exit status (a failure anywhere, a part that wrote nothing, or a run
that passed no test at all fails it)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test-total.py"


def junit(path: Path, tests: int, failures: int = 0, errors: int = 0, skipped: int = 0) -> None:
    path.write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'errors="{errors}" failures="{failures}" skipped="{skipped}" tests="{tests}" '
        f'time="1.0"/></testsuites>'
    )


def total(folder: Path, *parts: str) -> subprocess.CompletedProcess[str]:
    start = str(time.time() - 65)
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), start, *parts],
                          capture_output=True, text=True, check=False)


def test_the_parts_are_added_up_in_pytests_words(tmp_path: Path) -> None:
    junit(tmp_path / "all-side-by-side.xml", 900, skipped=3)
    junit(tmp_path / "all-serial.xml", 40)
    junit(tmp_path / "all-heavy.xml", 0)  # a part may rightly select nothing
    done = total(tmp_path, "all-side-by-side", "all-serial", "all-heavy")
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert "937 passed, 3 skipped in 6" in last and "(0:01:0" in last
    assert "(3 of 3)" in done.stdout


def test_a_failure_in_any_part_fails_the_total(tmp_path: Path) -> None:
    junit(tmp_path / "a.xml", 10)
    junit(tmp_path / "b.xml", 5, failures=1, errors=1)
    done = total(tmp_path, "a", "b")
    assert done.returncode == 1
    assert "13 passed, 1 failed, 1 errors" in done.stdout


def test_a_part_that_wrote_nothing_is_named_and_fails_the_total(tmp_path: Path) -> None:
    junit(tmp_path / "a.xml", 10)
    (tmp_path / "b.xml").write_text("<testsuites><testsuite")  # cut off mid-write
    done = total(tmp_path, "a", "b", "c")
    assert done.returncode == 1
    assert "(1 of 3)" in done.stdout and "10 passed" in done.stdout
    assert "b (ParseError)" in done.stderr and "c (FileNotFoundError)" in done.stderr


def test_a_run_that_passed_no_test_fails(tmp_path: Path) -> None:
    junit(tmp_path / "a.xml", 0)
    assert total(tmp_path, "a").returncode == 1
