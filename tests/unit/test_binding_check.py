"""A binding that checks itself (node/verify.py), and MIG slices named by Slurm's gres
index (node/binding.py: capability files through the driver's mig-minors table)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.node.binding import gres_gpu_minors, mig_table
from slurm_gpu_eff.node.verify import MISMATCH, UNVERIFIED, VERIFIED, BindingCheck, allowed_gpu_minors

MIG_TABLE = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu3/gi2/access 21\n"
MIG_A = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
MIG_B = "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"
BOOT = 1_700_000_000.0


# --- MIG through Slurm's gres indexes -----------------------------------------------------

def test_the_mig_minors_table_maps_capabilities_to_gpu_and_instance(tmp_path: Path) -> None:
    table = tmp_path / "mig-minors"
    table.write_text(MIG_TABLE + "gpu1/gi/access 9\ngarbage\ngpuX/gi1/access 5\n")
    assert mig_table(str(table)) == {12: (0, 1), 13: (0, 1), 21: (3, 2)}
    assert mig_table(str(tmp_path / "absent")) == {}


def fake_slurmd(tmp_path: Path, lines: list[str]) -> str:
    slurmd = tmp_path / "slurmd"
    slurmd.write_text("#!/bin/sh\n" + "".join(f"echo 'slurmd: {line}' >&2\n" for line in lines))
    slurmd.chmod(0o755)
    return str(slurmd)


def char_device(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod needs root")


def test_a_gres_index_on_a_capability_file_maps_to_its_mig_instance(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    char_device(dev / "nvidia0", 195, 0)
    char_device(dev / "nvidia-caps" / "nvidia-cap12", 238, 12)
    char_device(dev / "nvidia-caps" / "nvidia-cap13", 238, 13)
    char_device(dev / "nvidia-caps" / "nvidia-cap21", 238, 21)
    char_device(dev / "nvidia-caps" / "nvidia-cap40", 238, 40)  # in no table
    (tmp_path / "mig-minors").write_text(MIG_TABLE)
    slurmd = fake_slurmd(tmp_path, [
        f"Gres Name=gpu Type=1g.10gb Count=1 Index=0 ID=1 File={dev}/nvidia0,{dev}/nvidia-caps/nvidia-cap12,"
        f"{dev}/nvidia-caps/nvidia-cap13",  # parent, GI and CI access: one slice
        f"Gres Name=gpu Type=1g.10gb Count=1 Index=1 ID=1 File={dev}/nvidia-caps/nvidia-cap21",
        f"Gres Name=gpu Type=1g.10gb Count=1 Index=2 ID=1 File={dev}/nvidia-caps/nvidia-cap40",
    ])
    assert gres_gpu_minors("n1", slurmd, str(tmp_path / "mig-minors")) == {0: (0, 1), 1: (3, 2)}


def test_a_mig_slice_named_by_slurms_index_is_bound_to_that_instance(sim_node: Any) -> None:
    spec = {"minor": 3, "uuid": "GPU-33333333-3333-3333-3333-333333333333", "name": "H100",
            "mig": [{"gi_id": 1, "uuid": MIG_A}, {"gi_id": 2, "uuid": MIG_B}]}
    sim_node.write_devices({"gpu1": [spec]})
    (gpu,) = sim_node.session().bind([1], {1: (3, 2)})
    assert (gpu.index, gpu.minor, gpu.uuid, gpu.gi_id) == (1, 3, MIG_B, 2)
    assert gpu.is_mig and gpu.parent_uuid == spec["uuid"]
    from slurm_gpu_eff.errors import BindingError

    with pytest.raises(BindingError, match=r"no MIG instance 5 on the GPU with minor number 3 \(Slurm"):
        sim_node.session().bind([0], {0: (3, 5)})


# --- the cgroup's device list --------------------------------------------------------------

@pytest.mark.parametrize(("text", "allowed"), [
    ("a *:* rwm\n", None),  # allow-all (with hidden exceptions): names nothing
    ("c 195:1 rwm\nc 195:255 rwm\nc 195:254 rw\nc 1:3 rwm\n", [1]),
    ("c 195:3 rwm\nc 195:0 rw\n", [0, 3]),
    ("c 195:* rwm\n", None),
    ("b 8:0 r\n", []),
])
def test_allowed_gpu_minors_reads_a_whitelist(text: str, allowed: list[int] | None) -> None:
    assert allowed_gpu_minors(text) == allowed


def cgroup(root: Path, job: str, text: str, node: str = "gpu1") -> None:
    where = root / "devices" / f"slurm_{node}" / "uid_1000" / f"job_{job}"
    where.mkdir(parents=True)
    (where / "devices.list").write_text(text)


def test_a_cgroup_that_allows_exactly_the_bound_gpus_verifies(tmp_path: Path) -> None:
    check = BindingCheck("42", "gpu1", [1, 3], str(tmp_path))
    assert check.cgroup() is False  # not there yet: the job's step has not started
    cgroup(tmp_path, "42", "c 195:3 rwm\nc 195:1 rwm\nc 195:255 rwm\n")
    assert check.cgroup() is True
    assert check.result() == {"status": VERIFIED,
                              "evidence": ["the job's cgroup allows exactly GPU minors [1, 3]"]}


def test_a_cgroup_that_allows_other_gpus_is_a_mismatch(tmp_path: Path) -> None:
    cgroup(tmp_path, "42", "c 195:2 rwm\n")
    check = BindingCheck("42", "gpu1", [1], str(tmp_path))
    check.cgroup()
    assert check.result()["status"] == MISMATCH
    assert "allows GPU minors [2], the sampler was bound to [1]" in str(check.result()["evidence"])


def test_an_allow_all_cgroup_says_nothing(tmp_path: Path) -> None:
    cgroup(tmp_path, "42", "a *:* rwm\n")
    check = BindingCheck("42", "gpu1", [1], str(tmp_path))
    assert check.cgroup() is True
    assert check.result()["status"] == UNVERIFIED


# --- the job's processes ----------------------------------------------------------------------

def test_a_job_process_on_a_bound_gpu_verifies_and_others_jobs_do_not_count(tmp_path: Path) -> None:
    check = BindingCheck("42", "gpu1", [1], str(tmp_path))
    check.processes(1, {500: "7", 501: None}, bound=True)
    assert check.result()["status"] == UNVERIFIED
    check.processes(1, {502: "42"}, bound=True)
    check.processes(1, {502: "42"}, bound=True)  # once is enough
    assert check.result() == {"status": VERIFIED,
                              "evidence": ["process 502 of job 42 runs on bound GPU minor 1"]}


def test_a_job_process_on_a_gpu_not_bound_is_a_mismatch(tmp_path: Path) -> None:
    check = BindingCheck("42", "gpu1", [1], str(tmp_path))
    check.processes(1, {502: "42"}, bound=True)
    check.processes(2, {503: "42", 504: "7"}, bound=False)
    result = check.result()
    assert result["status"] == MISMATCH
    assert result["evidence"][0] == ("process 503 of job 42 runs on GPU minor 2, which this sampler "
                                     "was not bound to")


def test_the_jobs_processes_named_by_its_sluid_count(tmp_path: Path) -> None:
    """Slurm 26.05 names a job's cgroup after its SLUID: job_of_pid() gives that, not the id."""
    sluid = "s51SM8AT3HNP00"
    check = BindingCheck("42", "gpu1", [1], str(tmp_path), sluid=sluid)
    check.processes(1, {500: "s51SM8AT3HNP01", 501: "", 502: None}, bound=True)  # not ours
    assert check.result()["status"] == UNVERIFIED
    check.processes(1, {502: sluid}, bound=True)
    assert check.result() == {"status": VERIFIED,
                              "evidence": ["process 502 of job 42 runs on bound GPU minor 1"]}
    check.processes(2, {503: sluid}, bound=False)
    assert check.result()["status"] == MISMATCH


