"""The binding review's eleven findings (issue 7), each through the real pynvml over the
stand-in library, which produces the driver behaviour behind it. Each finding has a test
that failed on the code before the fix (its docstring says how); the others guard the
edges of a fix."""

from __future__ import annotations

import os
from typing import Any

import pynvml
import pytest

from tests import standin

GIB = 1024**3
BOOT = 1_700_000_000.0
H100 = {"name": "NVIDIA H100 (sim)", "memory_total_gib": 80, "power_limit_w": 700,
        "idle_power_w": 60, "sample_period_s": 0.5}
GPM_NAMES = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
             "fp32_active", "fp16_active", "pcie_tx_mbps", "pcie_rx_mbps", "nvlink_rx_mbps",
             "nvlink_tx_mbps")
MIG_A = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
MIG_B = "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"


def devices(sim_node: Any, **spec: Any) -> None:
    """Rewrite gpu1's devices: minor 0 is an H100 with `spec` on top."""
    gpu = {"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", **H100, **spec}
    sim_node.write_devices({"gpu1": [gpu]})


def busy(util: float, seconds: float = 1000, **more: Any) -> dict[str, Any]:
    return {"phases": [{"seconds": seconds, "gpus": {"*": {"util": util, **more}}}]}


def test_1_memory_used_leaves_the_drivers_reserved_memory_out(sim_node: Any) -> None:
    """Before: v1's `used` counted 0.5 GiB reserved by the driver on an idle GPU."""
    devices(sim_node, reserved_mem_gib=0.5)
    (gpu,) = sim_node.session().bind([0])
    assert gpu.read().mem_used_bytes == 0.0
    sim_node.write_state(0, busy(50, mem_used_gib=12), started_at=BOOT + 990.0)
    sim_node.now += 1.0
    assert gpu.read().mem_used_bytes == 12 * GIB


def test_1_an_old_driver_without_memory_v2_falls_back_to_v1(sim_node: Any) -> None:
    standin.load(pynvml, standin.library_path("old"))
    devices(sim_node, reserved_mem_gib=0.5)
    sim_node.lib = pynvml.nvmlLib
    sim_node.config.gpu_library = pynvml.nvmlLib._name
    sim_node.now = sim_node.now  # the old library's clock, too
    (gpu,) = sim_node.session().bind([0])
    assert gpu.read().mem_used_bytes == 0.5 * GIB  # v1: all a driver that old can say
    assert "memory_v2" in gpu.unsupported


def test_2_samples_out_of_order_are_sorted_by_their_timestamps(sim_node: Any) -> None:
    """Before: newest-first samples gave negative weights and lost samples."""
    devices(sim_node, quirks=["samples_reversed"])
    profile = {"phases": [{"seconds": 1000.5, "gpus": {"*": {"util": 20}}},
                          {"seconds": 1000, "gpus": {"*": {"util": 80}}}]}
    sim_node.write_state(0, profile, started_at=BOOT)  # 20% until BOOT + 1000.5, then 80%
    (gpu,) = sim_node.session().bind([0])  # BOOT + 1000
    sim_node.now = BOOT + 1002.0
    samples = gpu.read().util_samples
    assert samples == [(20.0, 0.5), (80.0, 0.5), (80.0, 0.5), (80.0, 0.5)]


def test_3_jittered_timestamps_do_not_shrink_the_time_measured(sim_node: Any) -> None:
    """Before: the smallest gap (a jittered one) capped every sample's weight, so 60 s of
    an idle GPU read as about 45 s of idle time."""
    devices(sim_node, quirks=["samples_jitter"], sample_period_s=1 / 6, sample_buffer=1000)
    (gpu,) = sim_node.session().bind([0])
    covered = 0.0
    for _ in range(6):
        sim_node.now += 10.0
        covered += sum(seconds for _, seconds in gpu.read().util_samples or [])
    assert covered == pytest.approx(60.0, abs=0.35)  # a jittered window at each end


def test_3_a_gap_the_buffer_dropped_stays_unmeasured(sim_node: Any) -> None:
    devices(sim_node, sample_buffer=4)  # 2 s of 0.5 s windows
    (gpu,) = sim_node.session().bind([0])
    sim_node.now += 10.0
    samples = gpu.read().util_samples
    assert samples is not None and len(samples) == 4
    assert sum(seconds for _, seconds in samples) == pytest.approx(2.0)  # not 10 s


