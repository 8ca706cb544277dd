"""`gpueff config`: the configuration in force, as TOML a site can copy back (the same
settings read again) or JSON; a file in error is named with the key and line at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_eff import cli
from slurm_gpu_eff.config import effective, load_config

REPO = Path(__file__).resolve().parents[2]
SITE = ('[store]\nurl = "postgresql://gpueff@db.example.org/gpueff"\n[mail]\nidle_alert_min = 30\n'
        'footer = "Help: \\"https://hpc.example.org\\" \\u007f"\n[hints]\nlow_util.warn_pct = 30\n'
        'disable = ["short_job", "time_limit"]\n')


@pytest.mark.parametrize("text", [SITE, (REPO / "etc" / "gpueff.toml.example").read_text()])
def test_what_it_prints_reads_back_as_the_same_settings(tmp_path: Path, text: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.toml"
    site.write_text(text)
    assert cli.main(["config", "--config", str(site)]) == 0
    printed = tmp_path / "printed.toml"
    printed.write_text(capsys.readouterr().out)
    assert effective(load_config(str(printed))) == effective(load_config(str(site)))


def test_json_and_the_effective_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.toml"
    site.write_text(SITE)
    assert cli.main(["config", "--json", "--config", str(site)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["path"] == str(site)
    settings = data["settings"]
    assert settings["store"]["url"] == "postgresql://gpueff@db.example.org/gpueff"
    assert settings["store"]["path"] == ""  # the file gave a URL: no SQLite path in force
    assert settings["mail"]["idle_alert_min"] == 30.0 and settings["sampler"]["interval_s"] == 1.0
    assert settings["hints"] == {"low_util.warn_pct": "30", "disable": "short_job, time_limit"}


def test_no_file_means_the_defaults_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)
    monkeypatch.setattr("slurm_gpu_eff.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    assert cli.main(["config"]) == 0
    out = capsys.readouterr().out
    assert "absent.toml (absent: defaults)" in out and 'dir = "/var/spool/slurm-gpu-eff/%n"' in out


def test_a_wrong_file_is_an_error_naming_key_and_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.toml"
    site.write_text('[spool]\n\nretry_s = "soon"\n')
    assert cli.main(["config", "--config", str(site)]) == 9
    assert capsys.readouterr().err == f"gpueff: {site}, line 3: [spool] retry_s = 'soon': must be a number\n"
