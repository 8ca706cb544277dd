"""config.py: the TOML file an admin writes, read with its types, and the example file an
admin copies stays true to the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_gpu_eff.config import (
    _KEYS,
    SETTINGS,
    Config,
    SteppedClock,
    driver_clock,
    load_config,
    parse_config,
    sampler_clock,
)
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.report.hints import HintSettings
from tests.configfile import toml, write_config


def test_the_example_config_names_every_setting_with_its_default() -> None:
    """etc/gpueff.toml.example is what an admin copies: every key there, as the default."""
    example = Path(__file__).resolve().parents[2] / "etc" / "gpueff.toml.example"
    text = example.read_text()
    loaded, defaults = load_config(str(example)), Config()
    assert {k: getattr(loaded, k) for k in SETTINGS} == {k: getattr(defaults, k) for k in SETTINGS}
    assert loaded.hints == defaults.hints
    written = set(re.findall(r"^#? ?\[(\w+)\]", text, re.M))
    for section, key, _, _ in _KEYS:
        assert section in written and re.search(rf"^#? ?{key} =", text, re.M), f"[{section}] {key}"


def test_every_setting_has_its_key_in_the_file_and_its_type() -> None:
    """A setting is a class attribute of Config and a key in _KEYS: one without the other
    could not be set from the file, or would be set without a default."""
    assert {name for _, _, name, _ in _KEYS} == SETTINGS
    for _, _, name, kind in _KEYS:
        default = getattr(Config, name)
        assert default is None or isinstance(default, kind), name


def test_a_setting_that_does_not_exist_is_refused() -> None:
    with pytest.raises(TypeError, match="no setting 'intervall_s'"):
        Config(intervall_s=1.0)
    assert Config(interval_s=2.5).interval_s == 2.5 and Config().interval_s == 1.0


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "gpueff.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(str(path))


def refused(tmp_path: Path, text: str) -> str:
    """The ConfigError's message for the file holding `text`."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)


# --- defaults and types ---------------------------------------------------------------------


def test_an_empty_file_and_a_missing_default_file_are_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def settings(config: Config) -> dict[str, object]:
        return {"hints": config.hints, **{k: getattr(config, k) for k in SETTINGS}}

    defaults = settings(Config())
    assert settings(load(tmp_path, "")) == defaults
    assert settings(load(tmp_path, "[gpu]\n[sampler]\n")) == defaults
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)
    monkeypatch.setattr("slurm_gpu_eff.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    missing = load_config()
    assert missing.path is None and settings(missing) == defaults


def test_a_config_file_named_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "absent.toml"))


def test_values_keep_their_toml_types(tmp_path: Path) -> None:
    config = load(tmp_path, toml({
        "gpu": {"library": "/x/libnvidia-ml.so.1"},
        "sampler": {"interval_s": 0.2, "checkpoint_s": 60},  # an int where a float is wanted
        "slurm": {"admin_comment": False},
        "mail": {"smtp_port": 2525, "idle_interactive": True, "idle_exempt_users": "bob,carol"},
    }))
    assert config.gpu_library == "/x/libnvidia-ml.so.1"
    assert (config.interval_s, config.checkpoint_s) == (0.2, 60.0)
    assert type(config.checkpoint_s) is float
    assert config.admin_comment is False and config.idle_interactive is True
    assert config.mail_smtp_port == 2525 and type(config.mail_smtp_port) is int
    assert config.idle_exempt_users == "bob,carol"


def test_an_empty_string_is_the_default_but_where_it_says_something(tmp_path: Path) -> None:
    config = load(tmp_path, '[store]\npath = ""\n[log]\nfile = ""\n[mail]\nidle_opt_out_word = ""\n')
    assert (config.store_path, config.log_file) == (Config().store_path, Config().log_file)
    assert config.idle_opt_out_word == ""  # "" says: no opt-out word


def test_the_config_file_is_written_as_the_tests_helper_writes_it(tmp_path: Path) -> None:
    path = write_config(tmp_path / "gpueff.toml", {"spool": {"dir": f"{tmp_path}/spool/%n", "retry_s": 0.5}})
    assert path.read_text() == f'[spool]\ndir = "{tmp_path}/spool/%n"\nretry_s = 0.5\n'
    config = load_config(str(path))
    assert (config.spool_for("gpu1"), config.retry_s) == (f"{tmp_path}/spool/gpu1", 0.5)


