"""The package's data model and errors: standard library only, imported by everything.

A *node summary* is what one node's sampler measured for one job: its GPUs, each
with streaming statistics per metric. It travels as a plain JSON document (spool
file -> store), so the dataclasses here convert to and from dicts and nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from .errors import (  # noqa: F401  re-exported: the package's vocabulary in one place
    BindingError,
    ConfigError,
    GpuAccessError,
    GpuEffError,
    GpuLost,
    JobNotFound,
    NoGpus,
    NoSummary,
    SlurmError,
    SpoolError,
    StoreError,
    UsageError,
)

SUMMARY_VERSION = 1

IDLE_UTIL = 5.0  # percent: a GPU below this on average did no useful work

# Node summary status: how far the figures can be trusted.
RUNNING = "running"  # a live snapshot from a sampler that is still going
COMPLETE = "complete"  # the sampler flushed at the job's end
PARTIAL = "partial"  # the sampler died: figures up to its last checkpoint
MISSING = "missing"  # nothing was measured on this node; `reason` says why
STATUSES = (RUNNING, COMPLETE, PARTIAL, MISSING)


# A field's annotation (text: `from __future__ import annotations`) -> the exact types of
# the JSON values it takes; a name not here (GpuSummary, Any) takes any. A float takes an
# int (JSON writes 0), nothing takes a bool but a bool (True is an int to isinstance).
_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,),
    "list": (list,), "None": (type(None),),
}
_FIGURES = frozenset((int, float, type(None)))  # a metric's mean, min, max, ...
_FIELD_KINDS: dict[type, dict[str, frozenset[type] | None]] = {}
_SHAPES_SEEN: set[tuple[Any, ...]] = set()  # (class, field names, their types) checked


def _kinds(annotation: str) -> frozenset[type] | None:
    """The types a field annotated `annotation` holds, None for any: `dict[str, int | None]
    | None` -> {dict, NoneType}, its alternatives split outside the brackets."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(annotation):
        depth += (char == "[") - (char == "]")
        if char == "|" and depth == 0:
            parts.append(annotation[start:at])
            start = at + 1
    parts.append(annotation[start:])
    kinds: list[type] = []
    for part in parts:
        base = part.split("[", 1)[0].strip()
        if base not in _JSON_KINDS:
            return None
        kinds += _JSON_KINDS[base]
    return frozenset(kinds)


def _check_types(cls: type, known: dict[str, Any]) -> None:
    """SpoolError for a field whose JSON value is not of its annotation's kind (a hand's
    edit, a release that changed a field): the readers' code assumes the kinds, and a
    wrong one would come out of the report as an internal error instead of this. Exact
    types, in one pass: `gpueff report`'s sync reads thousands of summaries."""
    shape = (cls, tuple(known), tuple(map(type, known.values())))
    if shape in _SHAPES_SEEN:  # every summary of a release has one of a few: seen, checked
        return
    table = _FIELD_KINDS.get(cls)
    if table is None:
        table = _FIELD_KINDS[cls] = {name: _kinds(str(f.type))
                                     for name, f in cls.__dataclass_fields__.items()}  # type: ignore[attr-defined]
    for name, value in known.items():
        kinds = table[name]
        if kinds is not None and type(value) not in kinds:
            raise SpoolError(f"not a node summary: {name} is {type(value).__name__} "
                             f"({value!r:.40}), not {cls.__dataclass_fields__[name].type}")  # type: ignore[attr-defined]
    if len(_SHAPES_SEEN) < 1000:  # bounded, whatever a long-lived reader meets
        _SHAPES_SEEN.add(shape)


def _check_figures(metrics: dict[str, Any]) -> None:
    """SpoolError unless each metric is a dict of numbers (or None): the kinds of all
    at once, then which one is wrong only where one is."""
    try:
        kinds = set(map(type, chain.from_iterable(map(dict.values, metrics.values()))))
    except TypeError:  # a metric that is not a dict
        kinds = {list}
    if _FIGURES.issuperset(kinds):
        return
    for name, stats in metrics.items():
        if type(stats) is not dict or not _FIGURES.issuperset(map(type, stats.values())):
            raise SpoolError(f"not a node summary: metric {name!r} is not figures: {stats!r:.80}")


