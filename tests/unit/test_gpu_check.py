"""scripts/gpu_check.py (`make gpu-check`) without a GPU: its pure parts (nvidia-smi
parsing, interval means, verdicts, the table), its process plumbing (the sampler's boot
line, the nvidia-smi reader, reaping), and that it exits 2 with one clear line when there
is no PyTorch, CUDA or GPU to check with. The run itself needs a real GPU."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from slurm_gpu_eff import model
from slurm_gpu_eff.config import load_config
from tests import standin

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
GIB, MIB = 2**30, 2**20


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gc = load_script()


# --- nvidia-smi lines ------------------------------------------------------------------------


def test_a_reading_is_parsed_with_the_time_it_arrived() -> None:
    row = gc.parse_smi_line("0, 45, 1234, 250.12", 100.5)
    assert row == gc.SmiRow(time=100.5, index=0, util=45.0, mem_mib=1234.0, power_w=250.12)


@pytest.mark.parametrize("line, util, mem, power", [
    ("0, [N/A], 81559, [N/A]", None, 81559.0, None),
    ("1, 0, [Not Supported], 71.30", 0.0, None, 71.3),
    ("0, [Unknown Error], 10, [Not Supported]", None, 10.0, None),
    ("0, 100, 0, 699.98\r", 100.0, 0.0, 699.98),  # a terminal's line end
    ("0, nan, 5, 70", None, 5.0, 70.0),
])
def test_fields_the_driver_cannot_give_are_none_not_zero(
    line: str, util: float | None, mem: float | None, power: float | None,
) -> None:
    row = gc.parse_smi_line(line, 0.0)
    assert row is not None
    assert (row.util, row.mem_mib, row.power_w) == (util, mem, power)


@pytest.mark.parametrize("line", [
    "", "   ", "No devices were found",
    "Failed to initialize NVML: Driver/library version mismatch",
    "NVML library version: 550.54",
    "0, 45, 1234",  # too few fields
    "0, 45, 1234, 250, 3",  # too many
    "index, utilization.gpu [%], memory.used [MiB], power.draw [W]",  # a header
])
def test_lines_that_are_not_readings_are_skipped(line: str) -> None:
    assert gc.parse_smi_line(line, 0.0) is None


def test_real_looking_output_keeps_only_the_readings() -> None:
    output = [
        (10.0, "0, 0, 519, 70.84"),
        (10.1, "0, 100, 8711, [N/A]"),
        (10.2, "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"),
        (10.3, "0, 98, 8711, 689.50"),
    ]
    rows = gc.parse_smi_lines(output)
    assert [r.time for r in rows] == [10.0, 10.1, 10.3]
    assert [r.power_w for r in rows] == [70.84, None, 689.5]


# --- means over an interval --------------------------------------------------------------------


def rows_at(values: Sequence[float | None], start: float = 0.0) -> list[Any]:
    return [gc.SmiRow(start + i, 0, v, None if v is None else 10 * v, v) for i, v in enumerate(values)]


def test_interval_mean_takes_the_readings_inside_both_ends_included() -> None:
    rows = rows_at([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert gc.interval_mean(rows, "util", 2.0, 5.0) == 3.5
    assert gc.interval_mean(rows, "util", 1.5, 5.5) == 3.5
    assert gc.interval_max(rows, "mem_mib", 2.0, 5.0) == 50.0


def test_interval_mean_skips_missing_readings_and_has_none_when_empty() -> None:
    rows = rows_at([10, None, 30, None])
    assert gc.interval_mean(rows, "util", 0.0, 3.0) == 20.0
    assert gc.interval_mean(rows, "util", 1.0, 1.0) is None
    assert gc.interval_mean(rows, "util", 50.0, 60.0) is None
    assert gc.interval_max(rows, "power_w", 50.0, 60.0) is None


# --- a phase's figures from the sampler's summary ---------------------------------------------------


def summary(util: float = 97.0, mem: float = 1.5 * GIB, power: float = 650.0, energy: float | None = 9750.0,
            samples: int = 76, start: float = 1000.0, end: float = 1015.0) -> dict[str, Any]:
    """A node summary shaped by the package's own model, as the sampler writes it."""
    def stat(mean: float, top: float) -> dict[str, Any]:
        return {"mean": mean, "min": 0.0, "max": top, "last": mean, "samples": samples,
                "seconds": end - start}

    gpu = model.GpuSummary(
        node="gpucheck", index=3, minor=3, uuid="GPU-x", name="NVIDIA H100", memory_total_bytes=80 * GIB,
        power_limit_w=700.0, samples=samples, sampled_s=end - start,
        metrics={"util": stat(util, 100.0), "mem_used_bytes": stat(mem * 0.9, mem),
                 "power_w": stat(power, 700.0)},
        energy_j=energy, energy_source="counter",
    )
    node = model.NodeSummary(cluster="gpucheck", job_id="900002", node="gpucheck", status=model.COMPLETE,
                             sampled_from=start, sampled_until=end, gpus=[gpu])
    return node.to_dict()