def shared(sim_node: Any, **spec: Any) -> Any:
    devices(sim_node, **spec)
    sim_node.write_state(0, busy(60, shared_util=30), started_at=BOOT + 990.0, pid=os.getpid())
    (gpu,) = sim_node.session().bind([0])
    sim_node.now += 2.0
    return gpu


def test_4_per_process_values_over_100_are_dropped(sim_node: Any) -> None:
    """Before: a bogus 160% sample beside the true 60% made the job's share 110%."""
    gpu = shared(sim_node, quirks=["process_util_over_100"])
    assert gpu.read(per_process=True).process_sm == {os.getpid(): 60.0, 1: 30.0}


def test_4_per_process_figures_are_the_last_driver_period(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 11.5, "gpus": {"*": {"util": 10}}},
                          {"seconds": 100, "gpus": {"*": {"util": 90}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 990.0, pid=os.getpid())
    (gpu,) = sim_node.session().bind([0])  # 10% until BOOT + 1001.5, then 90%
    sim_node.now = BOOT + 1002.0
    assert gpu.read(per_process=True).process_sm == {os.getpid(): 90.0}  # not a mean since binding


def test_5_success_with_no_samples_means_nothing_new(sim_node: Any) -> None:
    """Before: pynvml's NVMLError(0) made per-process utilisation 'not measured' (None)."""
    devices(sim_node, quirks=["empty_success"])
    (gpu,) = sim_node.session().bind([0])  # no workload: no process busy
    first = gpu.read(per_process=True)  # at once: the driver has nothing newer
    assert first.util_samples == [] and first.util == 0.0
    sim_node.now += 2.0  # past the driver's period: no sample now means no process busy
    reading = gpu.read(per_process=True)
    assert reading.process_sm == {}
    assert reading.util_samples and {value for value, _ in reading.util_samples} == {0.0}
    assert gpu.errors == []


def test_6_a_library_without_the_v3_symbol_is_asked_once(sim_node: Any) -> None:
    """Before: NVMLLibraryMismatchError was logged on every poll and never remembered."""
    standin.load(pynvml, standin.library_path("old"))
    sim_node.lib = pynvml.nvmlLib
    sim_node.config.gpu_library = pynvml.nvmlLib._name
    sim_node.now = sim_node.now
    sim_node.write_state(0, busy(70, temp_c=55, throttle=["power_cap"]), started_at=BOOT + 990.0)
    (gpu,) = sim_node.session().bind([0])
    for _ in range(3):
        sim_node.now += 1.0
        reading = gpu.read()
    assert reading.pids is None and "nvmlDeviceGetComputeRunningProcesses" in gpu.unsupported
    assert gpu.errors == []
    assert reading.temp_c == 55.0  # the deprecated call stands in for nvmlDeviceGetTemperatureV
    assert reading.throttle_mask == pynvml.nvmlClocksThrottleReasonSwPowerCap  # the old name
    assert gpu.gpm is None and reading.gpm is None  # no GPM in a driver that old


def test_7_gpm_buffers_are_freed_when_the_first_sample_fails(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: both GPM sample buffers leaked when the first nvmlGpmSampleGet failed."""
    devices(sim_node, unsupported=["nvmlGpmSampleGet"])  # GPM "supported", sampling not
    freed: list[Any] = []
    real_free = pynvml.nvmlGpmSampleFree

    def free(sample: Any) -> None:
        freed.append(sample)
        real_free(sample)

    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", free)
    (gpu,) = sim_node.session().bind([0])
    assert gpu.gpm is None
    assert len(freed) == 2


def test_8_two_mig_slices_of_one_board_see_each_xid_once(sim_node: Any) -> None:
    """Before: the board was registered once per slice, and each XID came twice."""
    devices(sim_node, mig=[{"gi_id": 1, "uuid": MIG_A}, {"gi_id": 2, "uuid": MIG_B}])
    profile = {"phases": [{"seconds": 5, "gpus": {"*": {"util": 50}}},
                          {"seconds": 100, "gpus": {"*": {"xid": [79]}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 998.0)  # XID 79 at BOOT + 1003
    session = sim_node.session()
    session.bind([MIG_A, MIG_B])
    sim_node.now = BOOT + 1010.0
    events = session.xid_events()
    assert [(code, gi) for _, code, gi in events] == [(79, 0xFFFFFFFF)]


def test_9_temperature_is_read_without_the_deprecated_call(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: only nvmlDeviceGetTemperature, which pynvml 14 no longer has."""
    monkeypatch.delattr(pynvml, "nvmlDeviceGetTemperature")
    sim_node.write_state(0, busy(70, temp_c=64), started_at=BOOT + 990.0)
    (gpu,) = sim_node.session().bind([0])
    sim_node.now += 1.0
    assert gpu.read().temp_c == 64.0


def test_10_gpm_samples_exactly_100_ms_apart_wait_for_the_next_poll(sim_node: Any) -> None:
    """Before: exactly 100 ms passed the check, NVML refused the pair, GPM was lost.
    (Times near 0, where 0.2 - 0.1 is exactly 0.1 in floating point.)"""
    sim_node.now = 0.1
    (gpu,) = sim_node.session().bind([0])
    sim_node.now = 0.2
    assert gpu.read().gpm == {}
    sim_node.now = 0.5
    assert gpu.read().gpm == pytest.approx({name: 0.0 for name in GPM_NAMES})
    assert gpu.errors == []


def test_10_a_gpm_read_that_fails_leaves_the_next_covering_the_time_since_the_pair_began(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPM's means cover the time since the first sample of their pair: a read that fails
    keeps that sample, and the next read counts for all of it."""
    sim_node.now = 100.0
    (gpu,) = sim_node.session().bind([0])
    sim_node.now = 101.0
    assert gpu.read().gpm_s == pytest.approx(1.0)
    real = pynvml.nvmlGpmMetricsGet

    def fails_once(request: Any) -> Any:
        monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", real)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", fails_once)
    sim_node.now = 102.0
    failed = gpu.read()
    assert (failed.gpm, failed.gpm_s) == (None, 0.0) and gpu.errors == ["GPM: Unknown Error"]
    sim_node.now = 103.0
    recovered = gpu.read()
    assert recovered.gpm and recovered.gpm_s == pytest.approx(2.0)


def test_11_boot_clock_timestamps_keep_samples_and_per_process_figures(sim_node: Any) -> None:
    """Before: per-process utilisation asked with an epoch timestamp that a boot-clock
    driver reads as far in the future, so a shared GPU never showed the job's share."""
    devices(sim_node, quirks=["boot_clock"])
    sim_node.write_state(0, busy(60, shared_util=30), started_at=BOOT + 990.0, pid=os.getpid())
    (gpu,) = sim_node.session().bind([0])
    sim_node.now += 1.0
    first = gpu.read(per_process=True)
    # the driver's newest sample at binding tells its history apart, whatever its clock
    assert first.util_samples == [(90.0, 0.5), (90.0, 0.5)]
    assert first.process_sm == {os.getpid(): 60.0, 1: 30.0}
    sim_node.now += 1.0
    second = gpu.read(per_process=True)
    assert second.util_samples == [(90.0, 0.5), (90.0, 0.5)]
    assert second.process_sm == {os.getpid(): 60.0, 1: 30.0}


def test_4_polling_faster_than_the_driver_does_not_read_as_idle(sim_node: Any) -> None:
    """Per-process samples come once per driver period: a poll in between learns nothing
    (None, not counted) rather than "no process busy" (which would drag the job's share
    towards 0 at short intervals)."""
    devices(sim_node)  # 0.5 s driver period
    sim_node.write_state(0, busy(60, shared_util=30), started_at=BOOT + 990.0, pid=os.getpid())
    (gpu,) = sim_node.session().bind([0])
    seen = []
    for _ in range(30):  # every 0.1 s for 3 s
        sim_node.now += 0.1
        seen.append(gpu.read(per_process=True).process_sm)
    measured = [s for s in seen if s is not None]
    assert len(measured) >= 5
    assert all(s == {os.getpid(): 60.0, 1: 30.0} for s in measured), measured
