"""config.py: the example file an admin copies stays true to the code."""

from __future__ import annotations

import re
from pathlib import Path

from slurm_gpu_eff.config import _KEYS, Config, load_config


def test_the_example_config_names_every_setting_with_its_default() -> None:
    """etc/gpueff.conf.example is what an admin copies: every key there, as the default."""
    example = Path(__file__).resolve().parents[2] / "etc" / "gpueff.conf.example"
    text = example.read_text()
    loaded, defaults = load_config(str(example)), Config()
    assert {k: v for k, v in vars(loaded).items() if k != "path"} == {
        k: v for k, v in vars(defaults).items() if k != "path"}
    written = set(re.findall(r"^#? ?\[(\w+)\]", text, re.M))
    for section, key, _, _ in _KEYS:
        if section != "sim":
            assert section in written and re.search(rf"^#? ?{key} =", text, re.M), f"[{section}] {key}"
