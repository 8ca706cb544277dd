"""The node's GPU map (node/binding.py): `slurmd -G` asked once per node, not per job (on
Slurm 24.11+ each run sends a reconfigure request to every running step of the node, and
each of those jobs logs `slurmstepd: error: Unrecognized request`); its output parsed as
each release prints it; GPUs listed without device files refused, never guessed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import BindingError
from slurm_gpu_eff.node import binding
from slurm_gpu_eff.node.binding import (
    gpu_files,
    gpu_minors,
    gres_gpu_files,
    gres_gpu_minors,
    map_key,
    parse_gres_gpus,
    read_map,
    watched_paths,
    write_map,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RELEASES = ["22.05", "24.11", "26.05"]
CAPTURED_DEV = "/tmp/cap/dev"  # where the captured outputs' device files were
ROOT = os.geteuid() == 0  # really: the tests below pretend either way
MIG_TABLE = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\n"


def fixture(release: str, mig: bool = False, dev: str = CAPTURED_DEV) -> str:
    text = (FIXTURES / f"slurmd-G-{release}{'-mig' if mig else ''}.txt").read_text()
    return text.replace(CAPTURED_DEV, dev)


class Node:
    """A node in tmp_path: slurm.conf (SLURM_CONF) and gres.conf, device files, a fake
    slurmd that prints `output` to stderr and counts its runs, and a config naming them."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.monkeypatch = root, monkeypatch
        self.etc, self.dev = root / "etc", root / "dev"
        self.etc.mkdir()
        (self.etc / "slurm.conf").write_text("NodeName=gpu1 Gres=gpu:4\n")
        (self.etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
        monkeypatch.setenv("SLURM_CONF", str(self.etc / "slurm.conf"))
        self.boot = root / "boot_id"
        self.boot.write_text("boot-1\n")
        monkeypatch.setattr(binding, "BOOT_ID", str(self.boot))
        (root / "mig-minors").write_text(MIG_TABLE)
        self.slurmd, self.runs = root / "sbin" / "slurmd", root / "slurmd-runs"
        self.config = Config(slurmd=str(self.slurmd), gpu_map_file=str(root / "map" / "gpu-map-%n.json"),
                             mig_minors=str(root / "mig-minors"))
        self.map_file = Path(self.config.gpu_map_for("gpu1"))
        self.minors: dict[str, int] = {}
        self.devices({"nvidia0": 3, "nvidia1": 2, "nvidia2": 1, "nvidia3": 0})
        self.answer(fixture("24.11", dev=str(self.dev)))
        self.as_uid(0)

    def answer(self, output: str, status: int = 0) -> None:
        self.slurmd.parent.mkdir(exist_ok=True)
        self.slurmd.write_text(
            f"#!/bin/sh\necho run >>'{self.runs}'\ncat >&2 <<'EOF'\n{output}EOF\nexit {status}\n")
        self.slurmd.chmod(0o755)

    def asked(self) -> int:
        return len(self.runs.read_text().splitlines()) if self.runs.exists() else 0

    def devices(self, minors: dict[str, int]) -> None:
        """Character devices as root; elsewhere char_minor answers for them."""
        if not ROOT:
            self.minors.update(minors)
            self.monkeypatch.setattr(binding, "char_minor", lambda path: self.minors.get(Path(path).name))
            return
        for name, minor in minors.items():
            path = self.dev / ("nvidia-caps" if "cap" in name else "") / name
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(path, 0o600 | 0o020000, os.makedev(195, minor))

    def as_uid(self, uid: int) -> None:
        self.monkeypatch.setattr(os, "geteuid", lambda: uid)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return Node(tmp_path, monkeypatch)


# --- each release's output ------------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_each_releases_gpu_list_parses_to_the_same_positions(release: str) -> None:
    assert parse_gres_gpus(fixture(release)) == [[f"{CAPTURED_DEV}/nvidia{i}"] for i in range(4)]
    assert parse_gres_gpus(fixture(release, mig=True)) == [
        [f"{CAPTURED_DEV}/nvidia-caps/nvidia-cap12"], [f"{CAPTURED_DEV}/nvidia-caps/nvidia-cap21"]]


@pytest.mark.parametrize("release", RELEASES)
def test_each_releases_output_maps_slurms_indexes_to_minors(release: str, node: Node) -> None:
    node.answer(fixture(release, dev=str(node.dev)))
    assert gres_gpu_minors("gpu1", str(node.slurmd)) == {0: 3, 1: 2, 2: 1, 3: 0}


@pytest.mark.parametrize("release", RELEASES)
def test_each_releases_mig_output_maps_to_gpu_instances(release: str, node: Node) -> None:
    node.devices({"nvidia-cap12": 12, "nvidia-cap21": 21})
    node.answer(fixture(release, mig=True, dev=str(node.dev)))
    assert gpu_minors("gpu1", node.config) == {0: (0, 1), 1: (0, 2)}


def test_other_lines_with_gres_words_are_not_gpus() -> None:
    text = ("slurmd: error: gres/gpu: Name=gpu File=/dev/nvidia9 is not a GPU line\n"
            "slurmd: Gres Name=shard Type=(null) Count=8 Index=0 ID=1 File=/dev/nvidia0 Links=(null)\n"
            "[2026-11-26T07:21:37.866] Gres Name=gpu Type=h100 Count=1 Index=0 ID=1 File=/dev/nvidia0\n")
    assert parse_gres_gpus(text) == [["/dev/nvidia0"]]


# --- GPUs without device files: refused, never index = minor --------------------------------

AUTODETECT = ("slurmd: Gres Name=gpu Type=h100 Count=2 Index=0 ID=7696487 Links=(null) "
              "Flags=ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT\n")


def test_gpus_listed_without_device_files_are_refused(node: Node) -> None:
    node.answer(AUTODETECT)
    assert parse_gres_gpus(AUTODETECT) == [[], []]
    with pytest.raises(BindingError, match=r"slurmd -G lists GPUs without device files \(AutoDetect\?\)"):
        gres_gpu_files("gpu1", str(node.slurmd))
    with pytest.raises(BindingError, match="cannot map Slurm's GPU indexes to devices"):
        gpu_minors("gpu1", node.config)
    # The answer is kept: the next job is refused without asking slurmd again.
    with pytest.raises(BindingError, match="without device files"):
        gpu_minors("gpu1", node.config)
    assert node.asked() == 2  # gres_gpu_files once, the map once


def test_one_gpu_line_without_files_among_others_is_refused_too(node: Node) -> None:
    bare = "[2026-11-26T07:21:37.866] Gres Name=gpu Count=1 Index=4\n"
    node.answer(fixture("26.05", dev=str(node.dev)) + bare)
    with pytest.raises(BindingError, match="without device files"):
        gpu_minors("gpu1", node.config)


def test_a_slurmd_that_fails_is_no_answer_and_no_map(node: Node) -> None:
    node.answer("slurmd: error: Unable to determine this slurmd's NodeName\n", status=1)
    assert gpu_minors("gpu1", node.config) == {}
    assert not node.map_file.exists()
    assert gpu_minors("gpu1", node.config) == {}
    assert node.asked() == 2  # a failure is not kept: the next job asks again
    node.answer("slurmd: nothing here\n")  # ran well and lists no GPU: that is an answer
    assert gpu_minors("gpu1", node.config) == {} and gpu_minors("gpu1", node.config) == {}
    assert node.asked() == 3


# --- the map: asked once, renewed when what it depends on changes ---------------------------

def test_two_jobs_ask_slurmd_once(node: Node) -> None:
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert node.asked() == 1
    info = node.map_file.stat()
    assert oct(info.st_mode & 0o777) == "0o644"
    assert [p.name for p in node.map_file.parent.iterdir()] == ["gpu-map-gpu1.json"]  # no temporary left


def test_the_map_is_renewed_when_gres_conf_changes(node: Node) -> None:
    gpu_minors("gpu1", node.config)
    (node.etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-1]\n")
    node.answer(fixture("24.11", dev=str(node.dev)).replace("nvidia[0-3]", "nvidia[0-1]"))
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2}
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2}
    assert node.asked() == 2


