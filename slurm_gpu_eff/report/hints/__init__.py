"""Tuning hints: what to change in a job, the figures that show it, the GPU-hours it would save.

A rule is plain data (id, thresholds, the metrics it needs, why) plus one check function
of ours. A site's `[hints]` config section can disable rules, change thresholds, replace
a rule's wording and add a link; nothing from it is ever evaluated as code (a message
template only names evidence figures, filled in by `render_message`). A rule never
speaks from a metric that was not measured: `evaluate` shows each rule only the GPUs on
which every metric it needs was measured, and no GPU at all means no hint.

The rules live by theme: `gpu_use` (idle and under-used GPUs), `kernels` (what the
kernels did), `memory`, `links` (PCIe, NVLink, nodes), `host` (CPUs, memory, time: the
Slurm side) and `hardware` (the admins'). `core` holds what they share; `settings`,
`judge` and `docs` read the catalogue of them all.

Standard library only; the report's shapes come from `shapes`, so that `job` (which builds
a report and asks this package for its hints) and this package never import each other.
"""

from __future__ import annotations

from ..shapes import Hint
from .catalogue import RULE_BY_ID, RULES
from .core import AUDIENCES, GOOD_UTIL_PCT, SEVERITIES, Rule
from .docs import rules_markdown
from .hardware import APP_XIDS
from .judge import evaluate, verdict
from .settings import HintSettings, render_message

__all__ = [
    "APP_XIDS", "AUDIENCES", "GOOD_UTIL_PCT", "RULES", "RULE_BY_ID", "SEVERITIES", "Hint", "HintSettings",
    "Rule", "evaluate", "render_message", "rules_markdown", "verdict",
]
