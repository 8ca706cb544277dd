"""node/gpu.py through the real pynvml over the stand-in library: binding by minor number,
None for unsupported, GpuLost."""

from __future__ import annotations

import sys
from typing import Any

import pynvml
import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.errors import BindingError, GpuAccessError, GpuLost
from slurm_gpu_eff.node.gpu import GpuSession, load_nvml

from .conftest import SIM_DEVICES

GIB = 1024**3
BOOT = 1_700_000_000.0
UUID = {m: f"GPU-{str(m) * 8}-{str(m) * 4}-{str(m) * 4}-{str(m) * 4}-{str(m) * 12}"
        for m in range(4)}


def test_load_nvml_points_pynvml_at_the_configured_library(sim_node: Any) -> None:
    assert load_nvml(sim_node.config) is pynvml
    assert pynvml.nvmlLib._name == sim_node.config.gpu_library


def test_a_library_that_is_not_there_is_a_clear_error(sim_node: Any, tmp_path: Any) -> None:
    config = Config(gpu_library=str(tmp_path / "absent" / "libnvidia-ml.so.1"))
    with pytest.raises(GpuAccessError, match=r"cannot load the NVML library .*absent/libnvidia-ml.so.1"):
        load_nvml(config)


def test_load_nvml_without_pynvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(GpuAccessError, match=r"pynvml is not installed \(pip install nvidia-ml-py\)"):
        load_nvml(Config())


def test_bind_resolves_minor_numbers_and_keeps_their_order(sim_node: Any) -> None:
    # NVML enumerates minors 1, 2, 0, 3: NVML index 2 is minor 0, NVML index 0 is minor 1
    gpus = sim_node.session().bind([2, 0])
    assert [g.minor for g in gpus] == [2, 0]
    assert [g.index for g in gpus] == [2, 0]
    assert [g.uuid for g in gpus] == [UUID[2], UUID[0]]


def test_bound_gpu_knows_its_name_memory_and_power_limit(sim_node: Any) -> None:
    (a100,) = sim_node.session().bind([3])
    assert a100.name == "NVIDIA A100 (sim)"
    assert a100.memory_total_bytes == 40 * GIB
    assert a100.power_limit_w == 400.0


def test_binding_a_minor_that_does_not_exist_fails(sim_node: Any) -> None:
    with pytest.raises(BindingError, match=r"no GPU with minor number 7 \(Slurm index 7\) here"):
        sim_node.session().bind([0, 7])


def test_a_uuid_binds_to_its_device(sim_node: Any) -> None:
    (gpu,) = sim_node.session().bind([UUID[2]])
    assert (gpu.minor, gpu.index, gpu.uuid) == (2, 2, UUID[2])


def test_an_unknown_uuid_fails(sim_node: Any) -> None:
    with pytest.raises(BindingError, match="with UUID GPU-deadbeef on this node"):
        sim_node.session().bind(["GPU-deadbeef"])


def test_a_missing_devices_file_is_a_gpu_access_error(sim_node: Any) -> None:
    sim_node.devices_file.rename(sim_node.devices_file.with_suffix(".gone"))  # no "driver"
    with pytest.raises(GpuAccessError, match="NVML cannot start: Driver Not Loaded"):
        GpuSession(sim_node.config)


def test_read_returns_what_the_workload_does(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {
        "util": 75, "mem_util": 40, "mem_used_gib": 12, "power_w": 420}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 950.0)
    (gpu,) = sim_node.session().bind([0])  # at BOOT + 1000
    sim_node.now = BOOT + 1001.0  # two 0.5 s driver windows later
    reading = gpu.read()
    assert reading.time == BOOT + 1001.0
    assert (reading.util, reading.mem_util) == (75.0, 40.0)
    assert reading.util_samples == [(75.0, 0.5), (75.0, 0.5)]  # every driver window
    assert reading.mem_util_samples == [(40.0, 0.5), (40.0, 0.5)]
    assert reading.mem_used_bytes == 12.0 * GIB
    assert reading.power_w == 420.0
    # 1001 s of 60 W idle, then 51 s at 420 W: 60060 + 51 * 360 J, in mJ
    assert reading.energy_mj == 78_420_000
    assert (reading.temp_c, reading.sm_clock_mhz) == (32.0, 345.0)  # idle: not in the profile
    assert reading.processes == 1


