"""A job's GPU figures in Slurm's own accounting, its AdminComment: the users' read path.

Users read their jobs' figures through `sacct`, so Slurm's own rules say who may see
them (PrivateData, account coordinators, operators): nothing of ours decides, so nothing
of ours can get it wrong (docs/security.md). Only root and SlurmUser can write an
AdminComment, so no user can forge figures there.

The text is one line: readable words for people and for sites' own tools, then the
figures `gpueff JOBID` builds its report from, compressed and base32-encoded (Slurm
22.05's sacctmgr lowercases what it stores; base32 decodes either case):

    gpueff1 status=complete nodes=2 gpus=4 util=41.3 gpu_util=90.1,75.0,0.2,0.0 idle=2
            mem_peak=62.5 energy_kwh=1.234 alloc_gpus=4 figures=EJZW...

util is the job's utilisation weighted by each GPU's sampled time; gpu_util each GPU's
(node order, then minor); idle the GPUs under IDLE_UTIL; mem_peak the highest peak memory
in % of its device; alloc_gpus and alloc_mem (bytes; only where known) what Slurm
allocated; '-' where not measured. The figures
are `digest()` of the node summaries: the report reads that same digest from the store, so
users and admins see the same report.

The field is shared with a site's own text (an admin's notes, another tool's summary): our
part is one run of words in the form above, appended at the field's end and replaced as a
whole; everything else in the field is kept as it is, before and after it. Text in our
form that we did not write (a site tool that copies a job's user-chosen comment into the
field) must not pass for our figures: a part is trusted only when it is the field's one
part in our form, so a copy beside ours makes the field say nothing (the writer removes
such copies when it next writes; docs/security.md says what this leaves open).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import zlib
from typing import Any

from .errors import GpuEffError
from .model import COMPLETE, IDLE_UTIL, MISSING, RUNNING, GpuSummary, NodeSummary

PREFIX = "gpueff1"
# slurmdbd keeps AdminComment in a MariaDB `text` (65,535 bytes): leave room for a site's
# own words. A larger job's figures lose their timelines first, then stay in the store.
MAX_CHARS = 60_000
TIMELINE_POINTS = 120  # the digest's timeline: enough for the hints that read its shape
STATS = ("mean", "max")  # what the report reads of each metric


class MirrorError(GpuEffError):
    """An AdminComment that says it holds our figures but cannot be read back."""


def digest(summaries: list[NodeSummary]) -> list[NodeSummary]:
    """What the report needs of each node summary, small enough for an AdminComment:
    each metric's mean and max, the timeline in at most TIMELINE_POINTS buckets."""
    out = []
    for summary in summaries:
        small = copy.deepcopy(summary)
        for g in small.gpus:
            g.metrics = {name: {k: v for k, v in stats.items() if k in STATS}
                         for name, stats in g.metrics.items()}
            g.timeline = _coarser(g.timeline, TIMELINE_POINTS)
            g.errors, g.xid_events = g.errors[:10], g.xid_events[:10]
        out.append(small)
    return out


def admin_comment(summaries: list[NodeSummary], alloc_gpus: int | None = None,
                  max_chars: int = MAX_CHARS, earlier: list[NodeSummary] | None = None,
                  alloc_mem: int | None = None) -> str:
    """The line for one run of a job, from its node summaries; `earlier`: those of the
    job's earlier runs (a requeue), carried in the figures so the report can name them.
    `alloc_gpus`, `alloc_mem` (bytes): Slurm's allocation (AllocTRES), which sacct gives
    only at the cost of a second slurmdbd round trip, so the report reads it here."""
    words = _words(summaries, alloc_gpus, alloc_mem)
    small = digest(summaries + (earlier or []))
    for keep_timeline in (True, False):
        if not keep_timeline:
            for s in small:
                for g in s.gpus:
                    g.timeline = None
        line = f"{words} figures={_encode([s.to_dict() for s in small])}"
        if len(line) <= max_chars:
            return line
    return words  # too many GPUs for the AdminComment: the store keeps them