# --- errors name the file, the key and its line ---------------------------------------------


def test_an_unknown_setting_is_an_error_naming_it_and_its_line(tmp_path: Path) -> None:
    assert refused(tmp_path, '[gpu]\nlibrary = ""\nbackend = "sim"\n') == (
        f"{tmp_path / 'gpueff.toml'}, line 3: [gpu] backend: unknown setting")
    assert "[other] devices: unknown setting" in refused(tmp_path, '[other]\ndevices = "/x"\n')


@pytest.mark.parametrize(("text", "message"), [
    ('[sampler]\ninterval_s = "fast"\n', "line 2: [sampler] interval_s = 'fast': must be a number"),
    ('[sampler]\ninterval_s = "0.2"\n', "line 2: [sampler] interval_s = '0.2': must be a number"),
    ("[sampler]\ninterval_s = true\n", "line 2: [sampler] interval_s = True: must be a number"),
    ('# a comment\n[gpu]\n\nlibrary = 5\n', "line 4: [gpu] library = 5: must be a string in quotes"),
    ('[slurm]\nadmin_comment = "yes"\n', "line 2: [slurm] admin_comment = 'yes': must be true or false"),
    ("[slurm]\nadmin_comment = 1\n", "line 2: [slurm] admin_comment = 1: must be true or false"),
    ("[mail]\nsmtp_port = 25.5\n", "line 2: [mail] smtp_port = 25.5: must be a whole number"),
    ("[mail]\nsmtp_port = true\n", "line 2: [mail] smtp_port = True: must be a whole number"),
    ("[mail]\nsmtp_port = -1\n", "line 2: [mail] smtp_port = -1: must not be negative"),
    ('[mail]\ntransport = "pigeon"\n', "line 2: [mail] transport = 'pigeon': say smtp or sendmail"),
    ("[sampler]\ninterval_s = 0\n", "line 2: [sampler] interval_s = 0: must be a number greater than 0"),
    ("[sampler]\ninterval_s = inf\n", "line 2: [sampler] interval_s = inf: must be a number greater than 0"),
    ("[mail]\nmin_minutes = -1\n",
     "line 2: [mail] min_minutes = -1: must be a number greater than 0 (or 0)"),
])
def test_a_wrong_type_or_value_names_the_key_and_its_line(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == f"{tmp_path / 'gpueff.toml'}, {message}"


def test_a_value_that_is_not_valid_toml_names_the_line(tmp_path: Path) -> None:
    message = refused(tmp_path, '[gpu]\nlibrary = ""\n[sampler]\ninterval_s = 0.2 s\n')
    assert message.startswith(f"{tmp_path / 'gpueff.toml'}: not valid TOML: ")
    assert "line 4" in message


def test_a_key_outside_any_section_is_an_error(tmp_path: Path) -> None:
    assert refused(tmp_path, 'interval_s = 0.2\n[sampler]\ncheckpoint_s = 60\n') == (
        f"{tmp_path / 'gpueff.toml'}, line 1: interval_s: settings go under a [section] "
        "(see etc/gpueff.toml.example)")


@pytest.mark.parametrize("line", [
    "library = /x/libnvidia-ml.so.1",  # an unquoted path
    "library = libnvidia-ml.so.1",  # an unquoted name
    "library =",  # the old INI's empty value
])
def test_an_old_style_unquoted_string_is_a_clear_error(tmp_path: Path, line: str) -> None:
    """The old INI took `library = /x` as a string: TOML does not, and it must be said, not
    taken as something else."""
    message = refused(tmp_path, f"[gpu]\n{line}\n")
    assert message.startswith(f"{tmp_path / 'gpueff.toml'}: not valid TOML: ") and "line 2" in message


@pytest.mark.parametrize("word", ["yes", "no", "on", "off"])
def test_the_old_ini_booleans_are_errors(tmp_path: Path, word: str) -> None:
    message = refused(tmp_path, f"[slurm]\nadmin_comment = {word}\n")
    assert message.startswith(f"{tmp_path / 'gpueff.toml'}: not valid TOML: ") and "line 2" in message


# --- [hints] --------------------------------------------------------------------------------


def test_hints_dotted_keys_and_an_array_disable(tmp_path: Path) -> None:
    config = load(tmp_path, '[hints]\ndisable = ["short_job", "time_limit"]\nlow_util.warn_pct = 30\n'
                            'low_util.message = "Busy {util_mean_pct:.0f}%"\n')
    assert config.hints == {"disable": "short_job, time_limit", "low_util.warn_pct": "30",
                            "low_util.message": "Busy {util_mean_pct:.0f}%"}
    settings = HintSettings.from_config(config.hints)
    assert settings.disabled == {"short_job", "time_limit"} and settings.params["low_util"]["warn_pct"] == 30
    # the same as a string, and as a table of its own
    same = load(tmp_path, '[hints]\ndisable = "short_job, time_limit"\n[hints.low_util]\nwarn_pct = 30\n')
    assert HintSettings.from_config(same.hints).disabled == settings.disabled
    assert HintSettings.from_config(same.hints).params["low_util"]["warn_pct"] == 30


def test_hints_are_read_back_as_written_and_checked_by_the_hints_module(tmp_path: Path) -> None:
    config = parse_config('[hints]\nnope.warn_pct = 3\n', "gpueff.toml")  # the reader takes it
    assert config.hints == {"nope.warn_pct": "3"}
    with pytest.raises(ConfigError, match=r"\[hints\] nope.warn_pct"):
        HintSettings.from_config(config.hints)


def test_an_old_ini_file_left_by_an_upgrade_is_an_error_not_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff import config as config_module

    old = tmp_path / "gpueff.conf"
    old.write_text("[spool]\ndir = /shared/spool/%n\n")
    monkeypatch.delenv("GPUEFF_CONFIG", raising=False)
    monkeypatch.setattr(config_module, "DEFAULT_PATH", str(tmp_path / "gpueff.toml"))
    monkeypatch.setattr(config_module, "OLD_PATH", str(old))
    with pytest.raises(ConfigError, match="is the old INI form: write it as .*gpueff.toml"):
        config_module.load_config()


def test_exempt_names_as_a_toml_array_or_a_string(tmp_path: Path) -> None:
    users = parse_config('[mail]\nidle_exempt_users = ["bob", "carol"]\n', "f").idle_exempt_users
    assert users == "bob, carol"
    assert parse_config('[mail]\nidle_exempt_accounts = "a,b"\n', "f").idle_exempt_accounts == "a,b"
    with pytest.raises(ConfigError, match="idle_exempt_users = \\[1\\]: must be a string"):
        parse_config("[mail]\nidle_exempt_users = [1]\n", "f")


def test_a_test_s_clock_offset_file_steps_the_samplers_wall_clock_only(tmp_path: Path) -> None:
    """[sim] clock_offset_file (tests only: issue 20's soak steps one node's samplers' clock
    without touching the machine's): the samplers' clock adds the seconds the node's file
    holds; a missing or garbage file adds nothing and never raises; the in-job workload's
    clock (driver_clock) stays the simulated driver's."""
    config = load(tmp_path, f'[sim]\nclock_offset_file = "{tmp_path}/offset-%n"\n')
    assert config.sim_clock_offset_file == f"{tmp_path}/offset-%n"
    assert Config().sim_clock_offset_file == ""
    assert sampler_clock(Config(), "gpu1") is driver_clock(Config())  # none: the wall clock itself
    (tmp_path / "offset-gpu1").write_text("3600\n")
    stepped, other = sampler_clock(config, "gpu1"), sampler_clock(config, "gpu2")
    assert stepped() - driver_clock(config)() == pytest.approx(3600, abs=1)
    assert other() == pytest.approx(driver_clock(config)(), abs=1)  # gpu2 has no file
    wall, mono = [1000.0], [0.0]
    clock = SteppedClock(lambda: wall[0], str(tmp_path / "offset-gpu1"), lambda: mono[0])
    assert clock() == 4600.0
    (tmp_path / "offset-gpu1").write_text("-600.5")
    mono[0] = 0.9
    assert clock() == 4600.0  # read at most once a second
    mono[0] = 1.0
    assert clock() == 399.5
    for junk in ("", "soon", "nan", "inf", "1e999", "\xff\xfe", "1" * 100):
        (tmp_path / "offset-gpu1").write_text(junk, encoding="latin-1")
        mono[0] += 1.0
        assert clock() == 1000.0, junk
    (tmp_path / "offset-gpu1").unlink()
    mono[0] += 1.0
    assert clock() == 1000.0
