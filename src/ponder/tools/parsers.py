"""Turn a model's action text into tool calls or a final answer, and format what comes back.

A parser owns one action format end to end: what the model writes (`parse`), where
generation stops (`stop_strings`) and the text appended after the action
(`format_results`, `format_error`). Parsers never raise on model output: anything
malformed becomes `ParseResult.error`, a one-line message the model can read and
correct on its next turn. That holds for any text (tests/fuzz checks it): JSON nested
too deep for the decoder, integers too long to convert and lone surrogates are
errors or replaced characters, and every scan is linear in the text's length.

Formats:
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen, Hermes).
- "react": `Thought: ...` / `Action: tool` / `Action Input: {json}` or `Final Answer: ...`.
- "search_r1": `<think>`, `<search>query</search>`, `<answer>text</answer>` (Search-R1).

Tool output is data (ponder.tools.safety.escape): every result is escaped so it cannot
forge a tag of any protocol or a chat special token, and Hermes and ReAct results open
with a line naming the tool they came from. Search-R1 results are not given that line:
its result tag already names the one tool, and its trained checkpoints expect the
paper's layout. `escape=False, mark_source=False` restores the verbatim text, for
measuring the undefended baseline only.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ponder.registry import Registry
from ponder.tools.limits import check_json_value, encodable
from ponder.tools.safety.escape import REACT_KEYWORDS, render_result_text
from ponder.types import ToolCall, ToolResult, ToolSpec

_DECODER = json.JSONDecoder()


def _decode_json(text: str, start: int = 0) -> tuple[Any, int, str | None]:
    """(value, end, None) for the JSON value starting at `start`, or (None, position, why).

    Never raises: besides JSONDecodeError, the decoder raises RecursionError on deep
    nesting and ValueError on integers past Python's digit limit. Decoded values pass
    `check_json_value` (bounded depth, encodable strings)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        return None, exc.pos, exc.msg
    except RecursionError:
        return None, start, "nested too deeply"
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        return None, start, str(exc).split(":")[0]
    value, why = check_json_value(value)
    return (None, start, why) if why is not None else (value, end, None)


def _loads(text: str) -> tuple[Any, str | None]:
    """json.loads that never raises: (value, None) or (None, why)."""
    text = text.strip()
    value, end, why = _decode_json(text)
    if why is None and end != len(text):
        return None, "Extra data"
    return value, why


@dataclass
class ParseResult:
    """What one action asked for: tool calls, a final answer, or a parse error."""

    calls: list[ToolCall]
    answer: str | None = None
    error: str | None = None
    thought: str | None = None


class Parser(Protocol):
    name: str
    stop_strings: list[str]

    def parse(self, text: str) -> ParseResult: ...

    def format_results(self, results: list[ToolResult]) -> str: ...

    def format_error(self, error: str) -> str: ...


def _result_text(result: ToolResult, parser: Any, keywords: Iterable[str] = ()) -> str:
    """A result's content as data: escaped, marked with its source when the parser marks,
    and prefixed `error: ` so the model can tell a failed call from its output."""
    return render_result_text(result.content, result.is_error, result.name, parser.protocol_tags, keywords,
                              parser.escape, parser.mark_source)  # fmt: skip


_JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type: the model wrote JSON, not Python."""
    return _JSON_TYPE_NAMES.get(type(value), "null" if value is None else type(value).__name__)


def _skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or several per action.

    Text without a tool call is the final answer, minus any `<think>` block. Hermes
    models may emit several calls before ending the turn, so there are no stop
    strings: the turn ends at the model's end-of-turn token. A single malformed
    block fails the whole action, so the model never sees half its action run.
    "parameters" is accepted in place of "arguments" (Llama 3.1 writes it).
    """

    name = "hermes"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"
    _EXAMPLE = '<tool_call>{"name": "tool_name", "arguments": {...}}</tool_call>'
    protocol_tags = ("tool_call", "tool_response")

    def __init__(self, escape: bool = True, mark_source: bool = True) -> None:
        self.stop_strings: list[str] = []
        self.escape, self.mark_source = escape, mark_source

    def parse(self, text: str) -> ParseResult:
        thought, body, error = _split_think(text)
        if error is not None:
            return ParseResult([], error=error, thought=thought)
        first = body.find(self._OPEN)
        if first == -1:
            return self._answer(body, thought)
        calls: list[ToolCall] = []
        pos = first
        while pos != -1:
            call, end, error = self._read_call(body, pos)
            if error is not None:
                return ParseResult([], error=error, thought=thought)
            calls.append(call)
            pos = body.find(self._OPEN, end)
        return ParseResult(calls, thought=thought or body[:first].strip() or None)

    def _answer(self, body: str, thought: str | None) -> ParseResult:
        """Text without a tool call: the final answer, unless it is empty or a half-written call."""
        if self._CLOSE in body:
            error = f"found {self._CLOSE} without an opening {self._OPEN}; write {self._EXAMPLE}"
            return ParseResult([], error=error, thought=thought)
        answer = body.strip()
        if not answer:
            error = f"empty response; call a tool with {self._EXAMPLE} or answer in plain text"
            return ParseResult([], error=error, thought=thought)
        return ParseResult([], answer=answer, thought=thought)

    def _read_call(self, body: str, pos: int) -> tuple[ToolCall | None, int, str | None]:
        """The call in the block opening at `pos`, the index after its close tag, or an error."""
        json_start = _skip_whitespace(body, pos + len(self._OPEN))
        unclosed = f"unclosed {self._OPEN} (generation cut off?); write {self._EXAMPLE}"
        obj, json_end, why = _decode_json(body, json_start)
        if why is not None:
            if self._CLOSE not in body[json_start:]:
                return None, 0, unclosed
            where = f"{why} at char {json_end - json_start}"
            return None, 0, f"invalid JSON in {self._OPEN}: {where}; write {self._EXAMPLE}"
        close_at = _skip_whitespace(body, json_end)
        if not body.startswith(self._CLOSE, close_at):
            if self._CLOSE not in body[json_end:]:
                return None, 0, unclosed
            return None, 0, f"unexpected text after the JSON object in {self._OPEN}; write {self._EXAMPLE}"
        end = close_at + len(self._CLOSE)
        call, error = self._call_from_json(obj, body[pos:end])
        return call, end, error

    def _call_from_json(self, obj: Any, raw: str) -> tuple[ToolCall | None, str | None]:
        if not isinstance(obj, dict):
            return None, f"{self._OPEN} must hold a JSON object, got {_json_type_name(obj)}; write {self._EXAMPLE}"
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, f'missing "name" in {self._OPEN}; write {self._EXAMPLE}'
        arguments = obj.get("arguments", obj.get("parameters"))
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            arguments, why = _loads(arguments) if arguments.strip() else ({}, None)
            if why is not None:
                return None, f"arguments of '{name}' are a string that is not valid JSON: {why}; give a JSON object"
        if not isinstance(arguments, dict):
            return None, f"arguments of '{name}' must be a JSON object, got {_json_type_name(arguments)}"
        return ToolCall(name=name.strip(), arguments=arguments, raw=encodable(raw)), None

    def format_results(self, results: list[ToolResult]) -> str:
        return "\n".join(f"<tool_response>\n{_result_text(r, self)}\n</tool_response>" for r in results)

    def format_error(self, error: str) -> str:
        return f"<tool_response>\nerror: {error}\n</tool_response>"


def _split_think(text: str) -> tuple[str | None, str, str | None]:
    """(thought, rest of the text, error) around a leading `<think>…</think>` block.

    A lone `</think>` counts too: chat templates that open the think block in the
    prompt leave only its end in the generated text.
    """
    close = text.find("</think>")
    if close == -1:
        if "<think>" in text:
            return None, text, "unclosed <think> (generation cut off?); close your reasoning with </think>"
        return None, text, None
    inner = text[:close]
    opened = inner.find("<think>")
    thought = (inner[opened + len("<think>") :] if opened != -1 else inner).strip()
    return thought or None, text[close + len("</think>") :], None