def parse_admin_comment(text: str) -> dict[str, str] | None:
    """The words of our part of a comment field (as Slurm gives it back: either case, with a
    site's own text around it), or None when it holds none we can trust."""
    ours = our_part(text)
    if ours is None:
        return None
    return dict(w.split("=", 1) for w in ours.lower().split()[1:])


def figures(text: str) -> list[NodeSummary] | None:
    """The node summaries (as digest() made them) in a comment field; None when it holds
    none (no part of ours, or a job too large for them); MirrorError when unreadable."""
    words = parse_admin_comment(text)
    if words is None or "figures" not in words:
        return None
    encoded = words["figures"].upper()
    try:
        raw = zlib.decompress(b32decode(encoded))
        return [NodeSummary.from_dict(d) for d in json.loads(raw)]
    except (binascii.Error, zlib.error, ValueError, TypeError, AttributeError, RecursionError,
            GpuEffError) as exc:  # RecursionError: JSON nested past the decoder
        raise MirrorError(f"the GPU figures in the job's AdminComment are unreadable ({exc})") from exc


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648's base 32 digits, in their order
_B32_AS_INT = str.maketrans(_B32, "0123456789abcdefghijklmnopqrstuv")  # int()'s base 32 digits
_B32_DROP = str.maketrans("", "", _B32)


def b32decode(encoded: str) -> bytes:
    """base64.b32decode(encoded, padded as needed), at C speed: the standard library's
    decodes eight characters at a time in Python (5 ms for a full comment field, after
    sacct's answer). RFC 4648's digits are int()'s base 32 in another alphabet, which int()
    reads in linear time. Anything else (another character, a length no padding makes
    whole, nothing at all) goes to base64.b32decode, which says what is wrong as ever."""
    n = len(encoded)
    if not n or n % 8 in (1, 3, 6) or encoded.translate(_B32_DROP):
        return base64.b32decode(encoded + "=" * (-n % 8))
    size = n * 5 // 8  # the whole bytes in n digits; the bits left over are dropped, as there
    return (int(encoded.translate(_B32_AS_INT), 32) >> (n * 5 - size * 8)).to_bytes(size, "big")


def our_part(text: str) -> str | None:
    """Our part of the field as it stands, or None: none there, or more than one (a copy of
    our form that someone else put there: which one is ours cannot be told, so neither is
    trusted)."""
    spans = _parts(text)
    return text[spans[0][0]:spans[0][1]] if len(spans) == 1 else None


def imitated(text: str) -> bool:
    """Whether the field holds more than one part in our form (see our_part)."""
    return len(_parts(text)) > 1


def site_text(current: str) -> str:
    """The field without any part in our form: what is the site's, kept as it is."""
    pieces, at = [], 0
    for start, end in _parts(current):
        pieces.append(current[at:start])
        at = end
    pieces.append(current[at:])
    return " ".join(p.strip() for p in pieces if p.strip())


def with_site_text(current: str, line: str) -> str:
    """The field to write: the site's text as it stands now, and our part (`line`) at its
    end in place of the old one (and of any copy of our form)."""
    site = site_text(current)
    return f"{site} {line}" if site else line


def with_note(current: str, note: str) -> str:
    """The field with `note` added as a site's text, just before our part (which the next
    mirror keeps it before), unless it is there already."""
    if note.lower() in current.lower():
        return current
    spans = _parts(current)
    at = spans[-1][0] if spans else len(current)
    return " ".join(part for part in (current[:at].strip(), note, current[at:].strip()) if part)


# Our form: the marker, then these words in this order (each at most once, status first),
# lowercase (Slurm 22.05's sacctmgr lowercases the field; the figures are base32).
KEYS = ("status", "nodes", "gpus", "util", "gpu_util", "idle", "mem_peak", "energy_kwh",
        "alloc_gpus", "alloc_mem", "figures")
_VALUES = {"status": re.compile(r"[a-z]+"), "figures": re.compile(r"[a-z2-7]+")}
_NUMBERS = re.compile(r"[0-9.,-]+")
_WORD = re.compile(r"\S+")