def test_phase_result_reads_the_summary_and_averages_nvidia_smi_over_the_samplers_window() -> None:
    smi = rows_at([0.0] * 5 + [90.0] * 16 + [0.0] * 5, start=995.0)  # 995..1020; 1000..1015 at 90
    played = gc.Played(wall_s=14.8, busy_s=14.7, allocated_bytes=384 * MIB, reserved_bytes=400 * MIB)
    result = gc.phase_result("busy", played, summary(), 9800.0, smi, cpu_s=0.3)
    assert result.util == 97.0 and result.mem_max_bytes == 1.5 * GIB
    assert result.power_w == 650.0 and result.energy_j == 9750.0
    assert result.status == "complete" and result.samples == 76
    assert result.busy_fraction == pytest.approx(14.7 / 14.8)
    assert result.smi_rows == 16 and result.smi_util == 90.0
    assert result.smi_mem_max_bytes == 900.0 * MIB
    assert result.counter_energy_j == 9800.0 and result.torch_reserved_bytes == 400 * MIB


def test_phase_result_without_a_summary_or_nvidia_smi_says_so() -> None:
    result = gc.phase_result("idle", None, None, None, None)
    assert result.status == "none" and result.util is None and result.smi_rows is None
    missing = model.NodeSummary(cluster="c", job_id="1", node="n", status=model.MISSING,
                                reason="NVML cannot start").to_dict()
    result = gc.phase_result("idle", None, missing, None, [])
    assert (result.status, result.reason) == ("missing", "NVML cannot start")
    assert result.samples == 0 and result.util is None
    assert result.smi_rows == 0


# --- verdicts ------------------------------------------------------------------------------------


def result(name: str = "busy", **figures: Any) -> Any:
    values: dict[str, Any] = dict(
        wall_s=15.0, busy_fraction=0.99, torch_reserved_bytes=400 * MIB, status="complete", samples=76,
        util=98.0, smi_util=98.0, mem_max_bytes=900 * MIB, smi_mem_max_bytes=900 * MIB, power_w=650.0,
        smi_power_w=650.0, energy_j=9750.0, counter_energy_j=9750.0, smi_rows=150,
    )
    values.update(figures)
    return gc.PhaseResult(name, **values)


def checks_of(res: Any, baseline: float | None = 500 * MIB) -> dict[str, bool | None]:
    return {c.name: c.ok for c in gc.phase_checks(res, baseline)}


def test_a_phase_that_agrees_everywhere_is_ok() -> None:
    res = result()
    assert set(checks_of(res).values()) == {True}
    assert gc.verdict(gc.phase_checks(res, 500 * MIB)) == "ok"


