"""sim/profile.py: profile validation, exact integrals, values over time."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_gpu_eff.sim.profile import Profile, ProfileError, Signal, parse_profile


def one_phase(metrics: dict[str, Any], seconds: float = 100, key: str = "*") -> dict[str, Any]:
    return {"phases": [{"seconds": seconds, "gpus": {key: metrics}}]}


# --- validation: every error names where it is -------------------------------------------

@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "profile: needs a non-empty list 'phases'"),
        ({"phases": []}, "profile: needs a non-empty list 'phases'"),
        ({"phases": {"seconds": 1}}, "profile: needs a non-empty list 'phases'"),
        ([{"seconds": 1}], "profile: needs a non-empty list 'phases'"),
        ({"phases": ["warmup"]}, "profile phase 1: not an object"),
        ({"phases": [{"gpus": {}}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": 0}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": -5}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": "10"}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": True}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": float("inf")}]}, "profile phase 1: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": 10}, {"seconds": 0}]},
         "profile phase 2: 'seconds' must be a number > 0"),
        ({"phases": [{"seconds": 10, "gpus": ["*"]}]}, "profile phase 1: 'gpus' must be an object"),
        ({"phases": [{"seconds": 10, "gpus": {"gpu0": {}}}]},
         "profile phase 1: GPU key 'gpu0' must be '*' or a job GPU number"),
        ({"phases": [{"seconds": 10, "gpus": {"-1": {}}}]},
         "profile phase 1: GPU key '-1' must be '*' or a job GPU number"),
        ({"phases": [{"seconds": 10, "gpus": {"0": 50}}]},
         "profile phase 1: GPU '0': metrics must be an object"),
    ],
)
def test_structure_errors_name_the_phase_and_field(data: Any, message: str) -> None:
    with pytest.raises(ProfileError) as raised:
        parse_profile(data)
    assert str(raised.value) == message


def test_unknown_metric_names_phase_gpu_and_metric() -> None:
    data = {"phases": [{"seconds": 5}, {"seconds": 5, "gpus": {"1": {"utilization": 50}}}]}
    with pytest.raises(ProfileError) as raised:
        parse_profile(data)
    assert str(raised.value).startswith("profile phase 2: GPU '1': utilization: unknown metric")
    assert "util, mem_util" in str(raised.value)  # lists what it knows


@pytest.mark.parametrize(
    ("metric", "value", "message"),
    [
        ("util", 100.5, "profile phase 1: GPU '*': util: 100.5 is out of range"),
        ("sm_active", 101, "profile phase 1: GPU '*': sm_active: 101.0 is out of range"),
        ("util", -1, "profile phase 1: GPU '*': util: -1.0 is out of range"),
        ("power_w", -20, "profile phase 1: GPU '*': power_w: -20.0 is out of range"),
        ("util", {"low": 0, "high": 150, "period_s": 1},
         "profile phase 1: GPU '*': util: 150.0 is out of range"),
        ("util", "80", "profile phase 1: GPU '*': util: must be a number or {low, high, period_s, duty}"),
        ("util", True, "profile phase 1: GPU '*': util: must be a number or {low, high, period_s, duty}"),
    ],
)
def test_out_of_range_and_non_numeric_values(metric: str, value: Any, message: str) -> None:
    with pytest.raises(ProfileError) as raised:
        parse_profile(one_phase({metric: value}))
    assert str(raised.value) == message


def test_percent_limit_applies_only_to_percent_metrics() -> None:
    profile = parse_profile(one_phase({"power_w": 650, "sm_clock_mhz": 1980, "util": 100}))
    assert profile.value_at(0, "power_w", 1.0, idle=60) == 650.0
    assert profile.value_at(0, "sm_clock_mhz", 1.0, idle=0) == 1980.0
    assert profile.value_at(0, "util", 1.0, idle=0) == 100.0


@pytest.mark.parametrize(
    ("wave", "message"),
    [
        ({"low": 0, "high": 100}, "square wave needs numbers high and period_s"),
        ({"low": 0, "period_s": 1}, "square wave needs numbers high and period_s"),
        ({"high": "max", "period_s": 1}, "square wave needs numbers high and period_s"),
        ({"high": 100, "period_s": None}, "square wave needs numbers high and period_s"),
        ({"high": 100, "period_s": 0}, "square wave needs period_s > 0 and 0 <= duty <= 1"),
        ({"high": 100, "period_s": -2}, "square wave needs period_s > 0 and 0 <= duty <= 1"),
        ({"high": 100, "period_s": 1, "duty": 1.5},
         "square wave needs period_s > 0 and 0 <= duty <= 1"),
        ({"high": 100, "period_s": 1, "duty": -0.1},
         "square wave needs period_s > 0 and 0 <= duty <= 1"),
        ({"high": 100, "period_s": 1, "phase": 0.5},
         "must be a number or {low, high, period_s, duty}"),
    ],
)
def test_bad_square_waves(wave: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as raised:
        parse_profile({"phases": [{"seconds": 1}, {"seconds": 10, "gpus": {"0": {"util": wave}}}]})
    assert str(raised.value) == f"profile phase 2: GPU '0': util: {message}"


@pytest.mark.parametrize("key", ["01", "²"])
def test_a_gpu_key_that_can_never_match_is_rejected(key: str) -> None:
    with pytest.raises(ProfileError, match="GPU key"):
        parse_profile({"phases": [{"seconds": 10, "gpus": {"*": {"util": 10}, key: {"util": 90}}}]})


def test_a_valid_profile_keeps_its_raw_document() -> None:
    data = one_phase({"util": {"low": 5, "high": 95, "period_s": 2}}, seconds=30)
    profile = parse_profile(data)
    assert profile.raw is data
    assert profile.phases[0].gpus["*"]["util"] == Signal(5.0, 95.0, 2.0, 0.5)  # duty 0.5 default
    assert profile.duration_s == 30.0


# --- exact integrals ----------------------------------------------------------------------

def test_integral_of_a_constant() -> None:
    profile = parse_profile(one_phase({"util": 80}))
    assert profile.integral(0, "util", 10.0, 30.0, idle=0.0) == 1600.0
    assert profile.mean(0, "util", 10.0, 30.0, idle=0.0) == 80.0


def test_integral_of_a_square_wave_over_a_window_that_cuts_periods() -> None:
    wave = {"low": 10, "high": 90, "period_s": 1, "duty": 0.3}
    profile = parse_profile(one_phase({"util": wave}))
    # High time in [0.25, 2.75]: [0.25, 0.3) + [1, 1.3) + [2, 2.3) = 0.05 + 0.3 + 0.3 = 0.65 s
    expected = 10 * 2.5 + (90 - 10) * 0.65  # = 77
    assert profile.integral(0, "util", 0.25, 2.75, idle=0.0) == pytest.approx(expected, abs=1e-9)
    assert profile.mean(0, "util", 0.25, 2.75, idle=0.0) == pytest.approx(77 / 2.5, abs=1e-9)


def test_integral_of_a_square_wave_inside_one_low_stretch() -> None:
    profile = parse_profile(one_phase({"util": {"low": 10, "high": 90, "period_s": 1, "duty": 0.3}}))
    # [3.4, 3.9] lies wholly in the low part of the 4th period
    assert profile.integral(0, "util", 3.4, 3.9, idle=0.0) == pytest.approx(5.0, abs=1e-9)
    # [7.1, 7.2] lies wholly in the high part of the 8th period
    assert profile.integral(0, "util", 7.1, 7.2, idle=0.0) == pytest.approx(9.0, abs=1e-9)


def test_whole_periods_integrate_to_the_duty_weighted_mean() -> None:
    profile = parse_profile(one_phase({"power_w": {"low": 100, "high": 400, "period_s": 2.5,
                                                   "duty": 0.2}}))
    # 8 whole periods (20 s): mean 100 + 300 * 0.2 = 160 W, from any period boundary
    assert profile.mean(0, "power_w", 5.0, 25.0, idle=60.0) == pytest.approx(160.0, abs=1e-9)


def test_square_wave_time_restarts_at_each_phase() -> None:
    data = {"phases": [
        {"seconds": 0.75, "gpus": {"*": {"util": 0}}},
        {"seconds": 10, "gpus": {"*": {"util": {"low": 0, "high": 100, "period_s": 1,
                                                 "duty": 0.5}}}},
    ]}
    profile = parse_profile(data)
    assert profile.value_at(0, "util", 0.75, idle=0) == 100.0  # phase 2, its t = 0: high
    assert profile.value_at(0, "util", 1.24, idle=0) == 100.0
    assert profile.value_at(0, "util", 1.25, idle=0) == 0.0  # its t = 0.5: low
    # [0.75, 1.75] is one whole period of phase 2
    assert profile.integral(0, "util", 0.75, 1.75, idle=0) == pytest.approx(50.0, abs=1e-9)


def test_integral_across_phases_and_idle_before_and_after() -> None:
    data = {"phases": [
        {"seconds": 10, "gpus": {"*": {"util": 50}}},
        {"seconds": 5, "gpus": {"*": {"util": 100}}},
        {"seconds": 5},  # a phase that names no metric: idle
    ]}
    profile = parse_profile(data)
    assert profile.duration_s == 20.0
    # [-5, 0): idle 2; [0, 10): 50; [10, 15): 100; [15, 20): idle 2; [20, 25): idle 2
    expected = 2 * 5 + 50 * 10 + 100 * 5 + 2 * 5 + 2 * 5
    assert profile.integral(0, "util", -5.0, 25.0, idle=2.0) == pytest.approx(expected, abs=1e-9)
    assert profile.mean(0, "util", -5.0, 25.0, idle=2.0) == pytest.approx(expected / 30, abs=1e-9)


def test_empty_or_reversed_window() -> None:
    profile = parse_profile(one_phase({"util": 70}))
    assert profile.integral(0, "util", 5.0, 5.0, idle=0.0) == 0.0
    assert profile.integral(0, "util", 6.0, 5.0, idle=0.0) == 0.0
    assert profile.mean(0, "util", 5.0, 5.0, idle=0.0) == 70.0  # the instant value


# --- values over time, per GPU -------------------------------------------------------------

def test_value_at_follows_phases_and_is_idle_outside_them() -> None:
    data = {"phases": [
        {"seconds": 10, "gpus": {"*": {"util": 40}}},
        {"seconds": 10, "gpus": {"*": {"util": 90}}},
    ]}
    profile: Profile = parse_profile(data)
    assert profile.value_at(0, "util", -0.001, idle=3.0) == 3.0
    assert profile.value_at(0, "util", 0.0, idle=3.0) == 40.0
    assert profile.value_at(0, "util", 9.999, idle=3.0) == 40.0
    assert profile.value_at(0, "util", 10.0, idle=3.0) == 90.0  # phases are [start, end)
    assert profile.value_at(0, "util", 20.0, idle=3.0) == 3.0
    assert profile.value_at(0, "mem_util", 5.0, idle=7.0) == 7.0  # unnamed metric: idle


def test_square_wave_value_at_switches_at_duty() -> None:
    profile = parse_profile(one_phase({"util": {"low": 10, "high": 90, "period_s": 1,
                                                "duty": 0.3}}))
    assert [profile.value_at(0, "util", t, 0) for t in (0.0, 0.29, 0.3, 0.99, 1.0, 2.5)] == [
        90.0, 90.0, 10.0, 10.0, 90.0, 10.0,
    ]


def test_per_gpu_override_replaces_star_metric_by_metric() -> None:
    data = {"phases": [{"seconds": 10, "gpus": {
        "*": {"util": 50, "mem_util": 20},
        "1": {"util": 90},
        "2": {"power_w": 500},
    }}]}
    profile = parse_profile(data)
    assert profile.value_at(0, "util", 1, idle=0) == 50.0
    assert profile.value_at(1, "util", 1, idle=0) == 90.0  # its own value
    assert profile.value_at(1, "mem_util", 1, idle=0) == 20.0  # the rest from '*'
    assert profile.value_at(2, "util", 1, idle=0) == 50.0
    assert profile.value_at(2, "power_w", 1, idle=60) == 500.0
    assert profile.value_at(0, "power_w", 1, idle=60) == 60.0  # not named for GPU 0: idle
    assert profile.integral(1, "util", 0, 10, idle=0) == 900.0
    assert profile.integral(0, "util", 0, 10, idle=0) == 500.0


def test_a_gpu_not_named_and_no_star_stays_idle() -> None:
    profile = parse_profile(one_phase({"util": 100}, key="0"))
    assert profile.value_at(0, "util", 1, idle=0) == 100.0
    assert profile.value_at(1, "util", 1, idle=0) == 0.0
    assert profile.integral(1, "util", 0, 100, idle=1.5) == 150.0


def test_an_nvml_error_phase_is_a_state_the_stand_in_library_reads() -> None:
    """`nvml_error: true` (issue 20's soak: NVML errors for minutes on one GPU) goes to the
    stand-in library with the phase, for the GPU it names only; anything but a boolean is
    refused."""
    failing = {"*": {"util": 50}, "1": {"nvml_error": True}}
    profile = parse_profile({"phases": [{"seconds": 10, "gpus": {"*": {"util": 50}}},
                                        {"seconds": 60, "gpus": failing}]})
    assert [p.get("nvml_error") for p in profile.resolve(1)] == [None, True]
    assert [p.get("nvml_error") for p in profile.resolve(0)] == [None, None]
    assert profile.event_at(1, "nvml_error", 30.0) is True
    with pytest.raises(ProfileError, match=r"GPU '\*': nvml_error: must be a true: while the phase runs"):
        parse_profile(one_phase({"nvml_error": "yes"}))
