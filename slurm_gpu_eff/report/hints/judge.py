"""Judging a job: every enabled rule's hints, and the one-line verdict."""

from __future__ import annotations

from dataclasses import replace

from ..shapes import Hint, JobReport
from .catalogue import RULES
from .core import GOOD_UTIL_PCT, RANK, lost, mean
from .settings import HintSettings

GATE = "too_early"  # its hint, when given, is the user's only one (host.py)


def evaluate(report: JobReport, settings: HintSettings | None = None) -> list[Hint]:
    """Every enabled rule's hints for the job: critical first, then by GPU-hours saved."""
    settings = settings or HintSettings()
    found: list[tuple[int, Hint]] = []
    for order, rule in enumerate(RULES):
        if rule.id in settings.disabled:
            continue
        gpus = [g for g in report.gpus if all(g.metric(name) is not None for name in rule.needs)]
        if rule.needs and not gpus:
            continue
        view = report if len(gpus) == len(report.gpus) else replace(report, gpus=gpus)
        found.extend((order, settings.apply(h)) for h in rule.check(view, settings.params_for(rule)))
    if any(h.id == GATE for _, h in found):  # a failed or just-started run: no judgement of the user
        found = [(order, h) for order, h in found if h.id == GATE or h.audience != "user"]
    found.sort(key=lambda item: (RANK[item[1].severity], item[1].savings_gpu_hours is None,
                                 -(item[1].savings_gpu_hours or 0.0), item[0]))
    return [hint for _, hint in found]


def verdict(report: JobReport, hints: list[Hint]) -> str:
    """One line a new user understands, from the user's hints only (hardware is the site's)."""
    user = sorted((h for h in hints if h.audience == "user"), key=lambda h: RANK[h.severity])
    admin = [h for h in hints if h.audience != "user"]
    so_far = " so far" if report.job.running else ""
    serious = [h for h in user if h.severity != "info"]
    gate = next((h for h in user if h.id == GATE), None)
    if gate is not None:
        text = f"No verdict{so_far}: {gate.message}"
    elif serious:
        label = "Poor" if serious[0].severity == "critical" else "Needs attention"
        head = serious[0].message.split(": ", 1)[0].rstrip(".")
        more = len(serious) - 1
        more_text = f" (and {more} more finding{'s' if more > 1 else ''})" if more else ""
        text = f"{label}{so_far}: {head}{more_text}; see the hints below."
    else:
        utils = [g.util_mean for g in report.gpus if g.util_mean is not None and not lost(g)]
        util = mean(utils) if utils else None
        if util is None and not any(g.summary is not None and g.summary.samples for g in report.gpus):
            # no sampler figures at all (its prolog did not run, the spool was lost): no verdict
            text = f"No verdict{so_far}: the GPU figures are missing (see the notes)."
        elif util is None:
            text = (f"No problems found{so_far}; GPU utilisation was not measured on these GPUs "
                    "(MIG slices do not report it).")
        else:
            # Below the bar of a well-used GPU, no rule fired, but "Good" would overstate it.
            label = "Good" if util >= GOOD_UTIL_PCT else "Fair"
            text = f"{label}{so_far}: the GPUs were busy {util:.0f}% of the time."
        if user:
            text += f" {len(user)} suggestion{'s' if len(user) > 1 else ''} below."
    if admin:
        nodes = ", ".join(sorted({str(h.evidence.get("node", "?")) for h in admin}))
        text += (f" A hardware problem on {nodes} was flagged for the admins; it does not count "
                 "against this job.")
    return text