@pytest.mark.parametrize("figures, name, ok", [
    ({"smi_util": 96.0}, "util/smi", True),  # 2 points: on the line
    ({"smi_util": 95.9}, "util/smi", False),
    ({"busy_fraction": 1.0}, "util/events", True),
    ({"busy_fraction": 0.959}, "util/events", False),
    ({"mem_max_bytes": 909 * MIB}, "memory", True),  # 1% of the expected 900 MiB
    ({"mem_max_bytes": 909.1 * MIB}, "memory", False),
    ({"mem_max_bytes": 890.9 * MIB}, "memory", False),
    ({"energy_j": 9750.0 * 1.02}, "energy", True),
    ({"energy_j": 9750.0 * 0.979}, "energy", False),
    ({"power_w": 650.0 + 32.5}, "power/smi", True),  # 5% of 650 W
    ({"power_w": 650.0 + 33.0}, "power/smi", False),
    ({"power_w": 65.0, "smi_power_w": 60.0}, "power/smi", True),  # 5 W floor at low power
    ({"power_w": 65.5, "smi_power_w": 60.0}, "power/smi", False),
    ({"status": "partial"}, "sampler", False),
    ({"samples": 1}, "sampler", False),
])
def test_verdict_thresholds(figures: dict[str, Any], name: str, ok: bool) -> None:
    res = result(**figures)
    assert checks_of(res)[name] is ok
    assert (gc.verdict(gc.phase_checks(res, 500 * MIB)) == "ok") is ok
    if not ok:
        assert name in gc.verdict(gc.phase_checks(res, 500 * MIB))


def test_a_missing_figure_is_not_checked_rather_than_failed() -> None:
    res = result(smi_util=None, smi_power_w=None, counter_energy_j=None, busy_fraction=None)
    found = checks_of(res, baseline=None)
    assert found["util/smi"] is None and found["power/smi"] is None and found["energy"] is None
    assert found["util/events"] is None and found["memory"] is None
    assert gc.verdict(gc.phase_checks(res, None)) == "ok"


def test_the_idle_phase_sets_the_memory_baseline_and_is_not_checked_against_it() -> None:
    idle = result("idle", torch_reserved_bytes=20 * MIB, mem_max_bytes=520 * MIB, util=0.0, smi_util=0.0,
                  busy_fraction=0.0)
    memory = result("memory", torch_reserved_bytes=8 * GIB + 20 * MIB, mem_max_bytes=8 * GIB + 530 * MIB)
    assert gc.context_baseline([memory, idle]) == 500 * MIB
    assert gc.expected_memory(memory, 500 * MIB) == 8 * GIB + 520 * MIB
    assert "memory" not in checks_of(idle)
    assert checks_of(memory)["memory"] is True
    assert gc.context_baseline([memory]) is None


def test_cpu_per_sample_takes_the_start_up_out() -> None:
    per = gc.cpu_per_sample(run_cpu_s=0.5, run_samples=1100, idle_cpu_s=0.2, idle_samples=100)
    assert per == pytest.approx(0.0003)
    assert gc.cpu_per_sample(0.5, 2, 0.2, 2) is None
    assert gc.cpu_check(gc.CpuFigure(0.0003, 0.00025, 1100, 11)).ok is True
    assert gc.cpu_check(gc.CpuFigure(0.0003, 0.00019, 1100, 11)).ok is False  # 1.58x
    # On a real H100 the driver's calls cost ~13 ms a poll: only the ratio is judged
    assert gc.cpu_check(gc.CpuFigure(0.0132 * 1.19, 0.0132, 1100, 11)).ok is True
    assert gc.cpu_check(gc.CpuFigure(0.0132 * 1.21, 0.0132, 1100, 11)).ok is False
    assert gc.cpu_check(gc.CpuFigure(None, 0.0002, 0, 11)).ok is None


# --- the table -------------------------------------------------------------------------------------


