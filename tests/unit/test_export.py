"""The Prometheus export (issue 12): a running job's live figures from the real sampler
over the stand-in NVML, written for node_exporter's textfile collector in the Prometheus
text format and parsed with prometheus_client's parser for it (the real node_exporter
reads it in test_export_node_exporter.py); hostile label values; the file written whole
and gone when the job ends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_eff.config import Config, parse_config
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.node import export
from slurm_gpu_eff.node.jobenv import JobContext
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.sampler import Sampler, export_live, unexport

from .conftest import BOOT


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_running_job_s_figures_parse_as_prometheus_text(sim_node: Any, tmp_path: Path) -> None:
    busy = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 75, "mem_used_gib": 12, "power_w": 420}}}]}
    sim_node.write_state(0, busy, started_at=BOOT + 950.0)
    idle = {"phases": [{"seconds": 100, "gpus": {"*": {"util": 0}}}]}
    sim_node.write_state(2, idle, started_at=BOOT + 950.0)
    session = sim_node.session()
    job = JobContext(job_id="4242", node="gpu1", user='al"ice\\', account="phys\nics")
    config = Config(export_dir=str(tmp_path / "textfile"), export_labels="user")
    (tmp_path / "textfile").mkdir()
    sampler = Sampler(job, config, session.bind([0, 2]), clock=session.clock,
                      monotonic=sim_node.clock)  # the idle stretch counts on this one
    for t in (1001.0, 1002.0, 1003.0):
        sim_node.now = BOOT + t
        sampler.sample_once()
    log = HookLog(str(tmp_path / "log"), "4242", "sampler")
    export_live(sampler, log)
    path = Path(export.path_for(config.export_dir, "4242"))
    text = path.read_text()
    assert "# EOF" not in text and oct(path.stat().st_mode & 0o777) == "0o644"
    found = families(text)
    util = {s.labels["minor"]: s.value for s in found["gpueff_gpu_utilization_ratio"].samples}
    assert util == {"0": 0.75, "2": 0.0}
    labels = found["gpueff_gpu_utilization_ratio"].samples[0].labels
    assert labels == {"job_id": "4242", "user": 'al"ice\\', "account": "phys\nics", "node": "gpu1",
                      "minor": "0", "uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    memory = {s.labels["minor"]: s.value for s in found["gpueff_gpu_memory_used_bytes"].samples}
    assert memory["0"] == 12 * 1024**3
    power = {s.labels["minor"]: s.value for s in found["gpueff_gpu_power_watts"].samples}
    assert power["0"] == 420.0
    energy = found["gpueff_gpu_energy_joules"]
    assert energy.type == "counter" and energy.samples[0].name == "gpueff_gpu_energy_joules_total"
    assert all(s.value > 0 for s in energy.samples)
    idle = {s.labels["minor"]: s.value for s in found["gpueff_gpu_idle_seconds"].samples}
    assert idle == {"0": 0.0, "2": 3.0}  # GPU 2 idle since its binding (BOOT + 1000)
    assert "gpueff_gpu_sm_active_ratio" in found
    unexport(config, "4242")
    assert not path.exists()
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == []  # no part file left either


class Gpu:
    """One GPU's figures as node/live.LiveFigures gives them."""

    def __init__(self, minor: int, **labels: str) -> None:
        self.minor, self.extra = minor, labels

    def live(self) -> dict[str, float | None]:
        return {name: 1.5 for name, _, _ in export.METRICS}

    def labels(self) -> dict[str, str]:
        return {"job_id": "7", "user": "alice", "account": "phys", "node": "gpu1",
                "minor": str(self.minor), "uuid": f"GPU-{self.minor}", **self.extra}