def test_no_new_driver_window_falls_back_to_the_rate(sim_node: Any) -> None:
    """Some drivers stop filling the sample buffer while a GPU idles: the latest rate then
    stands for the poll, so an idle GPU reads 0%, not "not measured"."""
    (gpu,) = sim_node.session().bind([0])
    reading = gpu.read()  # the same instant as the bind: no window has closed since
    assert (reading.util, reading.util_samples) == (0.0, [])
    assert reading.power_w == 60.0


def test_unsupported_metric_reads_none_not_zero(sim_node: Any) -> None:
    (a100,) = sim_node.session().bind([3])  # its spec: energy counter unsupported
    sim_node.now += 1.0
    reading = a100.read()
    assert reading.energy_mj is None
    assert (reading.util, reading.power_w) == (0.0, 50.0)  # idle, but measured
    assert a100.unsupported == {"nvmlDeviceGetTotalEnergyConsumption"}
    assert a100.errors == []


def not_supported(calls: list[str], name: str) -> Any:
    def function(*args: Any) -> Any:
        calls.append(name)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    return function


def test_a_read_without_the_energy_counter_makes_no_counter_call(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampler's polls between summaries leave the counter out (a third of a poll's CPU
    on a Hopper GPU); the rest of the plan, a fallback that took a read's place included,
    is read as in a whole poll."""
    (gpu,) = sim_node.session().bind([0])
    calls: list[str] = []
    real = pynvml.nvmlDeviceGetTotalEnergyConsumption
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption",
                        lambda handle: calls.append("energy") or real(handle))
    sim_node.now += 1.0
    light = gpu.read(energy_counter=False)
    assert (light.energy_mj, light.power_w, light.temp_c, calls) == (None, 60.0, 32.0, [])
    tried: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperatureV", not_supported(tried, "temperature_v"))
    sim_node.now += 1.0
    assert gpu.read(energy_counter=False).temp_c == 32.0  # nvmlDeviceGetTemperature instead
    whole = gpu.read()
    assert whole.energy_mj is not None and whole.temp_c == 32.0 and calls == ["energy"]
    assert gpu.read(energy_counter=False).temp_c == 32.0
    assert (tried, calls) == (["temperature_v"], ["energy"])


def memory_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call for the memory-utilisation samples, by the GPU's minor number."""
    made: list[int] = []
    real = pynvml.nvmlDeviceGetSamples

    def counted(handle: Any, kind: int, since: int) -> Any:
        if kind == pynvml.NVML_MEMORY_UTILIZATION_SAMPLES:
            made.append(pynvml.nvmlDeviceGetMinorNumber(handle))
        return real(handle, kind, since)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", counted)
    return made


