"""Geometry of the usage page's charts (templates/usage.html.j2): positions, ticks and short
labels for the template to draw as inline SVG. Standard library only, and nothing of the
package: it sees lists of plain dicts (the report's `util_buckets`, `days`, `users`,
`trend`) and returns plain numbers and strings; escaping is the template's job.

Every chart says `empty` when it has nothing to draw, so that the page says so instead of
drawing axes around nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Efficiency bands, as the page colours them (table cells, points, bars).
POOR, FAIR = 30.0, 60.0
COLOURS = {"good": "#2e8540", "fair": "#d98c00", "poor": "#c62828", "none": "#8a8f98"}
ALLOCATED, USED, WASTED, UNMEASURED = "#c9d6e8", "#2f6db3", "#e57373", "#d5d9df"
# 0-10% ... 90-100%: from red (GPUs held idle) to green (GPUs busy)
BUCKET_COLOURS = ("#c62828", "#d84315", "#ef6c00", "#f9a825", "#fbc02d",
                  "#c0ca33", "#7cb342", "#43a047", "#2e8540", "#1b5e20")

Chart = dict[str, Any]


def band(pct: float | None) -> str:
    """The efficiency band of a percentage: good, fair, poor, or none (not measured)."""
    if pct is None:
        return "none"
    return "poor" if pct < POOR else "fair" if pct < FAIR else "good"


def colour(pct: float | None) -> str:
    return COLOURS[band(pct)]


def clamp(value: float | None, low: float = 0.0, high: float = 100.0) -> float:
    """A percentage for a CSS width or a bar: 0 for None, within [low, high]."""
    return 0.0 if value is None else max(low, min(high, float(value)))


def short(value: float | None) -> str:
    """A figure for an axis or a bar's end: 0, 0.25, 3.5, 42, 1.2k, 3.4M."""
    if value is None:
        return "-"
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e4:
        return f"{value / 1e3:.3g}k"
    if size >= 100 or value == int(value):
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 times a power of ten) up to at least `top`."""
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _frame(width: int, height: int, left: int, right: int, top: int, bottom: int) -> Chart:
    return {"width": width, "height": height, "x0": left, "x1": width - right, "y0": top,
            "y1": height - bottom, "w": width - left - right, "h": height - top - bottom}


def _y_ticks(frame: Chart, ticks: list[float], suffix: str = "") -> list[dict[str, Any]]:
    top = ticks[-1] or 1.0
    return [{"y": round(frame["y1"] - t / top * frame["h"], 1), "label": short(t) + suffix} for t in ticks]


def buckets(items: Sequence[dict[str, Any]], width: int = 560, height: int = 260) -> Chart:
    """GPU-hours per utilisation bucket (`util_buckets`): one bar each, red to green."""
    chart = _frame(width, height, 52, 12, 22, 40)
    values = [_num(b.get("gpu_hours")) for b in items]
    total = sum(values)
    chart["empty"] = total <= 0
    ticks = nice_ticks(max(values, default=0.0))
    chart["ticks"] = _y_ticks(chart, ticks)
    slot = chart["w"] / max(1, len(values))
    bars = []
    for i, (item, value) in enumerate(zip(items, values, strict=True)):
        h = value / ticks[-1] * chart["h"]
        bars.append({
            "x": round(chart["x0"] + i * slot + slot * 0.12, 1), "w": round(slot * 0.76, 1),
            "y": round(chart["y1"] - h, 1), "h": round(h, 1), "cx": round(chart["x0"] + (i + 0.5) * slot, 1),
            "label": str(item.get("bucket", "")), "value": short(value) if value else "",
            "share": f"{100 * value / total:.0f}%" if total else "",
            "colour": BUCKET_COLOURS[min(i, len(BUCKET_COLOURS) - 1)],
        })
    chart["bars"] = bars
    return chart


def over_time(days: Sequence[dict[str, Any]], width: int = 560, height: int = 260, key: str = "day") -> Chart:
    """Allocated GPU-hours per day as light bars, the used part of each as a dark bar inside."""
    chart = _frame(width, height, 52, 12, 22, 40)
    rows = sorted(days, key=lambda g: str(g.get(key) or ""))
    allocated = [_num(g.get("gpu_hours_allocated")) for g in rows]
    used = [_num(g.get("gpu_hours_used")) for g in rows]
    chart["empty"] = not rows or max(allocated + used, default=0.0) <= 0
    ticks = nice_ticks(max(allocated + used, default=0.0))
    chart["ticks"] = _y_ticks(chart, ticks)
    slot = chart["w"] / max(1, len(rows))
    every = max(1, math.ceil(len(rows) / 8))  # at most about 8 dates under the axis
    bars = []
    for i, g in enumerate(rows):
        a_h = allocated[i] / ticks[-1] * chart["h"]
        u_h = used[i] / ticks[-1] * chart["h"]
        when = str(g.get(key) or "-")
        bars.append({
            "x": round(chart["x0"] + i * slot + slot * 0.1, 1), "w": round(max(1.0, slot * 0.8), 1),
            "cx": round(chart["x0"] + (i + 0.5) * slot, 1),
            "a_y": round(chart["y1"] - a_h, 1), "a_h": round(a_h, 1),
            "u_y": round(chart["y1"] - u_h, 1), "u_h": round(u_h, 1),
            "when": when, "label": (when[5:] if len(when) == 10 else when) if i % every == 0 else "",
            "allocated": short(allocated[i]), "used": short(used[i]),
            "efficiency": g.get("efficiency_pct"),
        })
    chart["bars"] = bars
    return chart


def users(items: Sequence[dict[str, Any]], width: int = 560, height: int = 300, labelled: int = 15) -> Chart:
    """Each user a point: allocated GPU-hours across (a log scale when they span more than
    two decades), efficiency up; the largest `labelled` users named. Users with no
    efficiency (nothing measured) are listed in `unmeasured`, not drawn."""
    chart = _frame(width, height, 52, 16, 14, 40)
    drawn = [u for u in items
             if u.get("efficiency_pct") is not None and _num(u.get("gpu_hours_allocated")) > 0]
    chart["unmeasured"] = [str(u.get("user")) for u in items if u not in drawn]
    chart["empty"] = not drawn
    hours = [_num(u.get("gpu_hours_allocated")) for u in drawn]
    low, high = min(hours, default=1.0), max(hours, default=1.0)
    chart["log"] = log = high / low > 100
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        last = max(last, first + 1)
        span = last - first

        def x_of(v: float) -> float:
            return chart["x0"] + (math.log10(v) - first) / span * chart["w"]

        chart["x_ticks"] = [{"x": round(x_of(10.0 ** p), 1), "label": short(10.0 ** p)}
                            for p in range(first, last + 1)]
    else:
        ticks = nice_ticks(high)

        def x_of(v: float) -> float:
            return chart["x0"] + v / ticks[-1] * chart["w"]

        chart["x_ticks"] = [{"x": round(x_of(t), 1), "label": short(t)} for t in ticks]
    chart["ticks"] = _y_ticks(chart, [0.0, 25.0, 50.0, 75.0, 100.0], "%")
    chart["poor_y"] = round(chart["y1"] - POOR / 100 * chart["h"], 1)
    biggest = sorted(range(len(drawn)), key=lambda i: -hours[i])[:labelled]
    points: list[dict[str, Any]] = []
    taken: list[tuple[float, float, float]] = []  # label boxes placed so far: (x0, x1, y)
    for i in sorted(range(len(drawn)), key=lambda i: hours[i]):  # the big ones drawn last, on top
        u = drawn[i]
        eff = clamp(u.get("efficiency_pct"), 0.0, 100.0)
        cx, cy = round(x_of(hours[i]), 1), round(chart["y1"] - eff / 100 * chart["h"], 1)
        name = str(u.get("user"))
        point = {"cx": cx, "cy": cy, "r": 4 if i not in biggest else 5.5, "colour": colour(eff),
                 "user": name, "hours": short(hours[i]), "efficiency": f"{eff:.1f}%", "label": ""}
        if i in biggest:
            text = name if len(name) <= 16 else name[:15] + "\u2026"
            span_w = 6.5 * len(text)
            right = cx + 8 + span_w <= chart["x1"]
            lx0 = cx + 8 if right else cx - 8 - span_w
            ly = cy + 4
            for _ in range(6):  # step down past labels already placed there
                if not any(a < lx0 + span_w and lx0 < b and abs(y - ly) < 12 for a, b, y in taken):
                    break
                ly += 12 if ly + 12 <= chart["y1"] else -24
            taken.append((lx0, lx0 + span_w, ly))
            point.update(label=text, lx=round(cx + 8 if right else cx - 8, 1), ly=round(ly, 1),
                         anchor="start" if right else "end")
        points.append(point)
    chart["points"] = points
    return chart


def sparkline(weeks: Sequence[dict[str, Any]], width: int = 240, height: int = 90) -> Chart:
    """A user's efficiency per week, 0-100%: points joined where measured, a gap where not;
    each point's size follows its GPU-hours."""
    chart = _frame(width, height, 38, 8, 8, 20)
    n = len(weeks)
    step = chart["w"] / max(1, n - 1) if n > 1 else 0.0
    biggest = max((_num(w.get("gpu_hours_allocated")) for w in weeks), default=0.0) or 1.0
    points: list[dict[str, Any]] = []
    segments: list[str] = []
    run: list[str] = []
    for i, w in enumerate(weeks):
        x = round(chart["x0"] + (i * step if n > 1 else chart["w"] / 2), 1)
        eff = w.get("efficiency_pct")
        if eff is None:
            if len(run) > 1:
                segments.append(" ".join(run))
            run = []
            points.append({"x": x, "y": None, "week": str(w.get("week")), "efficiency": "-",
                           "jobs": w.get("jobs"), "hours": short(_num(w.get("gpu_hours_allocated")))})
            continue
        y = round(chart["y1"] - clamp(eff) / 100 * chart["h"], 1)
        run.append(f"{x},{y}")
        hours = _num(w.get("gpu_hours_allocated"))
        points.append({"x": x, "y": y, "r": round(2.5 + 3.5 * math.sqrt(hours / biggest), 1),
                       "colour": colour(eff), "week": str(w.get("week")), "efficiency": f"{eff:.0f}%",
                       "jobs": w.get("jobs"), "hours": short(hours)})
    if len(run) > 1:
        segments.append(" ".join(run))
    chart.update(points=points, segments=segments, empty=not any(p["y"] is not None for p in points),
                 ticks=_y_ticks(chart, [0.0, 50.0, 100.0], "%"),
                 first=str(weeks[0].get("week")) if weeks else "",
                 last=str(weeks[-1].get("week")) if weeks else "")
    return chart