@pytest.mark.parametrize("change", ["slurm.conf", "gres.conf appears", "gres.conf goes", "slurmd", "boot"])
def test_the_map_is_renewed_when_what_slurmd_reads_changes(node: Node, change: str) -> None:
    if change == "gres.conf appears":
        (node.etc / "gres.conf").unlink()
    gpu_minors("gpu1", node.config)
    if change == "slurm.conf":
        (node.etc / "slurm.conf").write_text("NodeName=gpu1 Gres=gpu:4 # edited\n")
    elif change == "gres.conf appears":
        (node.etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    elif change == "gres.conf goes":
        (node.etc / "gres.conf").unlink()
    elif change == "slurmd":  # a new release installed
        node.answer(fixture("26.05", dev=str(node.dev)))
    else:
        node.boot.write_text("boot-2\n")  # a reboot may renumber the devices
    gpu_minors("gpu1", node.config)
    gpu_minors("gpu1", node.config)
    assert node.asked() == 2


def test_each_node_of_a_host_has_its_own_map(node: Node) -> None:
    gpu_minors("gpu1", node.config)
    gpu_minors("gpu2", node.config)
    gpu_minors("gpu2", node.config)
    assert node.asked() == 2
    maps = sorted(p.name for p in node.map_file.parent.iterdir())
    assert maps == ["gpu-map-gpu1.json", "gpu-map-gpu2.json"]


def test_another_slurm_conf_renews_roots_map(node: Node, tmp_path: Path) -> None:
    gpu_minors("gpu1", node.config)
    other = tmp_path / "other"
    other.mkdir()
    (other / "slurm.conf").write_text("NodeName=gpu1\n")
    node.monkeypatch.setenv("SLURM_CONF", str(other / "slurm.conf"))
    gpu_minors("gpu1", node.config)
    assert node.asked() == 2


# --- only root writes it; others read root's, wait for it, ask slurmd only as a last resort ----

def test_a_user_without_a_map_asks_slurmd_says_so_and_writes_nothing(node: Node) -> None:
    node.as_uid(1000)
    said: list[str] = []
    assert gpu_minors("gpu1", node.config, warn=said.append) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert node.asked() == 1 and not node.map_file.exists()
    assert len(said) == 1 and "no current GPU map" in said[0] and "-G' instead" in said[0]


def test_a_user_reads_roots_map_whatever_their_environment(node: Node) -> None:
    gpu_minors("gpu1", node.config)  # the sampler, as root
    node.as_uid(1000)
    node.monkeypatch.delenv("SLURM_CONF")  # a job's environment need not be the prolog's
    node.monkeypatch.setenv("PATH", "/nowhere")
    said: list[str] = []
    assert gpu_minors("gpu1", node.config, warn=said.append) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert node.asked() == 1 and said == []


def test_a_user_waits_for_the_map_the_sampler_is_making(node: Node) -> None:
    node.as_uid(1000)
    key = map_key("gpu1", watched_paths(str(node.slurmd)))
    files = [[str(node.dev / f"nvidia{i}")] for i in range(4)]
    writer = threading.Timer(0.3, write_map, (str(node.map_file), key, files))
    writer.start()
    began = time.monotonic()
    try:
        assert gpu_minors("gpu1", node.config, wait_s=10) == {0: 3, 1: 2, 2: 1, 3: 0}
    finally:
        writer.join()
    assert node.asked() == 0 and time.monotonic() - began < 5


def test_a_user_with_a_stale_map_asks_slurmd_and_leaves_the_map_alone(node: Node) -> None:
    gpu_minors("gpu1", node.config)
    before = node.map_file.read_bytes()
    (node.etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-7]\n")
    node.as_uid(1000)
    said: list[str] = []
    gpu_minors("gpu1", node.config, wait_s=0.2, warn=said.append)
    assert node.asked() == 2 and len(said) == 1 and node.map_file.read_bytes() == before


def test_a_map_others_could_write_is_not_believed(node: Node) -> None:
    gpu_minors("gpu1", node.config)
    node.map_file.chmod(0o666)
    assert read_map(str(node.map_file), "gpu1") is None
    gpu_minors("gpu1", node.config)
    assert node.asked() == 2 and oct(node.map_file.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("text", ["", "{", "[]", '{"version": 1, "key": {}, "gpus": [[1]]}',
                                  '{"version": 99, "key": {}, "gpus": []}'])
def test_a_broken_map_is_renewed(node: Node, text: str) -> None:
    node.map_file.parent.mkdir()
    node.map_file.write_text(text)
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert node.asked() == 1 and read_map(str(node.map_file), "gpu1") is not None


def test_without_a_map_file_slurmd_is_asked_each_time(node: Node) -> None:
    gpu_files("gpu1", str(node.slurmd))
    gpu_files("gpu1", str(node.slurmd))
    assert node.asked() == 2


# --- making it ahead of time -------------------------------------------------------------------

def test_the_refresh_command_makes_the_map_once(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.configfile import write_config

    config = write_config(node.root / "gpueff.toml", {
        "gpu": {"map_file": node.config.gpu_map_file, "mig_minors": node.config.mig_minors},
        "slurm": {"slurmd": str(node.slurmd)}})
    node.monkeypatch.setenv("GPUEFF_CONFIG", str(config))
    assert binding.main(["--refresh", "gpu1"]) == 0
    assert f"{node.map_file}: made, 4 GPU position(s)" in capsys.readouterr().out
    assert binding.main(["--refresh", "gpu1"]) == 0
    assert "current" in capsys.readouterr().out and node.asked() == 1
    assert binding.main(["--refresh", "gpu1", "--force"]) == 0 and node.asked() == 2
    assert gpu_minors("gpu1", node.config) == {0: 3, 1: 2, 2: 1, 3: 0} and node.asked() == 2
    node.as_uid(1000)
    assert binding.main(["--refresh", "gpu1"]) == 1
    assert "only root makes the GPU map" in capsys.readouterr().err


def test_the_refresh_command_says_when_slurmd_gives_no_answer(
    node: Node, capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.configfile import write_config

    node.answer("slurmd: fatal: no\n", status=1)
    config = write_config(node.root / "gpueff.toml", {
        "gpu": {"map_file": node.config.gpu_map_file}, "slurm": {"slurmd": str(node.slurmd)}})
    node.monkeypatch.setenv("GPUEFF_CONFIG", str(config))
    assert binding.main(["--refresh", "gpu1"]) == 1
    assert "gave no answer: no map written" in capsys.readouterr().err


# --- the sampler -------------------------------------------------------------------------------

def run_job(hook_site: Any, job_id: str, until: str) -> None:
    from slurm_gpu_eff.node import hooks

    env = hook_site.export(hook_site.env(SLURM_JOB_ID=job_id))
    seen = hook_site.log().count(until)
    hooks.main(["prolog"], env)
    hook_site.sampler_pid(job_id)
    end = time.monotonic() + 15
    while hook_site.log().count(until) == seen:
        assert time.monotonic() < end, f"job {job_id}'s sampler never logged {until!r}"
        time.sleep(0.02)
    hooks.main(["epilog"], env)


def hook_node(hook_site: Any, monkeypatch: pytest.MonkeyPatch, output: str) -> Node:
    site = hook_site.root / "node"
    site.mkdir()
    node = Node(site, monkeypatch)
    node.answer(output.replace("DEV", str(node.dev)))
    hook_site.configure(gpu={"map_file": str(site / "gpu-map-%n.json")}, slurm={"slurmd": str(node.slurmd)})
    hook_site.export({"SLURM_CONF": str(node.etc / "slurm.conf")})
    return node


def test_two_jobs_samplers_ask_slurmd_once(hook_site: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if not ROOT:
        pytest.skip("the sampler process needs real device files: mknod needs root")
    hook_node(hook_site, monkeypatch, "slurmd: Gres Name=gpu Count=4 Index=0 ID=1 File=DEV/nvidia[0-3]\n")
    run_job(hook_site, "4242", "sampling")
    run_job(hook_site, "4243", "sampling")
    assert hook_site.log().count("Slurm indexes [0, 2] = minors [3, 1]") == 2
    assert (hook_site.root / "node" / "slurmd-runs").read_text().splitlines() == ["run"]


def test_a_sampler_refuses_gpus_listed_without_device_files(
    hook_site: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook_node(hook_site, monkeypatch, AUTODETECT)
    run_job(hook_site, "4242", "cannot sample")
    assert "cannot sample: slurmd -G lists GPUs without device files (AutoDetect?)" in hook_site.log()
    assert "taken as device minors" not in hook_site.log()  # no silent index = minor


# --- the in-job workload (the job's user) -------------------------------------------------------

def play(sim_node: Any, node: Node) -> None:
    """gpueff-sim's workload on Slurm's GPUs 0 and 2 of gpu1, for a moment."""
    from slurm_gpu_eff.config import load_config
    from slurm_gpu_eff.sim import workload

    config = load_config()
    config.slurmd, config.gpu_map_file, config.mig_minors = (
        node.config.slurmd, node.config.gpu_map_file, node.config.mig_minors)
    profile = node.root / "profile.json"
    profile.write_text('{"phases": [{"seconds": 0.05, "gpus": {"*": {"util": 50}}}]}')
    workload.run(str(profile), config, {"SLURM_JOB_GPUS": "0,2", "SLURMD_NODENAME": "gpu1"})
    published = sorted(p.name for p in (sim_node.state_dir / "gpu1").iterdir())
    assert published == ["gpu1.json", "gpu3.json"]  # indexes 0 and 2: minors 3 and 1


def test_the_workload_reads_roots_map_and_never_asks_slurmd(
    sim_node: Any, node: Node, capsys: pytest.CaptureFixture[str],
) -> None:
    gpu_minors("gpu1", node.config)  # the job's sampler, as root
    node.as_uid(1000)
    play(sim_node, node)
    assert node.asked() == 1 and capsys.readouterr().err == ""


def test_a_workload_without_a_map_asks_slurmd_as_a_last_resort_and_says_so(
    sim_node: Any, node: Node, capsys: pytest.CaptureFixture[str],
) -> None:
    from slurm_gpu_eff.sim import workload

    node.monkeypatch.setattr(workload, "MAP_WAIT_S", 0.2)
    node.as_uid(1000)
    play(sim_node, node)
    assert node.asked() == 1 and not node.map_file.exists()
    assert "gpueff-sim: no current GPU map" in capsys.readouterr().err