class ReActParser:
    """`Thought: …` then `Action: tool` + `Action Input: {json}`, or `Final Answer: …`.

    Generation stops at "\\nObservation:"; `parse` accepts text with or without it.
    An Action Input that is not a JSON object is a bare string. The parser maps it
    to the tool's single parameter when it was given that tool's spec (`specs`),
    and otherwise keeps it as {"input": "..."}, which the registry then checks.
    """

    name = "react"
    _ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(.*)$", re.MULTILINE)
    _INPUT = re.compile(r"^[ \t]*Action[ \t]*Input[ \t]*:", re.MULTILINE)
    _FINAL = re.compile(r"Final[ \t]*Answer[ \t]*:")
    _THOUGHT = re.compile(r"^[ \t]*Thought[ \t]*:", re.MULTILINE)
    _EXAMPLE = 'Action: tool_name\nAction Input: {"argument": "value"}'
    protocol_tags: tuple[str, ...] = ()

    def __init__(self, specs: Iterable[ToolSpec] = (), escape: bool = True, mark_source: bool = True) -> None:
        self.stop_strings: list[str] = ["\nObservation:"]
        self.escape, self.mark_source = escape, mark_source
        self._single_parameter: dict[str, str] = {}
        for spec in specs:
            properties = list(spec.parameters.get("properties", {}))
            if len(properties) == 1:
                self._single_parameter[spec.name] = properties[0]

    def parse(self, text: str) -> ParseResult:
        body = text.split("\nObservation:", 1)[0]
        final, action = self._FINAL.search(body), self._ACTION.search(body)
        if final and action:
            return ParseResult([], error="found both an Action and a Final Answer; give one of them per turn")
        if final:
            answer = body[final.end() :].strip()
            if not answer:
                return ParseResult([], error="empty Final Answer; write Final Answer: <your answer>")
            return ParseResult([], answer=answer, thought=self._thought(body[: final.start()]))
        if action:
            call, error = self._read_action(body, action)
            thought = self._thought(body[: action.start()])
            return ParseResult([call] if call else [], error=error, thought=thought)
        error = f"no 'Action:' or 'Final Answer:' found; write {self._EXAMPLE} or Final Answer: <answer>"
        return ParseResult([], error=error)

    def _read_action(self, body: str, action: re.Match[str]) -> tuple[ToolCall | None, str | None]:
        name = action.group(1).strip().strip("`'\"").strip()
        if not name:
            return None, f"empty Action; write {self._EXAMPLE}"
        given = self._INPUT.search(body, action.end())
        if given is None:
            return None, f"Action '{name}' has no 'Action Input:' line; write {self._EXAMPLE}"
        arguments, error = self._arguments(name, _strip_code_fence(body[given.end() :].strip()))
        if error is not None:
            return None, error
        raw = encodable(body[action.start() :].strip())
        return ToolCall(name=encodable(name), arguments=arguments, raw=raw), None

    def _arguments(self, name: str, given: str) -> tuple[dict[str, Any], str | None]:
        if not given:
            example = '{"query": "..."}'
            return {}, f"empty Action Input for '{name}'; give its arguments as a JSON object, e.g. {example}"
        if given.startswith("{"):
            arguments, end, why = _decode_json(given)
            if why is not None:
                return {}, f"invalid JSON in Action Input: {why} at char {end}; give a JSON object"
            if given[end:].strip():
                return {}, "unexpected text after the Action Input JSON object; end the action there"
            return arguments, None
        if given.startswith('"'):
            quoted, why = _loads(given)
            # A stray leading quote (not one JSON string): keep the text as the model wrote it.
            given = quoted if why is None and isinstance(quoted, str) else given
        return {self._single_parameter.get(name, "input"): encodable(given)}, None

    def _thought(self, before: str) -> str | None:
        label = self._THOUGHT.search(before)
        thought = before[label.end() :] if label else before
        return thought.strip() or None

    def format_results(self, results: list[ToolResult]) -> str:
        return "\nObservation: " + "\n".join(_result_text(r, self, REACT_KEYWORDS) for r in results) + "\n"

    def format_error(self, error: str) -> str:
        return f"\nObservation: error: {error}\n"


