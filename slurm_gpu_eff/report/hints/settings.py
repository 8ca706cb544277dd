"""A site's [hints] settings: rules disabled, thresholds, wording and links. Nothing
from the config is ever evaluated as code."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import ConfigError
from ..shapes import Hint
from .catalogue import RULE_BY_ID
from .core import Rule

_FORMAT_SPEC = re.compile(r"[,_]?(\.\d{1,2})?[dfg%]?")


def render_message(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{name}` and `{name:.1f}` from `values`; anything else (unknown names, attribute
    or index access, conversions, nested or wide specs) stays as written. Never evaluates."""
    out = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        raw = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        plain = name.isidentifier() and name in values and not conversion
        if not plain or not _FORMAT_SPEC.fullmatch(spec or ""):
            out.append(raw)
            continue
        try:
            out.append(format(values[name], spec or ""))
        except (TypeError, ValueError):
            out.append(raw)
    return "".join(out)


@dataclass(frozen=True)
class HintSettings:
    """What a site's [hints] section changes; the defaults change nothing."""

    disabled: frozenset[str] = frozenset()
    params: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    messages: Mapping[str, str] = field(default_factory=dict)
    links: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, raw: Mapping[str, str]) -> HintSettings:
        """Parse Config.hints; raises ConfigError naming the key at fault."""
        disabled: set[str] = set()
        params: dict[str, dict[str, float]] = {}
        messages: dict[str, str] = {}
        links: dict[str, str] = {}
        known = ", ".join(RULE_BY_ID)
        for key, text in raw.items():
            key, text = key.strip().lower(), text.strip()
            where = f"[hints] {key}"
            if key == "disable":
                for name in filter(None, re.split(r"[\s,]+", text)):
                    if name not in RULE_BY_ID:
                        raise ConfigError(f"{where}: unknown rule {name!r} (rules: {known})")
                    disabled.add(name)
                continue
            rule_id, dot, attr = key.partition(".")
            if not dot:
                raise ConfigError(f"{where}: unknown setting (expected disable, <rule>.<threshold>, "
                                  "<rule>.message or <rule>.link)")
            rule = RULE_BY_ID.get(rule_id)
            if rule is None:
                raise ConfigError(f"{where}: unknown rule {rule_id!r} (rules: {known})")
            if attr == "message":
                try:
                    list(string.Formatter().parse(text))
                except ValueError as exc:
                    raise ConfigError(f"{where}: not a message template: {exc}") from exc
                if not text:
                    raise ConfigError(f"{where}: empty message")
                messages[rule_id] = text
            elif attr == "link":
                if not re.fullmatch(r"https?://[^\s<>\"']+", text):
                    raise ConfigError(f"{where} = {text!r}: expected an http:// or https:// address")
                links[rule_id] = text
            elif attr in rule.params:
                try:
                    value = float(text)
                except ValueError as exc:
                    raise ConfigError(f"{where} = {text!r} is not a number") from exc
                if not math.isfinite(value) or value < 0:
                    raise ConfigError(f"{where} = {text!r}: expected a finite number >= 0")
                params.setdefault(rule_id, {})[attr] = value
            else:
                raise ConfigError(f"{where}: rule {rule_id} has no setting {attr!r} (it has: "
                                  f"{', '.join([*rule.params, 'message', 'link'])})")
        return cls(frozenset(disabled), params, messages, links)

    def params_for(self, rule: Rule) -> dict[str, float]:
        return {**rule.params, **self.params.get(rule.id, {})}

    def apply(self, hint: Hint) -> Hint:
        """The site's wording and link for a hint of ours."""
        template = self.messages.get(hint.id)
        message = hint.message
        if template is not None:
            message = render_message(template, {**hint.evidence, "savings_gpu_hours": hint.savings_gpu_hours})
        return replace(hint, message=message, link=self.links.get(hint.id, hint.link))