def test_every_sample_is_typed_and_described_under_the_name_it_is_exposed_by() -> None:
    """node_exporter's textfile collector parses the Prometheus text format: a sample whose
    name has no TYPE line of its own (an OpenMetrics counter's _total) arrives untyped, and
    with node_exporter's HELP in place of ours."""
    text = export.text([Gpu(0), Gpu(1)])
    typed, described, sampled = set(), set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line.startswith("# HELP "):
            described.add(line.split()[2])
        else:
            assert not line.startswith("#"), line  # no # UNIT, no # EOF
            sampled.add(line.partition("{")[0])
    assert sampled == typed == described
    assert "gpueff_gpu_energy_joules_total counter" in text


def test_by_default_a_job_is_named_by_its_id_alone(tmp_path: Path) -> None:
    """The file is world-readable and node_exporter's port is open to the network: who ran
    the job, and under which account, only where the site asks (`[export] labels`)."""
    config = parse_config(f'[export]\ntextfile_dir = "{tmp_path}"\n', "gpueff.toml")
    assert config.export_labels == "job"
    found = families(export.text([Gpu(0)], config.export_labels))
    labels = found["gpueff_gpu_power_watts"].samples[0].labels
    assert labels == {"job_id": "7", "node": "gpu1", "minor": "0", "uuid": "GPU-0"}
    assert "alice" not in export.text([Gpu(0)]) and "phys" not in export.text([Gpu(0)])
    owned = families(export.text([Gpu(0)], "user"))["gpueff_gpu_power_watts"].samples[0].labels
    assert (owned["user"], owned["account"]) == ("alice", "phys")


def test_labels_are_job_or_user() -> None:
    assert parse_config('[export]\nlabels = "user"\n', "f").export_labels == "user"
    with pytest.raises(ConfigError, match=r'\[export\] labels = \'everything\': say job or user'):
        parse_config('[export]\nlabels = "everything"\n', "f")


def test_an_export_that_cannot_be_written_is_logged_once(tmp_path: Path) -> None:
    class Fake:
        config = Config(export_dir=str(tmp_path / "absent"))
        job = JobContext(job_id="1", node="n")
        gpus: list[Any] = []
        export_failed = False

    log_path, sampler = tmp_path / "log", Fake()
    for _ in range(3):
        export_live(sampler, HookLog(str(log_path), "1", "sampler"))  # type: ignore[arg-type]
    assert log_path.read_text().count("Prometheus export to") == 1


def test_without_a_directory_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "write", lambda *a: pytest.fail("written"))

    class Fake:
        config = Config()
        job = JobContext(job_id="1", node="n")
        gpus: list[Any] = []
        export_failed = False
    export_live(Fake(), HookLog(str(tmp_path / "log"), "1", "sampler"))  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []  # not even a log line


def test_the_grafana_dashboard_asks_only_for_what_is_exported() -> None:
    import json
    import re

    path = Path(__file__).resolve().parents[2] / "etc" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"gpueff_\w+", target["expr"])}
    exported = {export.exposed(name, kind) for name, _, kind in export.METRICS}
    assert asked and asked <= exported, asked - exported


def test_the_grafana_dashboard_shows_jobs_exported_without_a_user() -> None:
    """Under the default labels no series has `user`: "All" must match it absent (`.*`
    does; a list of the users found, none, would not)."""
    import json

    path = Path(__file__).resolve().parents[2] / "etc" / "grafana-dashboard.json"
    variables = {v["name"]: v for v in json.loads(path.read_text())["templating"]["list"]}
    assert variables["user"]["allValue"] == ".*"


def test_a_link_planted_where_the_file_is_written_is_not_followed(tmp_path: Path) -> None:
    """The directory may be node_exporter's user's: root never writes through a link."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "textfile").mkdir()
    planted = tmp_path / "textfile" / f".gpueff-job-1.prom.{os.getpid()}"
    planted.symlink_to(victim)
    export.write(str(tmp_path / "textfile"), "1", [])
    assert victim.read_text() == "precious\n"
    assert Path(export.path_for(str(tmp_path / "textfile"), "1")).read_text().startswith("# HELP ")