def test_without_a_sluid_no_process_outside_any_job_is_taken_for_the_jobs(tmp_path: Path) -> None:
    check = BindingCheck("42", "gpu1", [1], str(tmp_path))
    check.processes(2, {1: "", 2: None}, bound=False)
    assert check.result()["status"] == UNVERIFIED


def test_the_sampler_looks_at_the_nodes_other_gpus(sim_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's workload plays on minor 2 while the sampler is bound to minor 0: the
    summary says mismatch (the workload's pid is this test process; its job is faked)."""
    from slurm_gpu_eff.node import gpustats
    from slurm_gpu_eff.node import sampler as sampler_module
    from slurm_gpu_eff.node.jobenv import JobContext

    sim_node.write_state(2, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80}}}]},
                         started_at=sim_node.now - 10, pid=os.getpid())

    def job_of_pid(pid: int) -> str:
        return "4242" if pid == os.getpid() else ""

    monkeypatch.setattr(sampler_module, "job_of_pid", job_of_pid)  # the node's other GPUs
    monkeypatch.setattr(gpustats, "job_of_pid", job_of_pid)  # the bound ones
    session = sim_node.session()
    gpus = session.bind([0])
    job = JobContext(job_id="4242", node="gpu1")
    sampler = sampler_module.Sampler(job, sim_node.config, gpus, clock=sim_node.clock,
                                     other_processes=session.other_processes,
                                     cgroup_root=str(sim_node.state_dir / "no-cgroups"))
    sampler.sample_once()
    binding = sampler.snapshot("running").binding
    assert binding is not None and binding["status"] == MISMATCH
    assert f"process {os.getpid()} of job 4242 runs on GPU minor 2" in binding["evidence"][0]


