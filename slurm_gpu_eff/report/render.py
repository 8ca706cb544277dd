"""Rendering: every text a person reads comes from a jinja2 template in templates/."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import time
from typing import Any

import jinja2

from . import charts
from .shapes import GroupReport, JobReport

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 (CSI, NEL...)


def clean(value: Any) -> str:
    """Job names are the user's: no control character (newline, escape) reaches a terminal."""
    return _CONTROL.sub("?", str(value))


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1024**3:.1f}"


def fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def evidence(value: Any) -> str:
    """An evidence figure, compact: lists and nested dicts on one line."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return clean(json.dumps(value, separators=(",", ":")))
    return clean(value)


def size(value: float | None) -> str:
    """Bytes for people: MiB under a GiB, GiB above."""
    if value is None:
        return "n/a"
    if value < 1024**3:
        return f"{value / 1024**2:.1f} MiB"
    return f"{value / 1024**3:.2f} GiB"


def hms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def watts(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} W"


def joules(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 3.6e6:
        return f"{value / 3.6e6:.2f} kWh"
    return f"{value / 1000:.1f} kJ"


def clocktime(ts: float | None) -> str:
    return "n/a" if ts is None else time.strftime("%H:%M:%S", time.localtime(ts))


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
COMPILED = os.path.join(TEMPLATES, "__pycache__")


class _Compiled(jinja2.FileSystemBytecodeCache):
    """Templates compiled once, beside them: compiling the report's template costs more
    than all the rest of `gpueff` (about 50 ms). Written by whoever may write there (root,
    at install: `precompile()`), read by every user; as trusted as the package's own .pyc
    files, in the same root-owned tree. A user who cannot write there compiles in memory."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        name = self._get_cache_filename(bucket)
        part = f"{name}.{os.getpid()}.part"
        try:
            with open(part, "wb") as out:
                os.fchmod(out.fileno(), 0o644)  # every user reads it (jinja2's own: 0600)
                bucket.write_bytecode(out)
            os.replace(part, name)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(part)


def precompile() -> list[str]:
    """Compile every template into the shared cache (run as the package's owner)."""
    os.makedirs(COMPILED, mode=0o755, exist_ok=True)
    env = _new_environment()  # not this process's: each template compiled and written anew
    names = env.list_templates(extensions=["j2"])  # not the compiled cache beside them
    for name in names:
        env.get_template(name)
    return names


def _new_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        bytecode_cache=_Compiled(COMPILED),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        clean=clean, pct=pct, fraction=fraction, gib=gib, size=size, hms=hms, watts=watts,
        joules=joules, clocktime=clocktime, evidence=evidence, aligned=aligned, num=num, amount=amount,
        toml=toml_value,
    )
    env.globals["charts"] = charts
    return env


# One per process: a template, once loaded, is kept (and looked at again on each use: one
# changed on disk is read anew, jinja2's auto_reload).
_environment = functools.cache(_new_environment)


def prepare(as_json: bool = False) -> None:
    """What `gpueff JOBID` will render, loaded now, while sacct answers: the environment and
    the report's templates (from the compiled cache; an array's or a heterogeneous job's
    too, ~1 ms), so that only the rendering is left once the job's figures are in."""
    if not as_json:
        for name in ("report.txt.j2", "group.txt.j2"):
            _environment().get_template(name)


def render_text(report: JobReport | GroupReport) -> str:
    if isinstance(report, GroupReport):
        template = _environment().get_template("group.txt.j2")
        return template.render(g=report, d=report.to_dict())
    template = _environment().get_template("report.txt.j2")
    return template.render(r=report, j=report.job, d=report.to_dict())


def render_mail_html(report: JobReport, charts_by_gpu: list[str | None], footer: str = "",
                     extra: str = "", chart_size: tuple[int, int] = (480, 48)) -> str:
    """The job-end mail's HTML part: charts_by_gpu names each GPU's chart (its Content-ID),
    or None where it has no timeline."""
    tone = "#dc2626" if any(h.severity == "critical" for h in report.hints) else (
        "#d97706" if any(h.severity == "warning" for h in report.hints) else "#16a34a")
    template = _environment().get_template("mail.html.j2")
    return template.render(r=report, j=report.job, d=report.to_dict(), charts_by_gpu=charts_by_gpu,
                           chart_width=chart_size[0], chart_height=chart_size[1], tone=tone,
                           footer=footer, extra=extra)


def render_idle(kind: str, context: dict[str, Any]) -> str:
    """An idle-GPU alert ("alert") or the notice of a job cancelled for it ("cancel")."""
    return _environment().get_template(f"idle_{kind}.txt.j2").render(**context)


def render_config(settings: dict[str, dict[str, Any]], path: str, as_json: bool = False) -> str:
    """`gpueff config`: TOML a site can copy back into its file, or JSON."""
    if as_json:
        return json.dumps({"path": path, "settings": settings}, indent=2) + "\n"
    return _environment().get_template("config.toml.j2").render(settings=settings, path=path)


