"""OpenAI chat requests in ponder's tool protocol, and the model's text back as OpenAI
messages.

The model sees a request the way ponder's agents see a task (agent/prompt.py,
agent/loop.py): the tools as Hermes JSON in the system prompt with the rule that tool
results are data; an assistant's `tool_calls` as `<tool_call>{json}</tool_call>`
blocks; tool results as one user turn of `<tool_response>` blocks, escaped and marked
with the tool's name by the Hermes parser, so a served model meets the protocol it
was trained in. Its reply goes through the same HermesParser; calls become OpenAI
`tool_calls` (arguments as JSON text, the one place they are text).

What a request promises is sampled, not checked afterwards: a forced tool choice
(`required` or a named function) constrains the reply to Hermes calls of the offered
tools (or the named one) whose arguments match the tool's schema, and `response_format`
to JSON of its schema (ponder.rollout.constrain). `strict: true` tools have their
schemas compiled exactly (a keyword the grammar library lacks is a 400); the others
leniently (such a keyword is ignored), so a small model's arguments validate either way. `read_reply` still reads what came out, and says why a
reply cut short by max_tokens does not meet the request.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from ponder.agent.openai_http import tool_calls_as_hermes
from ponder.agent.prompt import system_prompt
from ponder.rollout.constrain import Constraint, tool_calls
from ponder.serve.errors import bad_request
from ponder.serve.protocol import ChatMessage, ChatRequest, forced_tool
from ponder.tools.parsers import HermesParser
from ponder.types import ToolResult, ToolSpec

TOOL_OPEN = "<tool_call>"
JSON_ONLY = "Reply with one JSON object and nothing else."


@dataclass
class ChatPlan:
    """What to generate for one chat request.

    messages: plain {role, content} messages for the tokenizer's chat template.
    tools: the tools offered (empty: the reply is not read for calls).
    forced: None, `required`, or the one tool's name (tool_choice).
    schema / json_mode: response_format's JSON Schema, or json_object.
    constraint: what the reply is sampled to match (forced calls, response_format; under
        tool_choice auto, a call once the model opens one), or None.
    """

    messages: list[dict[str, str]]
    tools: list[ToolSpec] = field(default_factory=list)
    forced: str | None = None
    schema: dict[str, Any] | None = None
    json_mode: bool = False
    constraint: Constraint | None = None


def plan_chat(request: ChatRequest) -> ChatPlan:
    """The prompt messages, constraint and output checks for `request` (checked by protocol)."""
    offered = [] if request.tool_choice == "none" else [_spec(tool.function) for tool in request.tools or []]
    forced = forced_tool(request) if offered else None
    response_format = request.response_format
    schema = response_format.json_schema.schema_ if response_format and response_format.json_schema else None
    json_mode = bool(response_format and response_format.type in ("json_object", "json_schema"))
    instructions, turns = _render_messages(request.messages)
    if offered or json_mode:
        extra = [JSON_ONLY] if json_mode and schema is None else []
        if forced is not None:
            extra.append("Call a function now." if forced == "required" else f"Call the function {forced} now.")
        text = "\n\n".join(part for part in [instructions, *extra] if part)
        instructions = system_prompt("hermes", offered, instructions=text, answer_schema=schema)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + turns
    constraint = None
    strict = any(tool.function.strict for tool in request.tools or [])
    if forced is not None:
        constraint = tool_calls(offered, None if forced == "required" else forced, strict, request.parallel_tool_calls)
    elif json_mode:
        constraint = Constraint.json_schema(schema if schema is not None else {"type": "object"})
    elif offered:  # tool_choice auto: the model chooses; a call it opens is sampled well-formed
        constraint = tool_calls(offered, None, strict, request.parallel_tool_calls, opened=True)
    return ChatPlan(messages, offered, forced, schema, json_mode, constraint)


def _spec(function: Any) -> ToolSpec:
    parameters = function.parameters if function.parameters is not None else {"type": "object", "properties": {}}
    return ToolSpec(function.name, function.description, parameters)


def _render_messages(messages: list[ChatMessage]) -> tuple[str, list[dict[str, str]]]:
    """(system instructions, the other turns as plain messages). System and developer
    messages join into the one system prompt, where the tools are described too."""
    instructions: list[str] = []
    turns: list[dict[str, str]] = []
    call_names: dict[str, str] = {}  # tool_call_id -> function name, to label results
    results: list[ToolResult] = []
    parser = HermesParser()
    for index, message in enumerate(messages):
        text = _text(message, index)
        if message.role != "tool" and results:
            turns.append({"role": "user", "content": parser.format_results(results)})
            results = []
        if message.role in ("system", "developer"):
            instructions.append(text)
        elif message.role == "assistant":
            calls = [call.model_dump() for call in message.tool_calls or []]
            call_names.update({call["id"]: call["function"]["name"] for call in calls if call["id"]})
            turns.append({"role": "assistant", "content": text + tool_calls_as_hermes(calls)})
        elif message.role == "tool":
            name = call_names.get(message.tool_call_id or "", message.name or "")
            results.append(ToolResult(text, name=name))
        else:
            turns.append({"role": "user", "content": text})
    if results:  # consecutive results of one turn's calls read as one observation, as the agent writes them
        turns.append({"role": "user", "content": parser.format_results(results)})
    return "\n\n".join(i for i in instructions if i), turns


def _text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for part_index, part in enumerate(content):
        if part.type != "text" or part.text is None:
            where = f"messages[{index}].content[{part_index}]"
            raise bad_request(f"{where}: content type {part.type!r} is not supported (text only)", param=where)
        pieces.append(part.text)
    return "".join(pieces)


@dataclass
class ChatReply:
    """The assistant message read from the model's text: content, OpenAI tool_calls,
    and why it does not meet the request's demands (None: it does)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    problem: str | None = None