# --- did the job use any GPU at all? (an unverified binding's gpu_use) -----------------------------

def jobs(table: dict[int, str | None]) -> Any:
    return lambda pid: table.get(pid, "")


def test_whole_looks_that_find_none_of_the_jobs_processes_say_no_gpu_was_used() -> None:
    check = BindingCheck("42", "gpu1", [0])
    for _ in range(3):
        check.node_scan([(0, []), (1, [7]), (2, [])], jobs({7: "99"}))  # job 99's process on minor 1
    result = check.result()
    assert result["status"] == UNVERIFIED and result["gpu_use"] == "none"
    assert "no process of the job on any GPU of the node in 3 looks at all of them" in result["evidence"]


@pytest.mark.parametrize(("listing", "table", "why"), [
    (None, {}, "not every GPU of the node could be listed"),
    ([(0, []), (1, [7])], {7: None}, "whose process 7 on GPU minor 1 was could not be read"),
    # in no job's cgroup: it may be the job's (a container, an ssh session): the look is not whole
    ([(0, []), (1, [7])], {7: ""}, "process 7 on GPU minor 1 is in no job's cgroup"),
])
def test_a_look_that_is_not_whole_leaves_the_gpu_use_unknown_for_good(
    listing: Any, table: dict[int, str | None], why: str,
) -> None:
    check = BindingCheck("42", "gpu1", [0])
    check.node_scan([(0, []), (1, [])], jobs({}))
    check.node_scan(listing, jobs(table))
    check.node_scan([(0, []), (1, [])], jobs({}))  # whole again: too late, a look was missed
    result = check.result()
    assert result["gpu_use"] == "unknown"
    assert f"whether the job used any GPU is unknown: {why}" in result["evidence"]


def test_the_jobs_process_on_any_gpu_settles_the_binding_and_ends_the_looks() -> None:
    bound = BindingCheck("42", "gpu1", [0])
    bound.node_scan([(0, [5]), (1, [])], jobs({5: "42"}))
    assert bound.settled() and bound.result()["status"] == VERIFIED and "gpu_use" not in bound.result()
    elsewhere = BindingCheck("42", "gpu1", [0])
    elsewhere.node_scan([(0, []), (1, [5])], jobs({5: "42"}))
    assert elsewhere.result()["status"] == MISMATCH
    elsewhere.node_scan(None, jobs({}))  # settled: no more looks, nothing changes
    assert elsewhere.scan_gap == "" and elsewhere.result()["status"] == MISMATCH