def render_doctor(result: dict[str, Any], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(result, indent=2) + "\n"
    return _environment().get_template("doctor.txt.j2").render(**result)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # a TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped
    return json.dumps(str(value)).replace("\x7f", "\\u007f")


def render_json(report: JobReport | GroupReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


# -- usage reports (report/usage.py's objects) ----------------------------------------------

# (column, heading, digits) of a usage table, after the grouping keys. Digits: a
# percentage's; an amount's fewest (amount() shows a small one to two significant digits).
USAGE_COLUMNS = (
    ("jobs", "JOBS", 0), ("gpu_hours_allocated", "GPU-H", 1), ("gpu_hours_used", "USED", 1),
    ("efficiency_pct", "EFF%", 1), ("gpu_hours_wasted", "WASTED", 1),
    ("gpu_hours_idle_gpus", "IDLE-GPU-H", 1), ("jobs_with_idle_gpu", "IDLE-JOBS", 0),
    ("sm_efficiency_pct", "SM%", 1), ("mem_peak_median_pct", "MEM-P50%", 0),
    ("mem_peak_p90_pct", "MEM-P90%", 0), ("energy_kwh", "KWH", 1), ("cost", "COST", 2),
    ("co2_kg", "CO2-KG", 1), ("coverage_pct", "COVER%", 1), ("partial_pct", "PART%", 1),
    ("missing_pct", "MISS%", 1),
)


def num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) or digits:
        return f"{value:,.{digits}f}"
    return f"{value:,}"


MOST_DIGITS = 4  # an amount's most decimals: 0.0001 GPU-hours is a GPU for 0.36 s


def amount(value: Any, digits: int = 1) -> str:
    """An amount (GPU-hours, kWh, cost): `digits` decimals, and more where it takes them
    to show two significant digits (0.15, 0.033: a short job's GPU-hours never 0.0 beside
    its efficiency); "<0.0001" below MOST_DIGITS."""
    if not isinstance(value, float) or value == 0 or not math.isfinite(value):
        return num(value, digits)
    shown = max(digits, min(MOST_DIGITS, 1 - math.floor(math.log10(abs(value)))))
    if round(value, shown) == 0:
        return f"{'<' if value > 0 else '>-'}{10.0 ** -MOST_DIGITS:.{MOST_DIGITS}f}"
    return f"{value:,.{shown}f}"


def usage_cell(column: str, value: Any, digits: int) -> str:
    """A usage table's cell: percentages at their digits, amounts as amount() gives them."""
    return num(value, digits) if column.endswith("_pct") else amount(value, digits)


_FIGURE = re.compile(r"^([<>]?-?[\d,]+)(\.\d+)?$")


def aligned(rows: list[list[str]], left: int = 1) -> list[str]:
    """Rows of cells (the first row: headings) as lines of aligned columns: the first
    `left` columns to the left, figures to the right, on their decimal point where a
    column's figures have more or fewer decimals (amount())."""
    if not rows:
        return []
    rows = [rows[0], *_on_the_point(rows[1:], left)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def _on_the_point(rows: list[list[str]], left: int) -> list[list[str]]:
    """Each figure padded on the right to its column's most decimals."""
    if not rows:
        return rows
    out = [list(r) for r in rows]
    for i in range(left, len(rows[0])):
        found = [_FIGURE.match(r[i]) for r in rows]
        most = max((len(m.group(2) or "") for m in found if m), default=0)
        for r, m in zip(out, found, strict=True):
            if m:
                r[i] = r[i].ljust(len(m.group(1)) + most)
    return out


def usage_rows(data: dict[str, Any], groups: list[dict[str, Any]], totals: bool = True) -> list[list[str]]:
    keys = data["by"]
    head = [k.upper().replace("_", "-") for k in keys] + [h for _, h, _ in USAGE_COLUMNS] + ["TOP HINTS"]
    rows = [head]
    for g in ([*groups, {**data["totals"], **{k: "TOTAL" if i == 0 else "" for i, k in enumerate(keys)}}]
              if totals else groups):
        hints = ", ".join(f"{h['rule']} ({h['jobs']})" for h in g["top_hints"])
        rows.append([clean(g.get(k) if g.get(k) is not None else "-") for k in keys]
                    + [usage_cell(c, g[c], d) for c, _, d in USAGE_COLUMNS] + [hints or "-"])
    return rows


def render_usage(data: dict[str, Any], form: str = "text") -> str:
    if form == "json":
        return json.dumps(data, indent=2) + "\n"
    if form == "csv":
        return _usage_csv(data)
    name = "usage.html.j2" if form == "html" else "usage.txt.j2"
    return _environment().get_template(name).render(d=data, rows=usage_rows(data, data["groups"]),
                                                     columns=USAGE_COLUMNS)


def render_mine(data: dict[str, Any], form: str = "text") -> str:
    if form == "json":
        return json.dumps(data, indent=2) + "\n"
    if form == "csv":
        return _csv(["job_id", "name", "state", "start", "gpus", "gpu_hours_allocated", "efficiency_pct",
                     "figures", "verdict", "main_hint"], data["jobs"])
    return _environment().get_template("mine.txt.j2").render(d=data)


def _usage_csv(data: dict[str, Any]) -> str:
    keys = data["by"]
    columns = [*keys, *(c for c, _, _ in USAGE_COLUMNS), "gpu_hours_measured", "sampled_pct", "top_hints"]
    rows = [{**g, "top_hints": ";".join(f"{h['rule']}={h['jobs']}" for h in g["top_hints"])}
            for g in data["groups"]]
    return _csv(columns, rows)


def _csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        # A cell a spreadsheet would run as a formula (a hostile job name) is quoted as text.
        writer.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return round(value, 4)
    text = clean(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") and not _NUMBER.match(text) else text


_NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")