def read_reply(text: str, plan: ChatPlan) -> ChatReply:
    """The model's full reply text as an assistant message."""
    if plan.tools and TOOL_OPEN in text:
        parsed = HermesParser().parse(text)
        if parsed.calls:
            before = text[: text.find(TOOL_OPEN)].strip()
            calls = [openai_tool_call(call.name, call.arguments) for call in parsed.calls]
            problem = check_forced_calls(calls, plan) if plan.forced else None
            return ChatReply(before or None, calls, problem)
        if plan.forced:
            return ChatReply(text, [], parsed.error or "no tool call")
    if plan.forced:
        return ChatReply(text, [], "no tool call")
    if plan.json_mode:
        return ChatReply(text, [], check_json(text, plan.schema))
    return ChatReply(text, [])


def complete_calls(text: str, plan: ChatPlan) -> tuple[str, ChatReply] | None:
    """A forced reply cut short by max_tokens, read up to its last complete call: (that
    text, its reply) when at least one whole call meets the request, else None. What
    OpenAI returns with finish_reason `length`, minus the call it could not finish."""
    end = text.rfind(CallDeltas.TAIL)
    if not plan.forced or end < 0:
        return None
    kept = text[: end + len(CallDeltas.TAIL)]
    reply = read_reply(kept, plan)
    return (kept, reply) if reply.tool_calls and reply.problem is None else None


def openai_tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def check_forced_calls(calls: list[dict[str, Any]], plan: ChatPlan) -> str | None:
    """Why the calls do not satisfy a forced tool choice: a tool not offered (or not the
    one named), or arguments that fail the tool's parameter schema. None when they do."""
    specs = {spec.name: spec for spec in plan.tools}
    for call in calls:
        name = call["function"]["name"]
        if name not in specs or (plan.forced != "required" and name != plan.forced):
            wanted = "one of " + ", ".join(specs) if plan.forced == "required" else plan.forced
            return f"called {name!r}, not {wanted}"
        problem = schema_problem(json.loads(call["function"]["arguments"]), specs[name].parameters)
        if problem is not None:
            return f"arguments of {name!r}: {problem}"
    return None


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """The most relevant way `value` fails `schema` (one line), or None."""
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message}" + (f" at {where}" if where else "")


def check_json(text: str, schema: dict[str, Any] | None) -> str | None:
    """Why `text` is not the JSON response_format asks for (an object for json_object,
    a value matching `schema` for json_schema), or None."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as err:
        return f"not valid JSON ({str(err).splitlines()[0][:120]})"
    if schema is None:
        return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
    return schema_problem(value, schema)


def holdback_start(text: str, markers: list[str]) -> int:
    """How much of a growing `text` can be streamed now: up to the first marker (a stop
    string, `<tool_call>`) or the start of a tail that could still become one, and never
    a trailing U+FFFD (half of a multi-byte character)."""
    end = len(text.rstrip("\ufffd"))
    for marker in markers:
        found = text.find(marker)
        if found != -1:
            end = min(end, found)
            continue
        for length in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:length]):
                end = min(end, len(text) - length)
                break
    return end


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string (excluded, as OpenAI does) and whether one occurred."""
    starts = [found for s in stops if (found := text.find(s)) != -1]
    return (text[: min(starts)], True) if starts else (text, False)


class CallDeltas:
    """OpenAI's streamed `tool_calls` deltas from the growing text of a forced reply,
    Hermes calls as its constraint writes them (`<tool_call>\\n{"name": "N",
    "arguments": ARGS}\\n</tool_call>`, several joined by a newline): a call's first
    delta carries its id and name, the next ones what has grown of its arguments. The
    last characters are held back until a call is complete (they may be its envelope's
    close, which a JSON string cannot contain: its newline would be escaped). The first
    call streams as it grows; each later one goes out once it is complete, so a reply
    cut by max_tokens streams the same complete calls the whole reply returns."""

    HEAD = TOOL_OPEN + '\n{"name": "'
    MIDDLE = '", "arguments": '
    TAIL = "}\n</tool_call>"

    def __init__(self) -> None:
        self.sent: list[int] = []  # per call: the characters of its arguments sent

    def feed(self, text: str) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        position, index = 0, 0
        while (start := text.find(self.HEAD, position)) >= 0:
            middle = text.find(self.MIDDLE, start + len(self.HEAD))
            if middle < 0 or (index > 0 and text.find(self.TAIL, middle) < 0):
                break
            if index == len(self.sent):
                name = json.loads('"' + text[start + len(self.HEAD) : middle] + '"')
                deltas.append({"index": index, "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                               "function": {"name": name, "arguments": ""}})  # fmt: skip
                self.sent.append(0)
            begin = middle + len(self.MIDDLE)
            end = text.find(self.TAIL, begin)
            arguments = text[begin:end] if end >= 0 else text[begin : max(begin, len(text) - len(self.TAIL))]
            if len(arguments) > self.sent[index]:
                deltas.append({"index": index, "function": {"arguments": arguments[self.sent[index] :]}})
                self.sent[index] = len(arguments)
            if end < 0:
                break
            position, index = end + len(self.TAIL), index + 1
        return deltas
