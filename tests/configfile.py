"""Config files for tests, written as TOML (slurm_gpu_eff/config.py reads them).

`toml({"gpu": {"library": "/x.so"}, "sampler": {"interval_s": 0.2}})` gives
'[gpu]\nlibrary = "/x.so"\n[sampler]\ninterval_s = 0.2\n'; values keep their types
(str quoted, int/float bare, bool true/false, lists as TOML arrays).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_gpu_eff.report.render import toml_value


def value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    return toml_value(v)  # what `gpueff config` writes: the same TOML


def toml(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value(v)}" for key, v in keys.items()]
    return "\n".join(lines) + "\n"


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    path.write_text(toml(sections), encoding="utf-8")
    return path
