"""Files root writes on a node (the prolog, epilog, sampler and deliverer run as root) are
never written through a symbolic link (issue 20, finding 9): a link planted where a file,
a temporary file or a directory goes leaves its target as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu_eff.errors import SpoolError
from slurm_gpu_eff.node import export, spool
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.spool import Spool, write_json


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of someone's that a link may name."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_a_temporary_file_is_never_one_a_link_was_planted_as(tmp_path: Path, victim: Path) -> None:
    """The name the last version used (PATH.PID.tmp) could be foreseen, and was opened
    through a link there: the victim got the JSON, and the link was renamed into place."""
    path = tmp_path / "outbox" / "s.json"
    path.parent.mkdir()
    planted = Path(f"{path}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    write_json(str(path), {"a": 1})
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and path.read_text() == '{"a":1}'


def test_a_link_at_the_temporary_file_s_own_name_is_refused(tmp_path: Path, victim: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)  # a name foreseen after all
    path = tmp_path / "s.json"
    Path(f"{path}.{os.getpid()}.{'00' * 4}.tmp").symlink_to(victim)
    with pytest.raises(SpoolError, match="cannot write"):
        write_json(str(path), {"a": 1})
    assert victim.read_text() == "precious\n" and not path.exists()


def test_a_rejected_summary_s_reason_is_not_written_through_a_link(tmp_path: Path, victim: Path) -> None:
    node = Spool(str(tmp_path / "spool"))
    summary = Path(node.outbox) / "c-1-n.json"
    summary.parent.mkdir(parents=True)
    summary.write_text("{}")
    Path(node.dead).mkdir()
    (Path(node.dead) / "c-1-n.json.reason").symlink_to(victim)
    with pytest.raises(OSError):
        node.bury(str(summary), "rejected")
    assert victim.read_text() == "precious\n"


def test_a_spool_root_that_is_a_link_is_refused_not_chmodded(tmp_path: Path) -> None:
    """os.chmod follows a link: the last version made whatever it named 0700."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chmod(theirs, 0o755)
    (tmp_path / "spool").symlink_to(theirs)
    with pytest.raises(OSError, match="is a symbolic link"):
        Spool(str(tmp_path / "spool")).make_private()
    assert theirs.stat().st_mode & 0o777 == 0o755


def test_the_spool_root_is_still_made_private(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    Spool(str(root)).make_private()
    assert root.stat().st_mode & 0o777 == 0o700


def test_the_hook_log_is_not_appended_through_a_link(tmp_path: Path, victim: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "gpu1.log"
    log.symlink_to(victim)
    HookLog(str(log), "7", "prolog").write("started")
    assert victim.read_text() == "precious\n"
    assert "job=7 prolog" in capsys.readouterr().err  # where slurmd's log gets it


def test_an_export_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """A link where the textfile directory should be would choose where root creates files."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "textfile").symlink_to(elsewhere)
    with pytest.raises(OSError, match="is a symbolic link"):
        export.write(str(tmp_path / "textfile"), "7", [])
    assert list(elsewhere.iterdir()) == []


def test_removing_an_export_file_removes_a_link_not_its_target(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "textfile").mkdir()
    planted = Path(export.path_for(str(tmp_path / "textfile"), "7"))
    planted.symlink_to(victim)
    export.remove(str(tmp_path / "textfile"), "7")
    assert victim.read_text() == "precious\n" and not planted.is_symlink()


def test_a_directory_that_is_not_a_link_opens(tmp_path: Path) -> None:
    folder = spool.open_folder(str(tmp_path))
    os.close(folder)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        spool.open_folder(str(tmp_path / "file"))


def test_the_sampler_s_pid_file_is_never_written_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    from slurm_gpu_eff.node.hooks import PID_FILE, write_pid

    planted = tmp_path / f"{PID_FILE}.4242.part"
    planted.symlink_to(victim)
    write_pid(str(tmp_path), 4242, 1000.0)
    assert victim.read_text() == "precious\n"
    pid_file = tmp_path / PID_FILE
    assert not pid_file.is_symlink() and pid_file.read_text() == "4242 1000.000\n"
