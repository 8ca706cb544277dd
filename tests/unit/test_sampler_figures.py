"""The sampler's figures, pinned whole: a seeded run of 4 simulated GPUs (driver samples
with jitter and out of order, GPM, a GPU without an energy counter, a shared GPU, idle
stretches, throttling, XIDs, an energy reset, NVML failing for a while, late polls and
gaps, a wall clock stepped both ways) through the real Sampler, pynvml and the stand-in
library, polled at irregular intervals. Every summary it gives, mid-run and at the end,
must be what tests/fixtures/sampler/figures.jsonl holds: the sampler's CPU work a poll is
tuned by hand (make bench), and no such change may move a figure.

After a change that is meant to move figures, `GPUEFF_WRITE_FIGURES=1 .venv/bin/python -m
pytest tests/unit/test_sampler_figures.py` rewrites the fixture (review its diff)."""

from __future__ import annotations

import collections
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config, SteppedClock
from slurm_gpu_eff.node import gpustats
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.sampler import ENERGY_EVERY_S, MEM_SAMPLES_EVERY_S, Sampler

from .conftest import BOOT, SIM_DEVICES

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "sampler" / "figures.jsonl"
OTHER_PID = 1  # another job's process on the shared GPU (its job: "77")


def devices() -> list[dict[str, Any]]:
    """gpu1's devices, with a driver that jitters its sample windows and one that lists
    them newest first."""
    table = [dict(spec) for spec in SIM_DEVICES]
    table[0]["quirks"] = ["samples_jitter"]
    table[1]["quirks"] = ["samples_reversed"]
    return table


def profiles() -> dict[int, dict[str, Any]]:
    wave = {"low": 5, "high": 95, "period_s": 7, "duty": 0.4}
    return {
        0: {"phases": [
            {"seconds": 360, "gpus": {"*": {"util": wave, "mem_util": 30, "mem_used_gib": 20,
                                            "power_w": 350, "sm_active": 60, "tensor_active": 20,
                                            "processes": 2}}},
            {"seconds": 270, "gpus": {"*": {"util": 1, "power_w": 80, "throttle": ["power_cap"]}}},
            {"seconds": 120, "gpus": {"*": {"util": 70, "nvml_error": True}}},
            {"seconds": 600, "gpus": {"*": {"util": 85, "sm_active": 75, "power_w": 500,
                                            "throttle": ["sw_thermal", "hw_slowdown"], "xid": [79]}}},
        ]},
        1: {"phases": [
            {"seconds": 450, "gpus": {"*": {"util": 0, "power_w": 70}}},
            {"seconds": 900, "gpus": {"*": {"util": {"low": 0, "high": 100, "period_s": 30, "duty": 0.5},
                                            "mem_used_gib": 60, "power_w": 600, "energy_reset": True}}},
        ]},
        2: {"phases": [  # shared with job 77's process: per-process samples split it
            {"seconds": 1350, "gpus": {"*": {"util": 55, "shared_util": 25, "power_w": 300,
                                            "mem_used_gib": 10, "sm_active": 40}}},
        ]},
        3: {"phases": [  # no energy counter (SIM_DEVICES): the power draw integrated
            {"seconds": 600, "gpus": {"*": {"util": 30, "power_w": 200, "temp_c": 60}}},
            {"seconds": 750, "gpus": {"*": {"util": 3, "power_w": 60, "xid": [31, 43]}}},
        ]},
    }


def run_figures(sim_node: Any, offset_file: Path, counter_by_cadence: bool = False,
                polled: list[int] | None = None) -> list[dict[str, Any]]:
    """The scenario: the summaries it gives (two mid-run snapshots and the last).
    `counter_by_cadence`: the energy counter and the memory samples read as the sampler's
    loop reads them (every ENERGY_EVERY_S and MEM_SAMPLES_EVERY_S, and at the poll before
    each summary), not at every poll. `polled` gets the number of polls."""
    rng = random.Random(21)
    own = os.getpid()
    for minor, profile in profiles().items():
        sim_node.write_state(minor, profile, started_at=BOOT + 995.0, pid=own)
    mono = [500.0]
    session = sim_node.session()
    session.steady = lambda: mono[0]
    session.clock = SteppedClock(sim_node.clock, str(offset_file), lambda: mono[0])
    gpus = session.bind([0, 1, 2, 3])
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(interval_s=1.0, idle_alert_min=1),
                      gpus, clock=session.clock, monotonic=lambda: mono[0],
                      xid_events=session.xid_events)
    snapshots = []
    polls = 0
    while sim_node.now < BOOT + 2400.0:
        step = rng.choice((0.25, 0.5, 1.0, 1.0, 1.0, 1.5, 2.0, 3.3))
        if rng.random() < 0.004:
            step = 45.0  # a late poll: a gap no reading covers
        sim_node.now += step
        mono[0] += step
        if polls in (400, 900):  # NTP steps the wall clock (not the monotonic one)
            offset_file.write_text("-120" if polls == 400 else "0")
        before_summary = polls in (199, 499) or sim_node.now >= BOOT + 2400.0
        sampler.sample_once(before_summary or not counter_by_cadence)
        sampler.idle_level()
        polls += 1
        if polls in (200, 500):
            snapshots.append(sampler.snapshot("running").to_dict())
    snapshots.append(sampler.snapshot("complete").to_dict())
    session.close()
    if polled is not None:
        polled.append(polls)
    return snapshots


