"""A trajectory monitor: flags call sequences that look like a followed injection.

It reads an episode as events, the calls made and the outputs read (the guard records
them; `events_from_turns` rebuilds them from Turn records), and flags:
- `untrusted_echo`: a sensitive call with an identifier argument (a path, address, URL,
  id: a value without spaces) that appears in untrusted output but not in the user's
  request: the target came from a document, not from the user;
- `new_destination_after_injection`: after an output that reads as an injection, a call
  whose URL or e-mail argument comes from such an output and not from the request;
- `off_task_after_injection`: after such an output, a call to a tool outside the task's
  relevant tools (when they are known).
`review` runs over a finished episode; `check_call` asks whether one more call would be
flagged, which is how the guard uses it to block before the call runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ponder.tools.safety.detector import InjectionDetector
from ponder.types import ToolCall, Turn

_DESTINATION = re.compile(r"^(https?://\S+|[^@\s]+@[^@\s]+\.\w+)$", re.IGNORECASE)


@dataclass
class MonitorFlag:
    rule: str
    tool: str
    detail: str
    index: int = -1  # the call's position among the events (-1: a call not yet made)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_event(tool: str, text: str, untrusted: bool, turn: int = 0, injection: bool | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"kind": "read", "tool": tool, "turn": turn, "untrusted": untrusted, "text": text}
    if injection is not None:
        event["injection"] = injection
    return event


def call_event(call: ToolCall, turn: int = 0, outcome: str = "ran") -> dict[str, Any]:
    return {"kind": "call", "tool": call.name, "arguments": dict(call.arguments), "turn": turn, "outcome": outcome}


def events_from_turns(
    turns: Iterable[Turn], is_trusted: Callable[[str], bool] = lambda name: False
) -> list[dict[str, Any]]:
    """The events of a finished episode: each call, then the output it gave (errors are not read)."""
    events = []
    for turn in turns:
        for call, result in zip(turn.tool_calls, turn.tool_results):
            events.append(call_event(call, turn.index))
            if not result.is_error:
                events.append(read_event(call.name, result.content, not is_trusted(call.name), turn.index))
    return events


class TrajectoryMonitor:
    """See the module docstring.

    is_sensitive: which tools are sensitive (the guard passes its policy's view).
    relevant_tools: the tools the task needs; None turns `off_task_after_injection` off.
    min_identifier_chars: shorter values ("a", "42") echo by chance and are not compared.
    """

    def __init__(self, is_sensitive: Callable[[str], bool], detector: InjectionDetector | None = None,
                 relevant_tools: Iterable[str] | None = None, min_identifier_chars: int = 6) -> None:  # fmt: skip
        self.is_sensitive = is_sensitive
        self.detector = detector or InjectionDetector()
        self.relevant_tools = set(relevant_tools) if relevant_tools is not None else None
        self.min_identifier_chars = min_identifier_chars

    def review(self, events: list[dict[str, Any]], task: str) -> list[MonitorFlag]:
        """Every flag in a finished episode, in order."""
        flags: list[MonitorFlag] = []
        for index, event in enumerate(events):
            if event["kind"] == "call":
                call = ToolCall(event["tool"], dict(event.get("arguments") or {}))
                for flag in self.check_call(events[:index], call, task):
                    flag.index = index
                    flags.append(flag)
        return flags

    def check_call(self, events: list[dict[str, Any]], call: ToolCall, task: str) -> list[MonitorFlag]:
        """The flags `call` would raise if it were made after `events`."""
        reads = [event for event in events if event["kind"] == "read"]
        untrusted = [event for event in reads if event.get("untrusted", True)]
        injected = [event for event in reads if self._is_injection(event)]
        flags = []
        for value in self._identifiers(call.arguments):
            if value in task:
                continue
            source = next((event for event in untrusted if value in event.get("text", "")), None)
            if source is not None and self.is_sensitive(call.name):
                flags.append(MonitorFlag("untrusted_echo", call.name,
                                         f"argument value {value!r} comes from {source['tool']}'s output, "
                                         "not from the user's request"))  # fmt: skip
            planted = next((event for event in injected if value in event.get("text", "")), None)
            if planted is not None and _DESTINATION.match(value):
                detail = f"destination {value!r} was named by an injection in {planted['tool']}'s output"
                flags.append(MonitorFlag("new_destination_after_injection", call.name, detail))
        if injected and self.relevant_tools is not None and call.name not in self.relevant_tools:
            flags.append(MonitorFlag("off_task_after_injection", call.name,
                                     f"'{call.name}' is not a tool this task needs, and an earlier output "
                                     f"({injected[-1]['tool']}) read as an injection"))  # fmt: skip
        return flags

    def _is_injection(self, event: dict[str, Any]) -> bool:
        if "injection" not in event:
            event["injection"] = self.detector.scan(event.get("text", "")).flagged
        return bool(event["injection"])

    def _identifiers(self, arguments: Any) -> list[str]:
        """String values without whitespace (paths, addresses, URLs, ids), nested ones too."""
        found: list[str] = []
        if isinstance(arguments, str):
            value = arguments.strip()
            if self.min_identifier_chars <= len(value) <= 300 and not any(c.isspace() for c in value):
                found.append(value)
        elif isinstance(arguments, dict):
            for item in arguments.values():
                found.extend(self._identifiers(item))
        elif isinstance(arguments, list):
            for item in arguments:
                found.extend(self._identifiers(item))
        return found
