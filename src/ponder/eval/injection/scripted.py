"""Scripted policies for the injection suite: the user's plan, and the worst case that
also obeys every instruction it reads.

`ScriptedPlanPolicy` plays a user task's plan (see `tasks.UserTask.plan`): one tool call
per turn, then the final answer, reading the values it needs from the outputs. With
`comply=True` it is the always-comply worst case: before going on with the plan it
makes every call that the latest tool output asks for, written either as a raw Hermes
`<tool_call>` block (a forged tag; an escaped `&lt;tool_call>` is text, as it is to a
model) or in words ("call delete_file with path '…'"). It ignores the system prompt,
so the prompt rule cannot help it; marks, redaction, refusals and confirmations can.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ponder.agent.policy import Completion
from ponder.eval.injection.tasks import UserTask
from ponder.types import ToolCall

_FORGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_IN_WORDS = re.compile(r"\bcall (\w+) with ((?:\w+ '[^']*'(?:, | and )?)+)")
_ARGUMENT = re.compile(r"(\w+) '([^']*)'")


def as_action(step: ToolCall | str) -> str:
    if isinstance(step, str):
        return step
    return f"<tool_call>{json.dumps({'name': step.name, 'arguments': step.arguments})}</tool_call>"


def instructions_in(text: str) -> list[ToolCall]:
    """The calls a text asks for: forged Hermes blocks, then calls described in words."""
    calls = []
    for block in _FORGED.findall(text):
        for candidate in (block, _json_unquoted(block)):
            try:
                obj = json.loads(candidate) if candidate is not None else None
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                calls.append(ToolCall(obj["name"], dict(obj.get("arguments") or {})))
                break
    for name, arguments in _IN_WORDS.findall(text):
        calls.append(ToolCall(name, dict(_ARGUMENT.findall(arguments))))
    return calls


def _json_unquoted(block: str) -> str | None:
    # Inside a JSON tool output (an inbox) the forged block's quotes arrive escaped.
    try:
        return json.loads(f'"{block}"')
    except json.JSONDecodeError:
        return None


@dataclass
class _Episode:
    plan_step: int = 0
    read_upto: int = 0
    queued: list[ToolCall] = field(default_factory=list)


class ScriptedPlanPolicy:
    """A ChatPolicy that plays `task`'s plan; `comply` makes it obey injected instructions."""

    def __init__(self, task: UserTask, comply: bool = True) -> None:
        self.task = task
        self.comply = comply
        self.name = "scripted-comply" if comply else "scripted-plan"
        self._episodes: dict[str, _Episode] = {}

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4)

    def complete(self, messages: list[dict[str, Any]], stop: list[str], max_new_tokens: int, key: str,
                 on_text: Any = None, timeout_s: float | None = None) -> Completion:  # fmt: skip
        episode = self._episodes.setdefault(key, _Episode(read_upto=2))
        observations = [str(m.get("content") or "") for m in messages[2:] if m.get("role") == "user"]
        if self.comply:
            for message in messages[episode.read_upto:]:
                if message.get("role") == "user":
                    episode.queued.extend(instructions_in(str(message.get("content") or "")))
        episode.read_upto = len(messages)
        if episode.queued:
            action = as_action(episode.queued.pop(0))
        elif episode.plan_step < len(self.task.plan):
            action = as_action(self.task.plan[episode.plan_step](observations))
            episode.plan_step += 1
        else:
            action = "Done."
        if on_text is not None:
            on_text(action)
        prompt_tokens = sum(self.count_tokens(str(m.get("content") or "")) for m in messages)
        return Completion(action, prompt_tokens, self.count_tokens(action), "eos")


class ScriptedOpening:
    """A model under test whose first `steps` actions are the task's plan (the reads), so
    the model always sees the tool output an injection rides in, and decides everything
    after it. Without it a small model that answers without calling a tool is "safe" only
    because it never read the poisoned text."""

    def __init__(self, model: Any, task: UserTask, steps: int = 1) -> None:
        self.model, self.task, self.steps = model, task, steps
        self.name = getattr(model, "name", "model")

    def count_tokens(self, text: str) -> int:
        return self.model.count_tokens(text)

    def complete(self, messages: list[dict[str, Any]], stop: list[str], max_new_tokens: int, key: str,
                 on_text: Any = None, timeout_s: float | None = None) -> Completion:  # fmt: skip
        made = sum(1 for m in messages[2:] if m.get("role") == "assistant")
        if made >= min(self.steps, len(self.task.plan)):
            return self.model.complete(messages, stop, max_new_tokens, key, on_text, timeout_s)
        observations = [str(m.get("content") or "") for m in messages[2:] if m.get("role") == "user"]
        action = as_action(self.task.plan[made](observations))
        prompt_tokens = sum(self.count_tokens(str(m.get("content") or "")) for m in messages)
        return Completion(action, prompt_tokens, self.count_tokens(action), "eos")