def test_memory_samples_left_in_the_buffer_are_all_read_later(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between summaries the sampler leaves the memory samples in the driver's buffer
    (Sampler: every MEM_SAMPLES_EVERY_S): a poll that had new GPU samples makes no call for
    them and stands for no memory figure; the next read takes every window since the last,
    each for its own length: the same samples a read every poll gets."""
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80, "mem_util": 40}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    sim_node.write_state(1, profile, started_at=BOOT + 995.0)
    skipping, every = sim_node.session().bind([0, 1])  # both 0.5 s windows
    reads = memory_reads(monkeypatch)
    left, each = [], []
    for poll in range(8):
        sim_node.now += 1.0
        last = poll == 7
        light = skipping.read(mem_samples=last)
        if not last:
            assert light.util == 80.0 and light.util_samples
            assert light.mem_util is None and light.mem_util_samples is None
        left += light.mem_util_samples or []
        each += every.read().mem_util_samples or []
    assert reads.count(0) == 1 and reads.count(1) == 8
    assert len(left) == len(each) == 16 and left == each
    assert sum(w for _, w in left) == pytest.approx(8.0) and {v for v, _ in left} == {40.0}


def test_a_poll_without_new_gpu_samples_reads_the_memory_ones(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no GPU sample came (a poll faster than the driver's period, or a driver that
    stops filling its buffer while the GPU idles) the rate stands in for the GPU figure;
    the memory samples waiting since the last read are read then, so that no rate stands
    for time a sample will cover."""
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80, "mem_util": 40}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    (gpu,) = sim_node.session().bind([0])
    reads = memory_reads(monkeypatch)
    sim_node.now += 3.0
    assert gpu.read(mem_samples=False).mem_util_samples is None and reads == []
    sim_node.now += 0.1  # within the same 0.5 s window: no GPU sample is new
    reading = gpu.read(mem_samples=False)
    assert reading.util_samples == [] and reading.util == 80.0  # the rate
    assert reads == [0] and reading.mem_util_samples and len(reading.mem_util_samples) == 6
    assert reading.mem_util == 40.0