def test_the_session_lists_every_gpu_of_the_node_compute_and_graphics(sim_node: Any) -> None:
    session = sim_node.session()
    session.bind([0])
    listed = session.node_processes()
    assert listed is not None and sorted(m for m, _ in listed) == [0, 1, 2, 3]
    session.unlisted = 1  # a GPU NVML could not name at binding: the look is partial
    assert session.node_processes() is None


def test_a_gpu_that_cannot_list_its_graphics_processes_makes_the_look_partial(sim_node: Any) -> None:
    devices = [{"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000"},
               {"minor": 1, "uuid": "GPU-11111111-1111-1111-1111-111111111111",
                "unsupported": ["nvmlDeviceGetGraphicsRunningProcesses_v3"]}]
    sim_node.write_devices({"gpu1": devices})
    session = sim_node.session()
    session.bind([0])
    assert session.node_processes() is None


def test_a_sampler_whose_job_never_opens_a_gpu_says_so(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another job's process works on minor 2; this job (4242) has none anywhere: unverified
    (no cgroup device list here), and no GPU used."""
    from slurm_gpu_eff.node import sampler as sampler_module
    from slurm_gpu_eff.node.jobenv import JobContext

    sim_node.write_state(2, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80}}}]},
                         started_at=sim_node.now - 10, pid=os.getpid())
    monkeypatch.setattr(sampler_module, "job_of_pid", lambda pid: "77")
    session = sim_node.session()
    gpus = session.bind([0])
    sampler = sampler_module.Sampler(JobContext(job_id="4242", node="gpu1"), sim_node.config, gpus,
                                     clock=sim_node.clock, other_processes=session.other_processes,
                                     node_processes=session.node_processes,
                                     cgroup_root=str(sim_node.state_dir / "no-cgroups"))
    for _ in range(2):
        sim_node.now += 1
        sampler.sample_once()
    binding = sampler.snapshot("running").binding
    assert binding is not None and binding["status"] == UNVERIFIED and binding["gpu_use"] == "none"



def test_the_node_is_listed_no_more_once_a_look_can_tell_nothing(sim_node: Any) -> None:
    """A partial look ends the looks for good, as settling the binding does: the sampler
    then lists no GPU of the node at each poll (a poll's CPU, make bench)."""
    from slurm_gpu_eff.node import sampler as sampler_module
    from slurm_gpu_eff.node.jobenv import JobContext

    session = sim_node.session()
    gpus = session.bind([0])
    looks: list[int] = []

    def partial() -> None:
        looks.append(1)

    sampler = sampler_module.Sampler(JobContext(job_id="4242", node="gpu1"), sim_node.config, gpus,
                                     clock=sim_node.clock, node_processes=partial,
                                     cgroup_root=str(sim_node.state_dir / "no-cgroups"))
    assert sampler.binding.scanning()
    for _ in range(3):
        sim_node.now += 1
        sampler.sample_once()
    assert looks == [1] and not sampler.binding.scanning()
    binding = sampler.snapshot("running").binding
    assert binding is not None and binding["gpu_use"] == "unknown"
    settled = BindingCheck("42", "gpu1", [0])
    settled.node_scan([(0, [5])], jobs({5: "42"}))
    assert not settled.scanning()


def test_a_look_at_the_node_takes_the_bound_gpus_compute_processes_from_their_read(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the binding is unsettled each poll looks at every GPU of the node; a bound
    GPU's compute processes are the ones its read of the same poll listed, not asked for
    twice (an NVML call a GPU a poll). Outside a poll, or once taken, they are asked for."""
    import pynvml

    from slurm_gpu_eff.node import sampler as sampler_module
    from slurm_gpu_eff.node.jobenv import JobContext

    sim_node.write_state(0, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80}}}]},
                         started_at=sim_node.now - 10, pid=os.getpid())
    monkeypatch.setattr(sampler_module, "job_of_pid", lambda pid: "77")
    asked: list[Any] = []
    real = pynvml.nvmlDeviceGetComputeRunningProcesses

    def counted(handle: Any) -> Any:
        asked.append(handle)
        return real(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", counted)
    session = sim_node.session()
    gpus = session.bind([0])
    sampler = sampler_module.Sampler(JobContext(job_id="4242", node="gpu1"), sim_node.config, gpus,
                                     clock=sim_node.clock, other_processes=session.other_processes,
                                     node_processes=session.node_processes,
                                     cgroup_root=str(sim_node.state_dir / "no-cgroups"))
    asked.clear()
    for _ in range(3):
        sim_node.now += 1
        sampler.sample_once()
    bound = gpus[0].handle
    # once a poll on the bound GPU (its read); the others once a poll (the look) and once
    # more for the first poll's look at the job's processes elsewhere (Sampler._verify)
    assert sum(h is bound for h in asked) == 3 and len(asked) == 3 + 3 * 3 + 3
    binding = sampler.snapshot("running").binding
    assert binding is not None and binding["gpu_use"] == "none" and sampler.binding.scans == 3
    listed = session.node_processes()  # taken by the last look: asked for again
    assert listed is not None and dict(listed)[0] and sum(h is bound for h in asked) == 4

# --- the report -------------------------------------------------------------------------------

def test_the_report_says_how_far_the_binding_was_checked(make_job: Any, make_summary: Any) -> None:
    import json

    from slurm_gpu_eff.report.job import build_report
    from slurm_gpu_eff.report.render import render_json, render_text

    unchecked = build_report(make_job(), [make_summary()])  # a summary from before the check
    assert unchecked.binding_status == UNVERIFIED
    assert "GPU Binding: unverified\n" in render_text(unchecked)
    good = {"status": VERIFIED, "evidence": ["process 9 of job 4242 runs on bound GPU minor 0"]}
    verified = build_report(make_job(), [make_summary(binding=good)])
    assert "GPU Binding: verified\n" in render_text(verified)
    assert json.loads(render_json(verified))["binding"] == {"status": VERIFIED, "nodes": {"gpu1": good}}
    bad = {"status": MISMATCH, "evidence": ["process 9 of job 4242 runs on GPU minor 2, which this "
                                            "sampler was not bound to"]}
    wrong = build_report(make_job(nodelist="gpu[1-2]", nnodes=2),
                         [make_summary(binding=good), make_summary(node="gpu2", binding=bad)])
    text = render_text(wrong)
    assert "GPU Binding: mismatch (the figures may be of another GPU: see the notes)" in text
    unused = {"status": UNVERIFIED, "gpu_use": "none", "evidence": ["no process of the job on any GPU"]}
    shown = render_text(build_report(make_job(), [make_summary(binding=unused)]))
    assert ("gpu1: no process of the job ran on any GPU of the node while it was sampled: its GPUs "
            "were not used, whichever they are") in shown
    assert ("gpu2: the GPUs measured may not be the job's own: process 9 of job 4242 runs on GPU "
            "minor 2") in text


def test_an_index_slurmd_does_not_list_is_refused_not_guessed(sim_node: Any) -> None:
    """Where slurmd -G answered, an index missing from its list (a MIG slice whose
    capability is in no table, say) is an error: index = minor would be a guess."""
    from slurm_gpu_eff.errors import BindingError

    with pytest.raises(BindingError, match="Slurm's GPU index 2 is not in slurmd's GPU list"):
        sim_node.session().bind([2], {0: 0, 1: 1})
    (gpu,) = sim_node.session().bind([2], {})  # slurmd said nothing: gres.conf order, index = minor
    assert gpu.minor == 2


def test_a_bound_gpus_processes_are_looked_at_again_only_when_their_pids_change() -> None:
    """wants() answers every poll: the same (pid, memory) list, or the same pids with their
    memory moved, tell nothing new; another pid does, and so does one gone, until one of
    the job's was seen on the GPU."""
    check = BindingCheck("7", "gpu1", [0])
    answers = [check.wants(0, pids) for pids in (
        [(10, 5)], [(10, 5)], [(10, 6)], [(10, 6)], [(10, 6), (11, 1)], [(10, 6), (11, 1)],
        [(11, 1)], [(10, 5)], [])]
    assert answers == [True, False, False, False, True, False, True, True, True]
    assert check.wants(1, [(10, 5)])  # each GPU its own
    check.processes(0, {10: "7"}, bound=True)
    assert not check.wants(0, [(12, 1)])