def four_phases() -> list[Any]:
    return [
        result("idle", wall_s=10.0, busy_fraction=0.0, util=0.0, smi_util=0.0,
               torch_reserved_bytes=20 * MIB, mem_max_bytes=532 * MIB, smi_mem_max_bytes=532 * MIB,
               power_w=71.2, smi_power_w=70.9,
               energy_j=712.0, counter_energy_j=709.0),
        result("busy", wall_s=15.2, busy_fraction=0.999, util=98.9, smi_util=99.4,
               torch_reserved_bytes=388 * MIB),
        result("square", wall_s=20.0, busy_fraction=0.301, util=37.5, smi_util=30.2,  # util off
               torch_reserved_bytes=388 * MIB),
        result("memory", wall_s=10.0, busy_fraction=0.0003, util=0.0, smi_util=None, smi_power_w=None,
               torch_reserved_bytes=8 * GIB + 20 * MIB, mem_max_bytes=8 * GIB + 532 * MIB,
               smi_mem_max_bytes=8 * GIB + 533 * MIB),
    ]


def test_the_table_has_one_aligned_row_per_phase_with_its_verdict() -> None:
    cpu = gc.CpuFigure(0.00031, 0.00028, 250, 11)
    table = gc.format_table(four_phases(), cpu, ["nvidia-smi not found: its columns are empty"])
    lines = table.splitlines()
    header = lines[1]
    assert header.split() == ["phase", "secs", "sampler", "smi", "events", "sampler", "smi", "torch+ctx",
                              "sampler", "counter", "sampler", "smi", "verdict"]
    rows = lines[2:6]
    assert [r.split()[0] for r in rows] == ["idle", "busy", "square", "memory"]
    # Every figure ends under its heading: the columns line up.
    ends = [i + 1 for i, c in enumerate(header)
            if c != " " and (i + 1 == len(header) or header[i + 1] == " ")]
    for row in rows:
        for end in ends[1:-1]:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (row, end)
        assert row.index(row.split()[-1] if row.endswith("ok") else "OFF") == header.index("verdict")
    assert rows[0].split()[1:13] == ["10.0", "0.0", "0.0", "0.0", "0.52", "0.52", "0.52", "712", "709",
                                     "71.2", "70.9", "ok"]
    assert rows[1].endswith("  ok")
    assert rows[2].endswith("OFF: util/smi, util/events")
    assert rows[3].split()[1:5] == ["10.0", "0.0", "-", "0.0"]  # no nvidia-smi figure: a dash
    assert rows[3].split()[7] == "8.52"  # 8 GiB + 20 MiB reserved + the 512 MiB baseline
    assert "  square util/smi: 7.3 points apart (limit 2.0)" in lines
    assert "torch+ctx = PyTorch's reserved peak + the context's 512 MiB" in table
    assert "sampler CPU per GPU-sample: 0.310 ms = 1.11x its bare NVML calls (0.280 ms)" in table
    assert lines[-1] == "note: nvidia-smi not found: its columns are empty"


def test_the_json_report_carries_each_phase_its_checks_and_the_cpu_figure() -> None:
    report = gc.report_json(four_phases(), gc.CpuFigure(0.0005, 0.0001, 250, 11), [], {"index": 0})
    assert [p["name"] for p in report["phases"]] == ["idle", "busy", "square", "memory"]
    assert report["context_baseline_bytes"] == 512 * MIB
    assert report["phases"][2]["verdict"] == "OFF: util/smi, util/events"
    assert report["cpu"]["check"]["ok"] is False


# --- the site and the sampler's process ------------------------------------------------------------


def test_the_site_config_is_one_the_package_reads_and_the_job_is_the_gpus_minor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_JOB_ACCOUNT", "from-an-outer-job")
    env = gc.write_site(tmp_path, "/usr/bin/python3", 0.2, minor=3)
    config = load_config(env["GPUEFF_CONFIG"])
    assert config.interval_s == 0.2 and config.live_s == 3600 and config.gpu_library == ""
    assert config.spool_for("gpucheck") == f"{tmp_path}/spool/gpucheck"
    assert config.store_path.startswith(str(tmp_path)) and config.log_file.startswith(str(tmp_path))
    assert config.python == "/usr/bin/python3"
    assert env["SLURM_JOB_GPUS"] == "3" and env["SLURMD_NODENAME"] == "gpucheck"
    assert "SLURM_JOB_ACCOUNT" not in env and "SLURM_JOB_ID" not in env


