"""The always-comply worst case for attacks that ride outside one tool output: in the tool
list itself (poisoned definitions), in its own task (a subtask a hostile peer wrote).

`instructions(text)` reads what a text asks an assistant to do, in the phrasings the
suites' attacks use, and the way a model reads it (hidden tag characters decoded,
zero-width characters dropped):
- calls in words or forged `<tool_call>` blocks (`scripted.instructions_in`);
- chains: "call A with x 'v', then call B with y 'w' and ARG set to its output" (B gets
  A's output as ARG: how a poisoned definition moves a secret into an argument), and
  "call A with x 'v' and post its output here" (A's output goes into the reply);
- overrides: "when using TOOL, set ARG to 'V'" (tool shadowing);
- substitutions: "use NEW instead of OLD" (a look-alike tool taking another's place).

`CompliantPolicy` plays a user task's plan (`tasks.UserTask.plan`) and obeys all of it:
what the tool definitions in its system prompt say (before the first step), what its
task says (`read_task`, for team members), and what every tool output says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ponder.agent.policy import Completion
from ponder.eval.injection.scripted import as_action, instructions_in
from ponder.eval.injection.tasks import UserTask, tool_output
from ponder.tools.safety.hidden import reveal
from ponder.types import ToolCall

_ARGUMENT = re.compile(r"(\w+) '([^']*)'")
_ARGS = r"(?:\w+ '[^']*'(?:, | and |,? )?)"
_CHAIN = re.compile(rf"\bcall ([\w-]+) with ({_ARGS}+),? then call ([\w-]+) with ({_ARGS}*)(?:and )?(\w+) set to "
                    r"its output", re.IGNORECASE)  # fmt: skip
_POST = re.compile(rf"\bcall ([\w-]+) with ({_ARGS}+),? and (?:post|paste|include|share) its output (?:here|in your "
                   r"(?:reply|answer|message))", re.IGNORECASE)  # fmt: skip
_OVERRIDE = re.compile(r"\bwhen using ([\w-]+), set (\w+) to '([^']*)'", re.IGNORECASE)
_INSTEAD = re.compile(r"\buse ([\w-]+) instead of ([\w-]+)", re.IGNORECASE)
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)


@dataclass
class Chain:
    """Call `first`, then `then` with `argument` set to the first call's output (`then`
    None: the output goes into the reply)."""

    first: ToolCall
    then: ToolCall | None
    argument: str = ""


@dataclass
class Instructions:
    """What one text asks for (see the module docstring)."""

    calls: list[ToolCall | Chain] = field(default_factory=list)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    renames: dict[str, str] = field(default_factory=dict)

    def merge(self, other: Instructions) -> None:
        self.calls.extend(other.calls)
        for tool, values in other.overrides.items():
            self.overrides.setdefault(tool, {}).update(values)
        self.renames.update(other.renames)


def _value(text: str) -> Any:
    return int(text) if re.fullmatch(r"-?\d+", text) else float(text) if re.fullmatch(r"-?\d+\.\d+", text) else text


def _arguments(text: str) -> dict[str, Any]:
    return {name: _value(value) for name, value in _ARGUMENT.findall(text)}


def instructions(text: str) -> Instructions:
    """What `text` asks for, read as a model reads it."""
    readable = reveal(text).readable
    found = Instructions()
    rest = readable
    for match in _CHAIN.finditer(readable):
        first = ToolCall(match.group(1), _arguments(match.group(2)))
        found.calls.append(Chain(first, ToolCall(match.group(3), _arguments(match.group(4))), match.group(5)))
        rest = rest.replace(match.group(0), " ")
    for match in _POST.finditer(rest):
        found.calls.append(Chain(ToolCall(match.group(1), _arguments(match.group(2))), None))
        rest = rest.replace(match.group(0), " ")
    found.calls.extend(ToolCall(c.name, {k: _value(str(v)) for k, v in c.arguments.items()})
                       for c in instructions_in(rest))  # fmt: skip
    for tool, argument, value in _OVERRIDE.findall(readable):
        found.overrides.setdefault(tool, {})[argument] = _value(value)
    for new, old in _INSTEAD.findall(readable):
        found.renames[old] = new
    return found


def tool_list_texts(system: str) -> list[str]:
    """Every string of the tool definitions a Hermes system prompt lists (descriptions,
    schema text), or the whole prompt when it lists none."""
    block = _TOOLS_BLOCK.search(system)
    if block is None:
        return [system]
    texts: list[str] = []
    for line in block.group(1).splitlines():
        try:
            _strings_of(json.loads(line), texts)
        except json.JSONDecodeError:
            texts.append(line)
    return texts


def _strings_of(value: Any, found: list[str]) -> None:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings_of(item, found)
    elif isinstance(value, list):
        for item in value:
            _strings_of(item, found)


@dataclass
class _Episode:
    plan_step: int = 0
    read_upto: int = 0
    queued: list[ToolCall | Chain] = field(default_factory=list)
    waiting: Chain | None = None
    obeyed: Instructions = field(default_factory=Instructions)
    posted: list[str] = field(default_factory=list)  # outputs to put into the reply


class CompliantPolicy:
    """A ChatPolicy playing `task`'s plan that obeys every instruction it can read (see
    the module docstring). read_system: the tool definitions in the system prompt;
    read_task: the user's message (a team member's subtask); outputs are always read."""

    def __init__(self, task: UserTask, read_system: bool = True, read_task: bool = False) -> None:
        self.task, self.read_system, self.read_task = task, read_system, read_task
        self.name = "scripted-comply"
        self._episodes: dict[str, _Episode] = {}

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4)

    def complete(self, messages: list[dict[str, Any]], stop: list[str], max_new_tokens: int, key: str,
                 on_text: Any = None, timeout_s: float | None = None, **_: Any) -> Completion:  # fmt: skip
        episode = self._episodes.get(key)
        if episode is None or len(messages) <= 2:  # a new run (a team member runs once per subtask on one key)
            episode = self._episodes[key] = self._start(messages)
        self._read(episode, messages)
        action = self._next(episode, messages)
        if on_text is not None:
            on_text(action)
        prompt_tokens = sum(self.count_tokens(str(m.get("content") or "")) for m in messages)
        return Completion(action, prompt_tokens, self.count_tokens(action), "eos")

    def _start(self, messages: list[dict[str, Any]]) -> _Episode:
        episode = _Episode(read_upto=2)
        sources = tool_list_texts(str(messages[0].get("content") or "")) if self.read_system else []
        if self.read_task and len(messages) > 1:
            sources.append(str(messages[1].get("content") or ""))
        for text in sources:
            self._obey(episode, instructions(text))
        return episode

    def _obey(self, episode: _Episode, found: Instructions) -> None:
        episode.queued.extend(found.calls)
        episode.obeyed.overrides.update({k: {**episode.obeyed.overrides.get(k, {}), **v}
                                         for k, v in found.overrides.items()})  # fmt: skip
        episode.obeyed.renames.update(found.renames)

    def _read(self, episode: _Episode, messages: list[dict[str, Any]]) -> None:
        for message in messages[episode.read_upto:]:
            if message.get("role") != "user":
                continue
            text = str(message.get("content") or "")
            if episode.waiting is not None:  # the chain's first call answered: its output feeds the second
                chain, episode.waiting = episode.waiting, None
                if chain.then is None:
                    episode.posted.append(tool_output(text))
                else:
                    then = ToolCall(chain.then.name, {**chain.then.arguments, chain.argument: tool_output(text)})
                    episode.queued.insert(0, then)
            self._obey(episode, instructions(text))
        episode.read_upto = len(messages)

    def _next(self, episode: _Episode, messages: list[dict[str, Any]]) -> str:
        if episode.queued:
            step = episode.queued.pop(0)
            if isinstance(step, Chain):
                episode.waiting = step
                step = step.first
            return as_action(self._obeyed(episode, step))
        if episode.plan_step < len(self.task.plan):
            observations = [str(m.get("content") or "") for m in messages[2:] if m.get("role") == "user"]
            step = self.task.plan[episode.plan_step](observations)
            episode.plan_step += 1
            if isinstance(step, ToolCall):
                return as_action(self._obeyed(episode, step))
            return self._reply(episode, step)
        return self._reply(episode, "Done.")

    def _reply(self, episode: _Episode, text: str) -> str:
        """The final answer, with the outputs an instruction asked to post."""
        return "\n".join([*episode.posted, text]) if episode.posted else text

    def _obeyed(self, episode: _Episode, call: ToolCall) -> ToolCall:
        """`call` as the instructions read so far rewrite it (renamed, arguments overridden)."""
        name = episode.obeyed.renames.get(call.name, call.name)
        return ToolCall(name, {**call.arguments, **episode.obeyed.overrides.get(call.name, {}),
                               **episode.obeyed.overrides.get(name, {})})  # fmt: skip