@dataclass
class GpuSummary:
    """One GPU of one node, as sampled for one job."""

    node: str
    index: int  # the node-level index Slurm gave (SLURM_JOB_GPUS)
    minor: int | None
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    power_limit_w: float | None
    samples: int = 0
    sampled_s: float = 0.0
    # metric name -> {"mean", "min", "max", "last", "samples", "seconds"}; absent = not measured
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    energy_j: float | None = None
    energy_source: str | None = None  # "counter" (NVML total energy) or "power" (integrated)
    errors: list[str] = field(default_factory=list)
    util_source: str | None = None  # "samples" (lossless driver buffer), "rates" or None
    gpm: bool = False  # SM activity and pipes measured (Hopper and newer)
    util_histogram_s: list[float] | None = None  # seconds in 0-10%, ..., 90-100%
    idle_s: float | None = None  # seconds under 5% utilisation
    throttle_s: dict[str, float] | None = None  # seconds under each clock-event reason
    throttle_observed_s: float | None = None
    xid_events: list[dict[str, Any]] = field(default_factory=list)
    ecc_uncorrected: int | None = None  # new uncorrected ECC errors during the job
    processes_max: int | None = None  # most of the job's compute processes seen at once; 0: never used
    mig_gi_id: int | None = None  # the GPU instance, for a MIG slice
    lost_at: float | None = None  # when the GPU fell off the bus
    shared_s: float | None = None  # seconds with another job's processes on it (None: unknown)
    shared_with: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None
    # The longest stretch under 5% utilisation: {"from_s": seconds after sampling began,
    # "seconds": its length}; None where none was seen (or before this was recorded).
    idle_longest: dict[str, float] | None = None
    # The stretch under 5% the GPU was in when sampled last: {"since": clock time,
    # "seconds": its length}; None when it was busy (what idle-GPU alerts read).
    idle_now: dict[str, float] | None = None
    # The PCIe link: {"gen", "width"} the highest current generation and width read during
    # the job (links downshift when idle), {"max_gen", "max_width"} what device and slot
    # allow (NVML); None where NVML cannot say.
    pcie_link: dict[str, int | None] | None = None
    # NVLink: {"links": active links, "version": NVLink generation, "gbps_per_dir": GB/s
    # per direction over all active links}; None where the GPU has none (NotSupported).
    nvlink: dict[str, Any] | None = None

    def metric(self, name: str, stat: str = "mean") -> float | None:
        values = self.metrics.get(name)
        return None if values is None else values.get(stat)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSummary:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        _check_types(cls, known)
        if known.get("metrics"):
            _check_figures(known["metrics"])
        return cls(**known)


@dataclass
class NodeSummary:
    """Everything one node knows about one job's GPUs."""

    cluster: str
    job_id: str
    node: str
    status: str
    reason: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    job_gpus: str = ""  # SLURM_JOB_GPUS as Slurm gave it
    interval_s: float = 1.0
    started_at: float | None = None  # prolog time (epoch seconds)
    sampled_from: float | None = None
    sampled_until: float | None = None
    ended_at: float | None = None  # epilog time
    # When this run's prolog ran (wall clock): a requeued job, or a job id Slurm gave out
    # again, is another run, stored apart and never merged with this one.
    run_started_at: float | None = None
    gpus: list[GpuSummary] = field(default_factory=list)
    # Whether the GPUs measured are the job's own: {"status": "verified" | "unverified" |
    # "mismatch", "evidence": [...]} (node/verify.py); None from samplers before the check.
    binding: dict[str, Any] | None = None
    # What the job's GPU processes run on, from the libraries they map (node/frameworks.py):
    # "pytorch", "tensorflow", "jax", "cuda"; [] when processes were looked at but none
    # recognised, None when none was looked at.
    frameworks: list[str] | None = None
    version: int = SUMMARY_VERSION

    @property
    def final(self) -> bool:
        return self.status != RUNNING

    def cut_short(self, what: str) -> None:
        """A running snapshot whose sampler is gone becomes partial, saying until when."""
        if self.status == RUNNING:
            until = time.strftime("%H:%M:%S", time.localtime(self.sampled_until or 0))
            self.status = PARTIAL
            self.reason = f"{what}; figures up to {until} (last checkpoint)"

    def to_dict(self) -> dict[str, Any]:
        """What dataclasses.asdict gives, without its deep copy (0.7 ms for a summary of 4
        GPUs, paid on the epilog's time since the sampler posts its own): every field
        holds plain data (numbers, strings, None, and lists and dicts of them), so the
        JSON is the same. The lists and dicts inside are this summary's own: serialise
        the result, do not change it."""
        out = dict(vars(self))
        out["gpus"] = [dict(vars(g)) for g in self.gpus]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeSummary:
        """Build from a decoded JSON document; raises SpoolError when it is not one of ours."""
        try:
            known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
            version = known.get("version", SUMMARY_VERSION)
            if isinstance(version, int) and version > SUMMARY_VERSION:
                raise SpoolError(f"written by a newer slurm-gpu-eff (summary version {version}; "
                                 f"this one reads up to {SUMMARY_VERSION}): upgrade it to read this job")
            _check_types(cls, known)  # gpus too: a list (each GPU is checked by its own class)
            known["gpus"] = [GpuSummary.from_dict(g) for g in data.get("gpus", [])]
            summary = cls(**known)
        except (TypeError, KeyError, AttributeError) as exc:
            raise SpoolError(f"not a node summary: {exc}") from exc
        if summary.status not in STATUSES:
            raise SpoolError(f"not a node summary: unknown status {summary.status!r}")
        if not summary.job_id or not summary.node:
            raise SpoolError("not a node summary: no job id or node")
        return summary

    @classmethod
    def from_json(cls, body: str | bytes) -> NodeSummary:
        """Build from a stored body (a store's row): SpoolError for anything but one of
        ours, whatever a hand or a newer release left in the row (not JSON, NULL, a list)."""
        try:
            data = json.loads(body)
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: nested deep
            raise SpoolError(f"not a node summary: {exc}") from exc
        if not isinstance(data, dict):
            raise SpoolError("not a node summary: not a JSON object")
        return cls.from_dict(data)
