"""What node/export.py writes, read by the real node_exporter's textfile collector (issue
20, finding 9): the files written by the package's writer into a directory, node_exporter
(Debian's `prometheus-node-exporter`, 1.5) started on it, its /metrics scraped over HTTP.
Each metric must arrive with our TYPE and HELP, its labels and its values: an OpenMetrics
file gave an untyped energy counter described as "Metric read from ...". Skipped where the
binary is not installed."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_eff.node import export

BINARY = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = pytest.mark.skipif(BINARY is None, reason="node_exporter is not installed "
                                "(Debian: apt-get install prometheus-node-exporter)")

# A different value for each metric and GPU: a figure under the wrong name or GPU shows.
VALUES = {metric[0]: float(10 ** i) for i, metric in enumerate(export.METRICS)}


class Gpu:
    """One GPU's figures as node/live.LiveFigures gives them."""

    def __init__(self, job_id: str, minor: int, user: str = "alice", unsupported: str = "") -> None:
        self.job_id, self.minor, self.user, self.unsupported = job_id, minor, user, unsupported

    def live(self) -> dict[str, float | None]:
        return {name: None if name == self.unsupported else value + self.minor
                for name, value in VALUES.items()}

    def labels(self) -> dict[str, str]:
        return {"job_id": self.job_id, "user": self.user, "account": "phys", "node": "gpu1",
                "minor": str(self.minor), "uuid": f"GPU-{self.job_id}-{self.minor}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(directory: Path) -> str:
    """node_exporter's /metrics with the textfile collector alone on `directory`. A port
    taken between free_port() and node_exporter's bind makes it exit: another port, then."""
    assert BINARY is not None
    for _ in range(3):
        port = free_port()
        process = subprocess.Popen(
            [BINARY, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={directory}", "--web.disable-exporter-metrics",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            text = wait_for_metrics(port, process)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=10)
        if text is not None:
            return text
    pytest.fail(f"node_exporter never served /metrics: {stderr.decode(errors='replace')[-2000:]}")


def wait_for_metrics(port: int, process: subprocess.Popen[bytes]) -> str | None:
    """The page once node_exporter answers; None if it exited first."""
    deadline = time.monotonic() + 15
    while process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return str(answer.read().decode("utf-8"))
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, "node_exporter did not answer within 15 s"
            time.sleep(0.05)
    return None


def samples_of(families: dict[str, Any], name: str, kind: str) -> dict[tuple[str, str], Any]:
    """A metric's samples by (job_id, minor), after checking the family's TYPE."""
    family = families[name]
    assert family.type == kind, (name, family.type)
    return {(s.labels["job_id"], s.labels["minor"]): s for s in family.samples}


def test_node_exporter_reads_every_metric_with_its_type_help_labels_and_values(tmp_path: Path) -> None:
    directory = tmp_path / "textfile"
    directory.mkdir()
    # one job as `[export] labels = "user"` writes it, one by the default: the setting
    # changed while jobs ran
    export.write(str(directory), "7", [Gpu("7", 0, user='al"i\\ce'), Gpu("7", 1)], "user")
    export.write(str(directory), "8", [Gpu("8", 0, unsupported="gpueff_gpu_sm_active_ratio")])
    page = scrape(directory)

    # prometheus_client names a counter's family without its _total, as Prometheus does
    families = {f.name: f for f in text_string_to_metric_families(page)}
    assert families["node_textfile_scrape_error"].samples[0].value == 0
    for name, help_text, kind, *_ in export.METRICS:
        exposed = f"{name}_total" if kind == "counter" else name  # Prometheus' convention
        assert f"# TYPE {exposed} {kind}\n" in page
        assert families[name].documentation == help_text
        found = samples_of(families, name, kind)
        expected = {("7", "0"), ("7", "1")} | (set() if "sm_active" in name else {("8", "0")})
        assert set(found) == expected, name
        for (job_id, minor), sample in found.items():
            assert sample.name == exposed
            assert sample.value == VALUES[name] + int(minor)
            assert sample.labels["uuid"] == f"GPU-{job_id}-{minor}"
    power = samples_of(families, "gpueff_gpu_power_watts", "gauge")
    users = {key: sample.labels.get("user") for key, sample in power.items()}
    assert users == {("7", "0"): 'al"i\\ce', ("7", "1"): "alice", ("8", "0"): None}
    assert power[("7", "1")].labels["account"] == "phys" and "account" not in power[("8", "0")].labels
    assert "Metric read from" not in page
