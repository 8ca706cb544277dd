"""Slurm's hostlist syntax (gpu[1-3,5], nvidia[0-3]): expanded for the accounting code and
the node's GPU binding alike. Standard library only: the sampler imports it."""

from __future__ import annotations

import re


def expand_hostlist(text: str) -> list[str]:
    """Slurm hostlists ('gpu[1-3,5],r[1-2]n[01-02]') -> names; what it cannot read, it keeps."""
    names: list[str] = []
    for item in _split_top(text or ""):
        names.extend(_expand_one(item))
    return [n for n in names if n and n not in ("None assigned", "(null)")]


def _split_top(text: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    items: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return items + [current]


_BRACKETS = re.compile(r"^([^\[]*)\[([^\]]*)\](.*)$")


def _expand_one(name: str) -> list[str]:
    """Expand the first bracket group, then the rest of the name, recursively."""
    match = _BRACKETS.match(name)
    if not match:
        return [name]
    prefix, body, rest = match.groups()
    heads: list[str] = []
    for part in body.split(","):
        low, _, high = part.partition("-")
        if high and low.isdigit() and high.isdigit():
            heads.extend(f"{i:0{len(low)}d}" for i in range(int(low), int(high) + 1))
        else:
            heads.append(part)
    return [f"{prefix}{head}{tail}" for head in heads for tail in _expand_one(rest)]