def test_the_boot_line_runs_the_sampler_module_from_the_repository_in_isolation(tmp_path: Path) -> None:
    # -S: no site-packages, so not the editable install: only the boot line's path finds it.
    # Two arguments make the sampler's main answer with its usage, proving what it got.
    command = gc.sampler_command([sys.executable, "-I", "-S"], tmp_path / "job") + ["extra"]
    done = subprocess.run(command, capture_output=True, text=True, cwd="/", timeout=60,
                          env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 2, done.stderr
    assert "usage: python -m slurm_gpu_eff.node.sampler JOB_DIR" in done.stderr


def test_the_samplers_interpreter_is_checked_before_any_phase() -> None:
    assert gc.sampler_python(sys.executable) == [sys.executable, "-I"]  # the venv has pynvml
    with pytest.raises(gc.Unavailable, match="cannot run"):
        gc.sampler_python("/nonexistent/python3")


def test_a_sampler_that_ignores_sigterm_is_killed_and_reaped_with_its_cpu(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (f"import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(30)")
    child = gc.SamplerProcess([sys.executable, "-c", code], dict(os.environ), tmp_path / "stderr")
    assert child.wait_for(ready, 30)
    cpu = child.stop(wait_s=0.5)
    assert cpu is not None and cpu >= 0 and child.popen.returncode == -signal.SIGKILL
    with pytest.raises(ChildProcessError):
        os.waitpid(child.popen.pid, os.WNOHANG)  # reaped: nothing left to wait for


def test_waiting_for_a_summary_stops_when_the_sampler_dies(tmp_path: Path) -> None:
    child = gc.SamplerProcess([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ),
                              tmp_path / "stderr")
    assert child.wait_for(tmp_path / "never", 30) is False
    assert child.popen.returncode == 3 and child.stop() is not None


# --- nvidia-smi beside it ----------------------------------------------------------------------------


FAKE_SMI = textwrap.dedent("""\
    import sys, time
    for i, power in enumerate(["70.5", "[N/A]", "71.5", "72.5"]):
        print(f"0, {i}, 500, {power}")  # stdio: block-buffered into a pipe, by line to a terminal
        time.sleep(0.25)
""")


def run_out(watch: gc.SmiWatch, timeout: float = 30) -> None:
    """Until the watched command has ended by itself (stop() would end it)."""
    deadline = time.monotonic() + timeout
    while watch.process is not None and watch.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_smi_lines_are_stamped_as_they_arrive_not_when_the_buffer_fills() -> None:
    watch = gc.SmiWatch([sys.executable, "-c", FAKE_SMI])
    watch.start()
    run_out(watch)
    watch.stop()
    rows = watch.rows()
    assert [r.util for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert [r.power_w for r in rows] == [70.5, None, 71.5, 72.5]
    gaps = [b.time - a.time for a, b in zip(rows, rows[1:], strict=False)]
    assert min(gaps) > 0.15, gaps  # a pipe would have delivered them all at once, at exit
    assert watch.note == ""


def test_missing_or_failing_nvidia_smi_is_a_note_not_a_crash() -> None:
    watch = gc.SmiWatch(["/nonexistent/nvidia-smi", "-lms", "100"])
    watch.start()
    watch.stop()
    assert watch.rows() == [] and "not found" in watch.note
    said = "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."
    failing = gc.SmiWatch([sys.executable, "-c", f"print({said!r}); raise SystemExit(9)"])
    failing.start()
    run_out(failing)  # it has said why: stop() on a Python still starting would end it unheard
    failing.stop()
    assert failing.rows() == [] and "could not communicate with the NVIDIA driver" in failing.note


def test_smi_command_queries_the_four_fields_of_one_gpu_every_100_ms() -> None:
    command = gc.smi_command("GPU-abc")
    assert command[0] == "nvidia-smi"
    assert "--query-gpu=index,utilization.gpu,memory.used,power.draw" in command
    assert "--format=csv,noheader,nounits" in command
    assert command[command.index("-i") + 1] == "GPU-abc" and command[command.index("-lms") + 1] == "100"


# --- nothing to check with: exit 2, one line, no traceback ---------------------------------------------


def run_script(
    tmp_path: Path, *args: str, plant: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The script as `make gpu-check` runs it (PYTHONPATH = the repository), with stand-in
    modules planted ahead of the real ones."""
    path = [str(REPO)]
    if plant:
        fake = tmp_path / "fake"
        for name, source in plant.items():
            (fake / name).mkdir(parents=True)
            (fake / name / "__init__.py").write_text(textwrap.dedent(source), encoding="utf-8")
        path.insert(0, str(fake))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)


def assert_one_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: "), done.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="this interpreter has torch")
def test_without_torch_it_exits_2_saying_so(tmp_path: Path) -> None:
    assert_one_line(run_script(tmp_path), "PyTorch (torch) is not installed", sys.executable)


def test_a_torch_that_cannot_be_imported_exits_2(tmp_path: Path) -> None:
    done = run_script(tmp_path, plant={"torch": "raise ImportError('libcudart.so.12: cannot open')"})
    assert_one_line(done, "PyTorch (torch) is not installed")


TORCH_WITHOUT_CUDA = """\
    from types import SimpleNamespace
    __version__ = "2.9.0+cpu"
    cuda = SimpleNamespace(is_available=lambda: False)
"""
TORCH_WITH_CUDA = """\
    from types import SimpleNamespace
    __version__ = "2.9.0"
    cuda = SimpleNamespace(is_available=lambda: True)
"""
NVML_WITHOUT_DRIVER = """\
    class NVMLError(Exception):
        pass
    def nvmlInit():
        raise NVMLError("Driver Not Loaded")
"""
NVML_ONE_GPU = """\
    class NVMLError(Exception):
        pass
    def nvmlInit():
        pass
    def nvmlDeviceGetCount():
        return 1
"""


def test_a_torch_without_cuda_exits_2(tmp_path: Path) -> None:
    done = run_script(tmp_path, plant={"torch": TORCH_WITHOUT_CUDA})
    assert_one_line(done, "sees no CUDA GPU", "2.9.0+cpu")


def test_no_nvidia_driver_exits_2(tmp_path: Path) -> None:
    done = run_script(tmp_path, plant={"torch": TORCH_WITH_CUDA, "pynvml": NVML_WITHOUT_DRIVER})
    assert_one_line(done, "no NVIDIA GPU here", "Driver Not Loaded")


def test_a_gpu_index_that_is_not_there_exits_2(tmp_path: Path) -> None:
    done = run_script(tmp_path, "--gpu", "4", plant={"torch": TORCH_WITH_CUDA, "pynvml": NVML_ONE_GPU})
    assert_one_line(done, "no GPU with NVML index 4", "has 1")


# --- GPM against what each phase should give ------------------------------------------------------


def gpm_phases(square_sm: float | None = 30.0) -> list[Any]:
    return [
        result("idle", busy_fraction=0.0, gpm=True, sm_active=0.3, tensor_active=0.0),
        result("busy", busy_fraction=0.99, gpm=True, sm_active=97.0, tensor_active=60.0),
        result("square", busy_fraction=0.30, gpm=True, sm_active=square_sm, tensor_active=18.5),
        result("memory", busy_fraction=0.001, gpm=True, sm_active=0.1, tensor_active=0.0),
    ]


def gpm_verdicts(phases: list[Any], has_gpm: bool | None = True) -> dict[str, dict[str, bool | None]]:
    busy = gc.busy_phase(phases)
    return {p.name: {c.name: c.ok for c in gc.gpm_checks(p, busy, has_gpm)} for p in phases}


def test_gpm_figures_that_fit_their_phases_pass() -> None:
    found = gpm_verdicts(gpm_phases())
    assert all(ok for checks in found.values() for ok in checks.values()), found


@pytest.mark.parametrize("square_sm, ok", [(29.4 - 5.0, True), (29.4 - 5.1, False), (29.4 + 5.1, False)])
def test_the_square_wave_is_the_busy_phase_scaled_by_its_duty(square_sm: float, ok: bool) -> None:
    # 97 x 0.30 / 0.99 = 29.4: five points either side
    assert gpm_verdicts(gpm_phases(square_sm))["square"]["sm_active"] is ok


def test_sm_activity_on_an_idle_gpu_or_a_weak_busy_phase_is_off() -> None:
    phases = gpm_phases()
    phases[0].sm_active = 2.5
    phases[1].tensor_active = 5.0
    found = gpm_verdicts(phases)
    assert found["idle"]["sm_active"] is False and found["busy"]["tensor_active"] is False


def test_a_null_gpm_figure_fails_only_where_the_gpu_has_gpm() -> None:
    phases = gpm_phases(square_sm=None)
    assert gpm_verdicts(phases, has_gpm=True)["square"]["sm_active"] is False
    assert gpm_verdicts(phases, has_gpm=False)["square"]["sm_active"] is None
    probe = gc.Probe([], [], True, "ok", "x")
    table = gc.format_table(phases, gc.CpuFigure(None, None, 0, 0), [], probe=probe)
    assert "  square sm_active: null where the GPU has GPM" in table.splitlines()


# --- what NVML refuses, probed through the sampler's own Gpu, and the report's answer --------------


def sim_gpu(sim_node: Any, minor: int) -> Any:
    import pynvml

    pynvml.nvmlInit()
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if pynvml.nvmlDeviceGetMinorNumber(handle) == minor:
            return gc.GpuInfo(pynvml, handle, index, minor, gc.text(pynvml.nvmlDeviceGetUUID(handle)),
                              gc.text(pynvml.nvmlDeviceGetName(handle)), "sim")
    raise AssertionError(f"no minor {minor}")


@pytest.mark.parametrize("spec, refused, gpm", [
    ({}, [], True),
    ({"gpm": False, "unsupported": ["nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"]},
     ["GPM", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"], False),
])
def test_the_probe_names_each_call_the_gpu_refuses(
    sim_node: Any, spec: dict[str, Any], refused: list[str], gpm: bool,
) -> None:
    device = {"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": "NVIDIA H100 (sim)",
              "memory_total_gib": 80, "power_limit_w": 700, "idle_power_w": 60, "sample_period_s": 0.2,
              **spec}
    sim_node.write_devices({"gpu1": [device]})
    standin.set_clock(sim_node.lib, None)  # GPM wants its two samples 100 ms apart in real time
    probe = gc.probe_nvml(sim_gpu(sim_node, 0))
    assert probe.unsupported == refused and probe.gpm is gpm and probe.errors == []
    assert probe.events == "ok" and probe.runtime
    lines = gc.probe_lines(probe, [])
    assert lines[1] == "NVML calls refused here (NOT_SUPPORTED or missing): " + (", ".join(refused) or "none")


def test_a_refused_figure_must_read_none_in_the_report(make_summary: Any) -> None:
    summary = make_summary(utils=[55.0]).to_dict()
    summary["run_started_at"] = summary["started_at"]
    text, data = gc.phase_report(summary, "busy", "900101")
    assert "Job ID: 900101" in text and "GPU Utilisation: 55.0%" in text
    measured = {c.name: c.ok for c in gc.not_measured_checks(data, [])}
    assert measured["util_mean"] and measured["power_mean_w"] and measured["energy_j"]
    assert measured["sm_active_mean"] is False  # measured where GPM answered: the summary has none
    # Power refused, yet the report shows a figure: a fault the check names
    refused = gc.not_measured_checks(data, ["nvmlDeviceGetPowerUsage", "GPM"])
    power = next(c for c in refused if c.name == "power_mean_w")
    assert power.ok is False and "250" in power.detail
    assert next(c for c in refused if c.name == "sm_active_mean").ok is True  # null, as it should be


def test_each_nvml_call_is_timed_alone_and_a_refused_one_has_no_figure(sim_node: Any) -> None:
    device = {"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": "NVIDIA H100 (sim)",
              "unsupported": ["nvmlDeviceGetPowerUsage"]}
    sim_node.write_devices({"gpu1": [device]})
    standin.set_clock(sim_node.lib, None)
    costs = gc.call_costs(sim_gpu(sim_node, 0), rounds=3, interval_s=0.0)
    assert costs["GetPowerUsage"] is None
    timed = {name: v for name, v in costs.items() if v is not None}
    assert {"GetSamples(gpu)", "GetMemoryInfo_v2", "GpmSampleGet+MetricsGet",
            "GetSamples(gpu) C sizing call", "GetSamples(gpu) C one call, buffer ready"} <= set(timed)
    assert all(cpu >= 0 and wall >= 0 for cpu, wall in timed.values())
    text = gc.call_lines(costs)
    assert "median of 40" in text and text.rstrip().endswith("failed: GetPowerUsage")


def test_the_samples_c_calls_find_what_pynvml_finds(sim_node: Any) -> None:
    """The two C calls timed beside pynvml's GetSamples (its sizing call, and one call into
    a buffer made ready) ask the driver the same: as many samples."""
    sim_node.write_state(0, {"phases": [{"seconds": 100, "gpus": {"*": {"util": 50}}}]},
                         started_at=sim_node.now - 10)
    gpu = sim_gpu(sim_node, 0)
    sizing, one_call = gc.samples_c_calls(gpu.nvml, gpu.handle).values()
    _, found = gpu.nvml.nvmlDeviceGetSamples(gpu.handle, 1, 0)
    assert sizing() == one_call() == len(found) > 0


# --- the workload in each phase's job cgroup ----------------------------------------------------


@pytest.mark.parametrize("layout, base", [
    ("v2", "system.slice/slurmstepd.scope"),
    ("v1", "freezer/slurm/uid_0"),
])
def test_the_workload_joins_a_slurm_shaped_cgroup_the_sampler_reads_as_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, base: str,
) -> None:
    from slurm_gpu_eff.node.jobenv import job_cgroup_exists, job_in_cgroup

    if layout == "v2":
        (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    else:
        (tmp_path / "freezer").mkdir()
        (tmp_path / "freezer" / "cgroup.procs").write_text("")
    monkeypatch.setattr(gc.os, "geteuid", lambda: 0)
    monkeypatch.setattr(gc, "slurm_running", lambda: False)
    cgroups = gc.JobCgroups(str(tmp_path), pid=4242)
    assert cgroups.why == ""
    cgroups.join("900002")
    leaf = tmp_path / base / "job_900002" / "step_0" / "task_0"
    assert (leaf / "cgroup.procs").read_text() == "4242\n"
    assert job_in_cgroup(f"0::/{base}/job_900002/step_0/task_0\n") == "900002"
    assert job_cgroup_exists("900002", "gpucheck", str(tmp_path))
    cgroups.join("900003")
    for path in (leaf / "cgroup.procs",):
        path.unlink()  # a real cgroup has no files to remove; the stand-in directory does
    (tmp_path / base / "job_900003" / "step_0" / "task_0" / "cgroup.procs").unlink()
    cgroups.leave()
    assert not (tmp_path / base / "job_900002").exists() and not (tmp_path / base / "job_900003").exists()


def test_no_job_cgroup_as_a_user_or_beside_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cgroup.controllers").write_text("")
    monkeypatch.setattr(gc.os, "geteuid", lambda: 1000)
    assert gc.JobCgroups(str(tmp_path)).why.startswith("not root")
    monkeypatch.setattr(gc.os, "geteuid", lambda: 0)
    monkeypatch.setattr(gc, "slurm_running", lambda: True)
    cgroups = gc.JobCgroups(str(tmp_path))
    assert cgroups.why.startswith("Slurm runs here")
    cgroups.join("900002")
    assert not (tmp_path / "system.slice").exists()