def test_a_buffer_shorter_than_the_cadence_is_read_every_poll(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver that keeps fewer samples than the cadence's worth drops the oldest: the read
    that finds the gap (its oldest sample more than two periods after the last one read)
    makes the GPU's memory samples a read of every poll from then on, whatever the sampler
    asks; a GPU whose buffer keeps up stays on the cadence."""
    # minor 0 keeps four samples of each kind (2 s of its 0.5 s windows), the rest 120
    table = [{**spec, "sample_buffer": 4} if spec["minor"] == 0 else spec for spec in SIM_DEVICES]
    sim_node.write_devices({"gpu1": table})
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 80, "mem_util": 40}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    sim_node.write_state(1, profile, started_at=BOOT + 995.0)
    short, long = sim_node.session().bind([0, 1])
    reads = memory_reads(monkeypatch)
    for _ in range(5):  # 5 s: ten 0.5 s windows, of which the short buffer keeps four
        sim_node.now += 1.0
        short.read(mem_samples=False)
        long.read(mem_samples=False)
    assert not short.mem_samples.every_poll and reads == []
    sim_node.now += 1.0
    dropped = short.read().mem_util_samples
    assert dropped is not None and len(dropped) == 4 and short.mem_samples.every_poll
    assert len(long.read().mem_util_samples or []) == 12 and not long.mem_samples.every_poll
    reads.clear()
    for _ in range(3):
        sim_node.now += 1.0
        assert len(short.read(mem_samples=False).mem_util_samples or []) == 2  # every poll now
        assert long.read(mem_samples=False).mem_util_samples is None
    assert reads == [0, 0, 0]


def driver_fills_nothing(monkeypatch: pytest.MonkeyPatch, when: Any) -> None:
    """A driver that keeps no sample of either kind for windows ending `when(seconds)`: one
    that stops filling its buffer while the GPU idles, or has none yet at binding."""
    real = pynvml.nvmlDeviceGetSamples

    def filtered(handle: Any, kind: int, since: int) -> Any:
        value_type, found = real(handle, kind, since)
        kept = [sample for sample in found if not when(sample.timeStamp / 1e6)]
        if not kept:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return value_type, kept

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", filtered)


@pytest.mark.parametrize(("when", "first_poll_s"), [
    (lambda t: BOOT + 1003.2 <= t < BOOT + 1006.2, 0.0),  # 3 s unfilled while idle
    (lambda t: t <= BOOT + 1000.0, 1.5),  # nothing in the buffer at binding
])
def test_a_pause_in_the_driver_s_samples_is_no_drop(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch, when: Any, first_poll_s: float,
) -> None:
    """A gap in the memory samples that the GPU samples show too (read every poll, they
    paused over the same stretch) is the driver's, not a buffer too short for the cadence:
    the memory samples stay on it. (Found in review: both cases turned every-poll reads on.)"""
    profile = {"phases": [{"seconds": 1000, "gpus": {"*": {"util": 80, "mem_util": 40}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 995.0)
    driver_fills_nothing(monkeypatch, when)
    (gpu,) = sim_node.session().bind([0])
    sim_node.now += first_poll_s
    for poll in range(12):
        sim_node.now += 1.0
        gpu.read(mem_samples=poll % 5 == 0)
    assert not gpu.mem_samples.every_poll


def test_utilisation_falls_back_to_rates_without_driver_samples(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 35, "mem_util": 15}}}]}
    sim_node.write_state(0, profile, started_at=BOOT + 950.0)
    (gpu,) = sim_node.session().bind([0])
    calls: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", not_supported(calls, "samples"))
    sim_node.now += 1.0
    reading = gpu.read()
    assert (reading.util, reading.mem_util) == (35.0, 15.0)
    assert (reading.util_samples, reading.mem_util_samples) == (None, None)
    assert "nvmlDeviceGetSamples" in gpu.unsupported


def test_unsupported_utilisation_reads_none_and_is_not_asked_again(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (gpu,) = sim_node.session().bind([0])
    calls: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", not_supported(calls, "samples"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", not_supported(calls, "rates"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", not_supported(calls, "power"))
    first, second = gpu.read(), gpu.read()
    for reading in (first, second):
        assert (reading.util, reading.mem_util, reading.power_w) == (None, None, None)
        assert reading.mem_used_bytes == 0.0  # measured: zero is a value
    assert calls.count("rates") == 1 and calls.count("power") == 1
    assert calls.count("samples") == 1


def test_a_function_missing_from_the_library_reads_none(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (gpu,) = sim_node.session().bind([0])
    monkeypatch.delattr(pynvml, "nvmlDeviceGetPowerUsage")  # an old pynvml without it
    assert gpu.read().power_w is None


def test_a_passing_error_costs_one_reading_not_the_metric(
    sim_node: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (gpu,) = sim_node.session().bind([0])
    real = pynvml.nvmlDeviceGetPowerUsage

    def flaky(handle: Any) -> int:
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", real)
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", flaky)
    sim_node.now += 1.0
    assert gpu.read().power_w is None
    assert gpu.errors == ["nvmlDeviceGetPowerUsage: Unknown Error"]
    sim_node.now += 1.0
    assert gpu.read().power_w == 60.0  # tried again, and it works
    assert gpu.errors == ["nvmlDeviceGetPowerUsage: Unknown Error"]
    assert "nvmlDeviceGetPowerUsage" not in gpu.unsupported


def test_gpu_is_lost_raises_model_gpulost(sim_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (gpu,) = sim_node.session().bind([2])

    def lost(handle: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lost)
    with pytest.raises(GpuLost) as raised:
        gpu.read()
    assert str(raised.value) == f"GPU minor 2 ({UUID[2]}) is lost"
    assert isinstance(raised.value.__cause__, pynvml.NVMLError_GpuIsLost)


def test_a_gpu_lost_in_the_workload_raises_gpulost(sim_node: Any) -> None:
    profile = {"phases": [{"seconds": 5, "gpus": {"*": {"util": 90}}},
                          {"seconds": 60, "gpus": {"*": {"lost": True}}}]}
    sim_node.write_state(2, profile, started_at=BOOT + 998.0)
    (gpu,) = sim_node.session().bind([2])  # BOOT + 1000: still there
    sim_node.now = BOOT + 1002.0
    assert gpu.read().util == 90.0
    sim_node.now = BOOT + 1004.0  # it fell off the bus at BOOT + 1003
    with pytest.raises(GpuLost, match="GPU minor 2"):
        gpu.read()


def test_close_shuts_nvml_down_and_tolerates_a_second_close(sim_node: Any) -> None:
    gpus_session = sim_node.session()
    gpus_session.close()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    gpus_session.close()  # NVMLError_Uninitialized is swallowed