def ranked(groups: Sequence[dict[str, Any]], keys: Sequence[str], width: int = 560, limit: int = 12) -> Chart:
    """The groups with the most allocated GPU-hours, one stacked bar each: used, wasted
    (measured, not used) and without figures (allocated, not measured)."""
    rows = sorted(groups, key=lambda g: -_num(g.get("gpu_hours_allocated")))
    shown = [g for g in rows if _num(g.get("gpu_hours_allocated")) > 0][:limit]
    row_h = 22
    chart = _frame(width, 30 + row_h * max(1, len(shown)) + 44, 140, 48, 8, 44)
    chart.update(empty=not shown, more=len(rows) - len(shown), row_h=row_h)
    ticks = nice_ticks(max((_num(g.get("gpu_hours_allocated")) for g in shown), default=0.0))
    scale = chart["w"] / ticks[-1]
    chart["x_ticks"] = [{"x": round(chart["x0"] + t * scale, 1), "label": short(t)} for t in ticks]
    bars = []
    for i, g in enumerate(shown):
        allocated = _num(g.get("gpu_hours_allocated"))
        used = _num(g.get("gpu_hours_used"))
        measured = _num(g.get("gpu_hours_measured")) or used + _num(g.get("gpu_hours_wasted"))
        wasted = max(0.0, measured - used)
        unmeasured = max(0.0, allocated - used - wasted)
        name = " / ".join(str(g.get(k) if g.get(k) is not None else "-") for k in keys) or "all"
        y = chart["y0"] + i * row_h
        parts, x = [], float(chart["x0"])
        for part, value, fill in (("used", used, USED), ("wasted", wasted, WASTED),
                                  ("without figures", unmeasured, UNMEASURED)):
            w = value * scale
            if w > 0:
                parts.append({"x": round(x, 1), "w": round(w, 1), "fill": fill, "part": part,
                              "value": short(value)})
            x += w
        bars.append({"y": y + 3, "h": row_h - 6, "ty": y + row_h / 2 + 4, "end": round(x + 5, 1),
                     "parts": parts, "name": name if len(name) <= 18 else name[:17] + "\u2026", "full": name,
                     "allocated": short(allocated), "efficiency": g.get("efficiency_pct")})
    chart["bars"] = bars
    chart["axis_y"] = chart["y0"] + row_h * len(shown)
    return chart