def _parts(text: str) -> list[tuple[int, int]]:
    """Where each part in our form starts and ends in `text`: the marker as a word of its
    own, `status=...`, then as many of our words, in our order, as follow."""
    tokens = [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]
    spans = []
    for i, (start, _, word) in enumerate(tokens):
        if word != PREFIX:
            continue
        end, key_at = start, 0
        for _, token_end, token in tokens[i + 1:]:
            key_at = _next_word(token, key_at)
            if key_at < 0:
                break
            end = token_end
        if end > start:  # at least status=: "see gpueff1 docs" is not a part
            spans.append((start, end))
    return spans


def _next_word(token: str, after: int) -> int:
    """The position in KEYS just after `token` when it is one of our words that may come
    after KEYS[:after] (status only first); -1 when it is not."""
    key, sep, value = token.partition("=")
    if not sep or key not in KEYS[after:] or (after == 0 and key != "status"):
        return -1
    return KEYS.index(key) + 1 if _VALUES.get(key, _NUMBERS).fullmatch(value) else -1


def _words(summaries: list[NodeSummary], alloc_gpus: int | None, alloc_mem: int | None = None) -> str:
    gpus = [g for s in sorted(summaries, key=lambda s: s.node)
            for g in sorted(s.gpus, key=lambda g: (g.minor or 0, g.mig_gi_id or 0))]
    utils = [_own(g, "util", "own_util") for g in gpus]
    weights = [(u, g.sampled_s) for u, g in zip(utils, gpus, strict=True) if u is not None and g.sampled_s]
    seconds = sum(w for _, w in weights)
    peaks = [100 * m / g.memory_total_bytes for g in gpus
             if (m := _own(g, "mem_used_bytes", "own_mem_used_bytes", "max")) is not None
             and g.memory_total_bytes]
    energy = [g.energy_j for g in gpus if g.energy_j is not None]
    words = {
        "status": _status(summaries), "nodes": str(len(summaries)), "gpus": str(len(gpus)),
        "util": _num(sum(u * w for u, w in weights) / seconds if seconds else None),
        "gpu_util": ",".join(_num(u) for u in utils) or "-",
        "idle": str(sum(1 for u in utils if u is not None and u < IDLE_UTIL)),
        "mem_peak": _num(max(peaks) if peaks else None),
        "energy_kwh": _num(sum(energy) / 3.6e6 if energy else None, 3),
        "alloc_gpus": "-" if alloc_gpus is None else str(alloc_gpus),
    }
    if alloc_mem is not None:  # (lines written before it was added have none)
        words["alloc_mem"] = str(alloc_mem)
    return " ".join([PREFIX, *(f"{k}={v}" for k, v in words.items())])


def _encode(data: Any) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.b32encode(zlib.compress(raw, 9)).decode().rstrip("=")


def _coarser(timeline: dict[str, Any] | None, most: int) -> dict[str, Any] | None:
    """Neighbouring buckets merged until at most `most` are left: means of the mean
    fields, the highest memory."""
    if not isinstance(timeline, dict) or len(timeline.get("points") or []) <= most:
        return timeline
    points, fields = timeline["points"], list(timeline.get("fields") or [])
    step = -(-len(points) // most)
    merged = []
    for i in range(0, len(points), step):
        group = points[i:i + step]
        row: list[float | None] = []
        for slot, name in enumerate(fields):
            values = [p[slot] for p in group if slot < len(p) and p[slot] is not None]
            if not values:
                row.append(None)
            elif name.startswith("mem"):
                row.append(max(values))
            else:
                row.append(round(sum(values) / len(values), 1))
        merged.append(row)
    return {**timeline, "bucket_s": float(timeline.get("bucket_s") or 0.0) * step, "points": merged}


def _own(g: GpuSummary, metric: str, own: str, stat: str = "mean") -> float | None:
    """What the job is charged with: its own processes' share on a GPU shared with others,
    where NVML could attribute it (as the report does)."""
    mine = g.metric(own, stat)
    return mine if g.shared_s and mine is not None else g.metric(metric, stat)


def _status(summaries: list[NodeSummary]) -> str:
    statuses = {s.status for s in summaries}
    if RUNNING in statuses:
        return RUNNING
    return COMPLETE if statuses == {COMPLETE} else MISSING if statuses == {MISSING} else "partial"


def _num(value: float | None, places: int = 1) -> str:
    return "-" if value is None else f"{value:.{places}f}"