@pytest.fixture
def figures(sim_node: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sim_node.write_devices({"gpu1": devices()})
    # the job's own processes are this test's pid; the stand-in lists the other job's as pid 1
    monkeypatch.setattr(gpustats, "job_of_pid", lambda pid: "9" if pid == os.getpid() else "77")
    snapshots = run_figures(sim_node, tmp_path / "offset")
    for snapshot in snapshots:
        del snapshot["frameworks"]  # what this test process maps: not the sampler's figures
    # The pid varies by run: named in the binding's evidence alone, and only there replaced
    # (the bare digits may stand in any figure: CI's pid 2xxx broke a float's JSON once)
    own = f"process {os.getpid()} of job"
    return json.loads(json.dumps(snapshots).replace(own, "process OWN of job"))


def test_the_energy_counter_and_memory_samples_read_by_cadence_give_the_same_figures(
    figures: list[dict[str, Any]], sim_node: Any, tmp_path: Path, calls: list[Any],
) -> None:
    """The loop reads the energy counter ENERGY_EVERY_S apart (a third of a poll's CPU on a
    Hopper GPU) and the memory-utilisation samples MEM_SAMPLES_EVERY_S apart (another
    quarter), and both at the poll before each summary. A counter loses nothing between
    reads, so every summary is the same, but where the counter was reset (a driver reload)
    between two reads: the energy of that stretch before the reset is not counted. The
    driver keeps its samples till they are read: the same samples, the same values. What
    moves is the time counted: where this scenario polls faster than the driver's period
    (0.25 s steps), a poll that finds no new GPU sample reads the memory samples and,
    none new either, lets the rate stand for its time (the next samples cover only the rest
    of their windows, SampleSeries.covered); by cadence they may come in the same poll instead; and
    a short batch of jittered samples is judged by a period a longer batch's median puts
    elsewhere. So the memory figure's time is within half a second of what it was and of
    the time sampled, and its mean moves by a rate that stood for the sample's value."""
    sim_node.now = BOOT + 1000.0  # the scenario again, from its start
    calls.clear()
    polled: list[int] = []
    by_cadence = json.loads(json.dumps(run_figures(sim_node, tmp_path / "offset-2", True, polled))
                            .replace(str(os.getpid()), "OWN"))
    energy_reads = calls.count("nvmlDeviceGetTotalEnergyConsumption")
    assert 0 < energy_reads < 3 * 2400 / ENERGY_EVERY_S  # 3 GPUs with a counter: not every poll
    # The memory samples: at under half the polls (the scenario's steps average ~1.7 s, and
    # a poll that finds no new GPU sample, a third of them where the driver's period is 1 s,
    # reads them too). GPU 0's buffer overflowed while NVML failed (120 s unread; it holds
    # 60 s), its GPU samples' too: a sampler stopped, no buffer too short for the cadence.
    memory = collections.Counter(call[1] for call in calls if isinstance(call, tuple))
    assert polled[0] / 2 > max(memory.values()) >= min(memory.values()) > 0 and len(memory) == 4
    for got, want in zip(by_cadence, figures, strict=True):
        del got["frameworks"]
        reset = {g["minor"]: g.pop("energy_j") for g in got["gpus"] if g["minor"] == 1}
        pinned = {g["minor"]: g.pop("energy_j") for g in want["gpus"] if g["minor"] == 1}
        for g in (*got["gpus"], *want["gpus"]):  # the counter's errors: fewer reads, fewer
            g["errors"] = [re.sub(r" \(\d+ times\)$", "", e) if "Energy" in e else e for e in g["errors"]]
        for g, w in zip(got["gpus"], want["gpus"], strict=True):
            memory, before = g["metrics"].pop("mem_util"), w["metrics"].pop("mem_util")
            assert [memory[k] for k in ("min", "max", "last")] == [before[k] for k in ("min", "max", "last")]
            assert g["sampled_s"] - 0.5 <= memory["seconds"] <= before["seconds"] + 0.5, g["minor"]
            assert memory["mean"] == pytest.approx(before["mean"], abs=0.05)
        assert got == want
        # GPU 1's counter restarts at 1310 s; the last read before may be 10 s (at 600 W) earlier
        assert pinned[1] - 600 * ENERGY_EVERY_S <= reset[1] <= pinned[1]


def test_the_memory_samples_come_by_the_driver_s_seconds(sim_node: Any, calls: list[Any]) -> None:
    """The driver's buffer holds so many of its own seconds: under a simulation's time_scale
    (8 driver seconds a wall second here) the cadence is MEM_SAMPLES_EVERY_S of them, not of
    the wall clock. A full poll (the one before a summary) reads them whatever the cadence,
    and the cadence counts from it."""
    profile = {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 80, "mem_util": 40}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    session = sim_node.session()
    mono = [500.0]
    sampler = Sampler(JobContext(job_id="9", node="gpu1"), Config(), session.bind([0]),
                      clock=session.clock, monotonic=lambda: mono[0], time_scale=8.0)
    read_at = []
    for poll in range(21):  # a driver second a poll
        sim_node.now += 1.0
        mono[0] += 0.125
        before = len(calls)
        sampler.sample_once(poll in (12, 20))  # full at 12 and at the end
        if any(isinstance(call, tuple) for call in calls[before:]):  # the memory samples'
            read_at.append(poll)
    assert MEM_SAMPLES_EVERY_S == 5 and read_at == [0, 5, 10, 12, 17, 20]
    memory = sampler.gpus[0].stat("mem_util")
    assert memory.mean == 40.0 and memory.seconds == pytest.approx(sampler.gpus[0].seconds, abs=0.5)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The energy counter's reads and the memory samples' (through pynvml: the names the
    sampler calls)."""
    import pynvml

    made: list[Any] = []
    counter, samples = pynvml.nvmlDeviceGetTotalEnergyConsumption, pynvml.nvmlDeviceGetSamples

    def counted(handle: Any) -> int:
        made.append("nvmlDeviceGetTotalEnergyConsumption")
        return counter(handle)

    def sampled(handle: Any, kind: int, since: int) -> Any:
        if kind == pynvml.NVML_MEMORY_UTILIZATION_SAMPLES:
            made.append(("memory samples", pynvml.nvmlDeviceGetMinorNumber(handle)))
        return samples(handle, kind, since)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", counted)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", sampled)
    return made


def test_the_sampler_gives_the_pinned_figures(figures: list[dict[str, Any]]) -> None:
    if os.environ.get("GPUEFF_WRITE_FIGURES"):
        write_fixture(figures)
    expected = read_fixture()
    assert len(figures) == len(expected)
    for got, want in zip(figures, expected, strict=True):
        for g, w in zip(got["gpus"], want["gpus"], strict=True):
            assert g == w, f"GPU minor {w['minor']} differs"
        assert got == want


def write_fixture(snapshots: list[dict[str, Any]]) -> None:
    """JSON lines: each snapshot with its GPU count for "gpus", then one line a GPU."""
    lines = []
    for snapshot in snapshots:
        lines.append({**snapshot, "gpus": len(snapshot["gpus"])})
        lines += snapshot["gpus"]
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines), encoding="utf-8")


def read_fixture() -> list[dict[str, Any]]:
    lines = iter(FIXTURE.read_text(encoding="utf-8").splitlines())
    snapshots = []
    for line in lines:
        snapshot = json.loads(line)
        snapshot["gpus"] = [json.loads(next(lines)) for _ in range(snapshot["gpus"])]
        snapshots.append(snapshot)
    return snapshots


def test_the_scenario_covers_what_it_pins(figures: list[dict[str, Any]]) -> None:
    """What the scenario is for: each path of a poll's statistics taken at least once."""
    last = figures[-1]
    gpu = {g["minor"]: g for g in last["gpus"]}
    assert gpu[0]["util_source"] == "samples" and gpu[0]["gpm"]
    assert gpu[0]["throttle_s"]["power_cap"] > 0 and gpu[0]["xid_events"]
    assert any("Unknown Error" in e for e in gpu[0]["errors"])
    assert gpu[1]["energy_source"] == "counter" and gpu[1]["idle_longest"]["seconds"] >= 200
    assert gpu[2]["shared_with"] == ["job 77"] and "own_util" in gpu[2]["metrics"]
    assert gpu[3]["energy_source"] == "power" and gpu[3]["idle_now"] is not None
    assert len(gpu[0]["timeline"]["points"]) > 100 and len(figures) == 3