def _strip_code_fence(text: str) -> str:
    """```json\\n{...}\\n``` → {...}: instruction-tuned models often fence JSON."""
    if not text.startswith("```"):
        return text
    inner = text[3:]
    inner = inner.split("\n", 1)[1] if "\n" in inner else ""
    return inner.rsplit("```", 1)[0].strip()


class SearchR1Parser:
    """Search-R1 tags: `<think>…</think>`, `<search>query</search>`, `<answer>…</answer>`.

    The last `<search>` or `<answer>` tag in the text is the action (the Search-R1
    convention); generation stops right after either closing tag. A search
    becomes ToolCall(tool_name, {argument: query}).

    Other tag environments reuse it: `call_tag` renames the tool's tag (None: only
    `<answer>` is an action), `result_tag` the tag results come back in, and `how`
    the hint that follows an error (e.g. math's `<calculator>` and `<result>`).
    """

    name = "search_r1"

    def __init__(
        self, tool_name: str = "search", argument: str = "query", call_tag: str | None = "search",
        result_tag: str = "information", how: str | None = None, escape: bool = True, mark_source: bool = False,
    ) -> None:  # fmt: skip
        tags = [call_tag, "answer"] if call_tag else ["answer"]
        self.protocol_tags = (*tags, result_tag)
        self.escape, self.mark_source = escape, mark_source
        self.stop_strings: list[str] = [f"</{tag}>" for tag in tags]
        self.tool_name = tool_name
        self.argument = argument
        self.result_tag = result_tag
        self._tag = re.compile(rf"<({'|'.join(tags)})>")
        self._tags_named = " or ".join(f"<{tag}>" for tag in tags)
        call_how = f"{call_tag} with <{call_tag}>{argument}</{call_tag}> or " if call_tag else ""
        self._how = how or f"{call_how}answer with <answer>text</answer>"

    def parse(self, text: str) -> ParseResult:
        thoughts = [t.strip() for t in _think_blocks(text) if t.strip()]
        thought = "\n".join(thoughts) or None
        tags = list(self._tag.finditer(text))
        if not tags:
            return ParseResult([], error=f"no {self._tags_named} tag found; {self._how}", thought=thought)
        last = tags[-1]
        kind = last.group(1)
        close = text.find(f"</{kind}>", last.end())
        if close == -1:
            error = f"unclosed <{kind}> (generation cut off?); {self._how}"
            return ParseResult([], error=error, thought=thought)
        content = text[last.end() : close].strip()
        if not content:
            return ParseResult([], error=f"empty <{kind}>; {self._how}", thought=thought)
        if kind == "answer":
            return ParseResult([], answer=content, thought=thought)
        raw = text[last.start() : close + len(f"</{kind}>")]
        arguments = {self.argument: encodable(content)}
        call = ToolCall(name=self.tool_name, arguments=arguments, raw=encodable(raw))
        return ParseResult([call], thought=thought)

    def format_results(self, results: list[ToolResult]) -> str:
        # Search-R1 strips the retrieved text before wrapping it; keep its exact layout.
        inner = "\n".join(_result_text(dataclasses.replace(r, content=r.content.strip()), self) for r in results)
        return f"\n\n<{self.result_tag}>{inner}</{self.result_tag}>\n\n"

    def format_error(self, error: str) -> str:
        return f"\n\n<{self.result_tag}>error: {error}</{self.result_tag}>\n\n"


def _think_blocks(text: str) -> list[str]:
    """What every closed `<think>…</think>` holds, in order. A linear scan: the regex
    `<think>(.*?)</think>` restarts at every unclosed `<think>` (13 s on 140 kB of them)."""
    blocks: list[str] = []
    pos = 0
    while (start := text.find("<think>", pos)) != -1:
        end = text.find("</think>", start + len("<think>"))
        if end == -1:
            break
        blocks.append(text[start + len("<think>") : end])
        pos = end + len("</think>")
    return blocks


PARSERS: Registry[type] = Registry("parser")
for _parser in (HermesParser, ReActParser, SearchR1Parser):
    PARSERS.add(_parser.name, _parser)
del _parser


def get_parser(name: str, **options: Any) -> Parser:
    """A parser by name; `options` go to its constructor (e.g. ReAct's `specs`)."""
    return PARSERS.get(name)(**options)
