"""What the hints weigh a job against (issue 23): each node's share as Slurm's config has
it, and whether a job was an interactive session, alike through either backend."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_gpu_eff.report.lookup import nodes_of
from slurm_gpu_eff.slurm import commands, inproc
from slurm_gpu_eff.slurm.records import interactive, node_share

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"

# A node of a site: cores held for the system (CoreSpecCount: CPUEfctv under CPUTot), GPUs
# of a type, a Reason and an OS with spaces in them.
SITE_LINE = (
    "NodeName=a100-07 Arch=x86_64 CoresPerSocket=32  CPUAlloc=8 CPUEfctv=60 CPUTot=64 "
    "CPULoad=3.10 AvailableFeatures=a100 ActiveFeatures=a100 Gres=gpu:a100:8(S:0-1) "
    "NodeAddr=a100-07 NodeHostName=a100-07 Version=24.11.5 OS=Linux 6.1.0 #1 SMP Debian "
    "RealMemory=515000 AllocMem=64000 FreeMem=400000 Sockets=2 Boards=1 CoreSpecCount=4 "
    "State=MIXED ThreadsPerCore=1 CfgTRES=cpu=64,mem=515000M,billing=64,gres/gpu=8,gres/gpu:a100=8 "
    "AllocTRES=cpu=8,mem=64000M,gres/gpu=1 Reason=fan noisy, see ticket 12 [admin@2026-11-01]"
)


def test_the_shares_from_scontrol_on_22_05() -> None:
    shares = commands.parse_node_lines((FIXTURES / "scontrol-show-node-22.05.txt").read_text())
    assert shares == {"gpu1": {"cpus": 4, "mem_mb": 4000, "gpus": 4},
                      "mig1": {"cpus": 4, "mem_mb": 4000, "gpus": 2}}


def test_usable_cpus_typed_gpus_and_spaces_in_values() -> None:
    assert commands.parse_node_lines(SITE_LINE) == {"a100-07": {"cpus": 60, "mem_mb": 515000, "gpus": 8}}


def test_a_node_without_gpus_or_memory_has_no_share() -> None:
    line = "NodeName=cpu1 CPUEfctv=8 CPUTot=8 RealMemory=1 CfgTRES=cpu=8,mem=1M,billing=8"
    assert commands.parse_node_lines(line) == {}
    assert node_share("cpu=8,gres/gpu=2", 8) is None  # no memory configured: not guessed


def test_scontrol_failing_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(command: list[str], timeout: float) -> Any:
        return SimpleNamespace(returncode=1, stdout=b"", stderr=b"slurm_load_node error")
    monkeypatch.setattr(commands, "run_slurm", fails)
    assert commands.node_shares(["gpu1"]) == {}


def test_names_that_are_not_node_names_are_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []
    def run(command: list[str], timeout: float) -> Any:
        asked.append(command)
        return SimpleNamespace(returncode=0, stdout=SITE_LINE.encode(), stderr=b"")
    monkeypatch.setattr(commands, "run_slurm", run)
    assert commands.node_shares(["a100-07", "-o", "x;y"]) == {"a100-07": {"cpus": 60, "mem_mb": 515000,
                                                                           "gpus": 8}}
    assert asked == [["scontrol", "show", "node", "-o", "a100-07"]]
    assert commands.node_shares(["--all"]) == {} and len(asked) == 1


def test_pyslurm_gives_the_same_share(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {"a100-07": SimpleNamespace(configured_gres={"gpu:a100": 8}, effective_cpus=60, total_cpus=64,
                                        real_memory=515000),
             "gpu1": SimpleNamespace(configured_gres={"gpu": 4}, effective_cpus=None, total_cpus=4,
                                     real_memory=4000)}
    def load(name: str) -> Any:
        if name not in nodes:
            raise ValueError("Invalid node name specified")
        return nodes[name]
    monkeypatch.setattr(inproc, "_module", lambda: SimpleNamespace(Node=SimpleNamespace(load=load)))
    backend = inproc.Pyslurm.__new__(inproc.Pyslurm)
    assert backend.node_shares(["a100-07", "gpu1", "gone"]) == {
        "a100-07": {"cpus": 60, "mem_mb": 515000, "gpus": 8}, "gpu1": {"cpus": 4, "mem_mb": 4000, "gpus": 4}}


@pytest.mark.parametrize(("steps", "said"), [
    (["12.batch", "12.extern", "12.0"], False),
    (["12.extern", "12.0"], True),  # salloc, then srun: no batch step
    (["12.interactive", "12.extern"], True),  # LaunchParameters=use_interactive_step
    (["12+0.batch", "12+0.0"], False),
    ([], None),  # no steps asked for (the usage sync), or none recorded: not known
])
def test_an_interactive_session_is_one_without_a_batch_step(steps: list[str], said: bool | None) -> None:
    assert interactive(steps) is said


def test_a_job_from_sacct_rows_says_whether_it_was_interactive() -> None:
    fields = commands.FIELDS
    def row(job_id: str) -> dict[str, str]:
        return {**dict.fromkeys(fields, ""), "JobID": job_id, "JobIDRaw": job_id, "State": "COMPLETED",
                "ElapsedRaw": "60", "NCPUS": "1", "NNodes": "1", "TimelimitRaw": "10", "NodeList": "gpu1"}
    assert commands.job_from_rows("7", [row("7"), row("7.extern"), row("7.0")]).interactive is True
    assert commands.job_from_rows("7", [row("7"), row("7.batch")]).interactive is False
    assert commands.job_from_rows("7", [row("7")]).interactive is None


def test_the_nodes_of_a_report_each_once() -> None:
    jobs = [SimpleNamespace(nodelist="gpu[1-2]"), SimpleNamespace(nodelist="gpu2,mig1"),
            SimpleNamespace(nodelist="None assigned")]
    assert nodes_of(jobs) == ["gpu1", "gpu2", "mig1"]  # type: ignore[arg-type]


# --- `gpueff JOBID`: every node's config asked beside sacct, read for the job's nodes --------

def _scontrol(tmp_path: Path, text: str) -> Path:
    """A scontrol that says each run in tmp_path/asked and prints `text`."""
    (tmp_path / "listing.txt").write_text(text)
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "asked"}\ncat {tmp_path / "listing.txt"}\n')
    script.chmod(0o755)
    return script


def _backend(tmp_path: Path, scontrol: Path, early_scontrol: Path) -> commands.Commands:
    from slurm_gpu_eff.config import Config
    from slurm_gpu_eff.slurm.sacct import EarlyRun

    early = SimpleNamespace(nodes=EarlyRun([str(early_scontrol), "show", "node", "-o"]))
    return commands.Commands(Config(scontrol=str(scontrol)), early=early)  # type: ignore[arg-type]


def test_the_early_listing_gives_the_job_s_nodes_as_asking_for_them_would(tmp_path: Path) -> None:
    listing = (FIXTURES / "scontrol-show-node-22.05.txt").read_text() + SITE_LINE + "\n"
    scontrol = _scontrol(tmp_path, listing)
    backend = _backend(tmp_path, scontrol, scontrol)
    asked_alone = commands.parse_node_lines(listing)
    assert backend.node_shares(["a100-07", "mig1", "gone"]) == {
        n: asked_alone[n] for n in ("a100-07", "mig1")}
    assert (tmp_path / "asked").read_text().splitlines() == ["show node -o"]  # the early one alone
    assert backend.node_shares(["gpu1"]) == {"gpu1": asked_alone["gpu1"]}  # read once: asked again
    assert (tmp_path / "asked").read_text().splitlines() == ["show node -o", "show node -o gpu1"]


def test_an_early_listing_of_another_scontrol_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    site = _scontrol(tmp_path / "site", SITE_LINE + "\n")
    other = _scontrol(tmp_path, "NodeName=a100-07 CPUTot=2 CfgTRES=cpu=2,mem=2M,gres/gpu=2\n")
    backend = _backend(tmp_path, site, other)
    assert backend.node_shares(["a100-07"]) == {"a100-07": {"cpus": 60, "mem_mb": 515000, "gpus": 8}}


def test_an_early_listing_that_fails_says_nothing(tmp_path: Path) -> None:
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\n"
                      "exit 1\n")
    script.chmod(0o755)
    assert _backend(tmp_path, script, script).node_shares(["gpu1"]) == {}
