"""Conversational training records in the shapes TRL users know, and their validation.

SFT rows: `{"messages": [...], "tools": [...]?, "task_type": str?}` where messages
follow the OpenAI / HF chat shape (`role`, `content`, `tool_calls`?, `name`?) and
tools are OpenAI function specs (`{"type": "function", "function": {...}}`) or
bare `{"name", "description", "parameters"}`. Preference rows: `{"prompt",
"chosen", "rejected"}`, each either a list of messages (conversational) or a
string (standard; the prompt becomes one user message, a completion one
assistant message).

Bad rows are skipped and counted by reason (`LoadReport`), never trained on.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

TASK_TYPES = ("tool_selection", "multi_step_planning", "timing_decision", "tool_retrieval")
DEFAULT_TASK_TYPE = "general"
ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """No usable example remains, or a data file cannot be read; one line says which."""


@dataclass
class Conversation:
    """One SFT example: chat messages, the tools it may call, its task type."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    task_type: str = DEFAULT_TASK_TYPE
    id: str = ""

    def to_row(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "tools": self.tools, "task_type": self.task_type}


@dataclass
class PreferencePair:
    """One preference: a prompt (messages) and two assistant continuations."""

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    task_type: str = DEFAULT_TASK_TYPE
    id: str = ""

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id, "prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected,
            "tools": self.tools, "task_type": self.task_type,
        }  # fmt: skip


@dataclass
class LoadReport:
    """How many rows were read, kept, and skipped for which reason."""

    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"read": self.read, "kept": self.kept, "skipped": dict(self.skipped)}


def tool_name(spec: dict[str, Any]) -> str:
    """The name of an OpenAI-style or bare tool spec."""
    return str((spec.get("function") or spec).get("name", ""))


def call_name(call: dict[str, Any]) -> str:
    """The tool name of an OpenAI-style (`function`) or flat tool call."""
    return str((call.get("function") or call).get("name", ""))


def call_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as a dict (JSON strings, as at the OpenAI boundary, are decoded)."""
    arguments = (call.get("function") or call).get("arguments") or {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    return arguments


def check_messages(messages: Any, tools: list[dict[str, Any]]) -> str | None:
    """The reason these messages are unusable for training, or None when they are fine."""
    if not isinstance(messages, list) or not messages:
        return "no messages"
    if any(not isinstance(m, dict) or m.get("role") not in ROLES for m in messages):
        return "unknown role"
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant turn"
    declared = {tool_name(t) for t in tools}
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call_name(call) not in declared:
                return "undeclared tool"
            try:
                call_arguments(call)
            except (json.JSONDecodeError, AttributeError):
                return "bad tool arguments"
    return None


def parse_conversation(row: dict[str, Any], index: int) -> tuple[Conversation | None, str | None]:
    """(conversation, None) or (None, reason to skip)."""
    tools = _parse_tools(row.get("tools"))
    if tools is None:
        return None, "bad tools column"
    if not all(_valid_schema(t) for t in tools):
        return None, "invalid tool schema"  # training on it would teach calls no validator accepts
    messages = _as_messages(row.get("messages"), "user")
    reason = check_messages(messages, tools)
    if reason is not None:
        return None, reason
    task_type = str(row.get("task_type") or DEFAULT_TASK_TYPE)
    return Conversation(messages, tools, task_type, str(row.get("id") or f"row-{index}")), None


def parse_preference(row: dict[str, Any], index: int) -> tuple[PreferencePair | None, str | None]:
    """(pair, None) or (None, reason to skip): a pair needs two different assistant texts."""
    tools = _parse_tools(row.get("tools"))
    if tools is None:
        return None, "bad tools column"
    prompt = _as_messages(row.get("prompt"), "user")
    chosen = _as_messages(row.get("chosen"), "assistant")
    rejected = _as_messages(row.get("rejected"), "assistant")
    if not prompt or not chosen or not rejected:
        return None, "missing prompt, chosen or rejected"
    for side in (chosen, rejected):
        reason = check_messages(prompt + side, tools)
        if reason is not None:
            return None, reason
    if json.dumps(chosen, sort_keys=True) == json.dumps(rejected, sort_keys=True):
        return None, "identical chosen and rejected"
    task_type = str(row.get("task_type") or DEFAULT_TASK_TYPE)
    return PreferencePair(
        prompt, chosen, rejected, tools, task_type, str(row.get("id") or f"row-{index}")
    ), None


def parse_rows(rows: list[dict[str, Any]], kind: str, what: str = "dataset") -> tuple[list[Any], LoadReport]:
    """Parse every row (`kind` = "sft" or "preference"); raise DataError if none is usable."""
    parse = parse_conversation if kind == "sft" else parse_preference
    report = LoadReport(read=len(rows))
    examples = []
    for index, row in enumerate(rows):
        example, reason = parse(row, index) if isinstance(row, dict) else (None, "not a mapping")
        if example is None:
            report.skip(reason or "unusable")
            continue
        examples.append(example)
    report.kept = len(examples)
    if not examples:
        reasons = ", ".join(f"{n} {r}" for r, n in report.skipped.most_common()) or "it is empty"
        raise DataError(f"{what}: no usable {kind} example among {report.read} rows ({reasons})")
    return examples, report


def _parse_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return []
    if isinstance(value, str):  # a JSON column, as some Parquet exports store it
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            return None
    if not isinstance(value, list) or any(not isinstance(t, dict) or not tool_name(t) for t in value):
        return None
    return value


def _valid_schema(spec: dict[str, Any]) -> bool:
    """Whether a tool's `parameters` is a valid JSON Schema (absent counts as valid)."""
    import jsonschema

    parameters = (spec.get("function") or spec).get("parameters")
    if parameters is None:
        return True
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError:
        return False
    return True


def _as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    """Messages as a list of dicts with None fields (Parquet's struct padding) dropped."""
    if isinstance(value, str):
        return [{"role": role, "content": value}] if value else []
    if not isinstance(value, list):
        return []
    return [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in value]
