"""Which tools may be called, with which arguments, and which ones are sensitive.

A `SafetyPolicy` is plain data (loadable from YAML or JSON) checked before every call:
- `allow`: the tools this agent or task may call at all (None: every registered tool);
- per tool (`tools`), a `ToolRule`: `sensitive` (needs the user's confirmation),
  `trusted` (its output is not untrusted text, e.g. a calculator), and argument rules:
  a path that must stay under a folder, a URL whose host must be on a list, a value that
  must match a regex;
- `forbid`: intents (an act on a target) the conversation guard refuses across a
  conversation's user turns (ponder.tools.safety.conversation).
`SafetyPolicy.check(call)` returns one line saying why the call is refused, or None.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ponder.tools.safety.conversation import Intent, intents_from_dict
from ponder.types import ToolCall


@dataclass
class ArgumentRule:
    """What one argument's value must satisfy; unset checks are skipped.

    under: the value is a path that must resolve (symlinks and `..` followed) inside this
        folder; a relative path is taken relative to `base` (default: `under` itself).
    hosts: the value is an http(s) URL whose host is one of these or a subdomain of one.
    pattern: the whole value (as text) must match this regular expression.
    """

    under: str | None = None
    base: str | None = None
    hosts: list[str] | None = None
    pattern: str | None = None

    def violation(self, name: str, value: Any) -> str | None:
        """Why `value` breaks this rule (one line), or None."""
        if self.pattern is not None and not re.fullmatch(self.pattern, str(value)):
            return f"argument '{name}' must match {self.pattern!r}, got {_short(value)}"
        if self.under is not None:
            if not isinstance(value, str) or not value.strip():
                return f"argument '{name}' must be a path under {self.under}"
            root = Path(self.under).resolve()
            resolved = (Path(self.base or self.under) / os.path.expanduser(value)).resolve()
            if resolved != root and root not in resolved.parents:
                return f"path {_short(value)} is outside {self.under}"
        if self.hosts is not None:
            host = _host(value)
            if host is None:
                return f"argument '{name}' must be an http(s) URL, got {_short(value)}"
            if not any(host == allowed.lower() or host.endswith("." + allowed.lower()) for allowed in self.hosts):
                return f"host {host!r} is not allowed (allowed: {', '.join(self.hosts)})"
        return None


@dataclass
class ToolRule:
    """How one tool is treated: see the module docstring."""

    sensitive: bool = False
    trusted: bool = False
    arguments: dict[str, ArgumentRule] = field(default_factory=dict)


@dataclass
class SafetyPolicy:
    """Allow-list, sensitive and trusted tools, and argument rules; see the module docstring."""

    allow: list[str] | None = None
    tools: dict[str, ToolRule] = field(default_factory=dict)
    forbid: list[Intent] = field(default_factory=list)  # the conversation guard's intents

    def rule(self, tool_name: str) -> ToolRule:
        return self.tools.get(tool_name) or ToolRule()

    def is_sensitive(self, tool_name: str) -> bool:
        return self.rule(tool_name).sensitive

    def is_trusted(self, tool_name: str) -> bool:
        return self.rule(tool_name).trusted

    def allows(self, tool_name: str) -> bool:
        return self.allow is None or tool_name in self.allow

    def check(self, call: ToolCall) -> str | None:
        """Why the call is refused (one line), or None when the policy lets it run."""
        if not self.allows(call.name):
            allowed = ", ".join(self.allow or []) or "(none)"
            return f"tool '{call.name}' is not allowed here (allowed: {allowed})"
        for name, argument_rule in self.rule(call.name).arguments.items():
            if name in call.arguments:
                reason = argument_rule.violation(name, call.arguments[name])
                if reason is not None:
                    return f"{call.name}: {reason}"
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SafetyPolicy:
        """From `{"allow": [...], "sensitive": [...], "trusted": [...], "tools": {name:
        {"sensitive", "trusted", "arguments": {arg: {"under" | "base" | "hosts" | "pattern"}}}},
        "forbid": {intent: {"act": [...], "target": [...], "description"}}}` (what the
        conversation guard refuses); ValueError naming the bad key."""
        unknown = set(data) - {"allow", "sensitive", "trusted", "tools", "forbid"}
        if unknown:
            raise ValueError(f"safety policy: unknown key(s) {', '.join(sorted(unknown))}")
        tools: dict[str, ToolRule] = {}
        for name, spec in (data.get("tools") or {}).items():
            spec = dict(spec or {})
            given = spec.pop("arguments", None) or {}
            arguments = {arg: _argument_rule(name, arg, rule) for arg, rule in given.items()}
            bad = set(spec) - {"sensitive", "trusted"}
            if bad:
                raise ValueError(f"safety policy: tools.{name}: unknown key(s) {', '.join(sorted(bad))}")
            tools[name] = ToolRule(bool(spec.get("sensitive")), bool(spec.get("trusted")), arguments)
        for flag in ("sensitive", "trusted"):
            for name in data.get(flag) or []:
                setattr(tools.setdefault(name, ToolRule()), flag, True)
        allow = data.get("allow")
        forbid = data.get("forbid") or {}
        if not isinstance(forbid, dict):
            raise ValueError("safety policy: forbid maps each intent's name to {act: [...], target: [...]}")
        return cls(list(allow) if allow is not None else None, tools, intents_from_dict(forbid))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SafetyPolicy:
        """A policy from a YAML or JSON file."""
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a safety policy must be a mapping")
        try:
            return cls.from_dict(data)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def _argument_rule(tool_name: str, argument: str, spec: Any) -> ArgumentRule:
    if not isinstance(spec, dict) or set(spec) - {"under", "base", "hosts", "pattern"}:
        raise ValueError(f"safety policy: tools.{tool_name}.arguments.{argument} takes under, base, hosts, pattern")
    if spec.get("pattern") is not None:
        re.compile(spec["pattern"])  # a bad regex fails at load time, not at the first call
    return ArgumentRule(**spec)


def _host(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.lower().rstrip(".")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:59] + "…"
