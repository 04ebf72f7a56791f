"""Every tool-call parser's `parse` on any text returns a ParseResult and never raises:
deep nesting, huge input, lone surrogates, protocol fragments in any order."""

import json

from hypothesis import strategies as st

from ponder.tools.parsers import HermesParser, ParseResult, ReActParser, SearchR1Parser
from ponder.types import ToolCall, ToolSpec

from .conftest import ANY_TEXT, deep_nesting, fuzz_pair, one_line_error

SPECS = [ToolSpec("search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}})]
PARSERS = [
    HermesParser(),
    ReActParser(SPECS),
    SearchR1Parser(),
    SearchR1Parser(tool_name="calculator", argument="expression", call_tag="calculator", result_tag="result"),
    SearchR1Parser(call_tag=None),
]

# Pieces of every format, so random sequences reach deep into each parser.
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
    "<calculator>", "</calculator>", "<information>", "Thought:", "Action:", "Action Input:", "Final Answer:",
    "\nObservation:", "```json\n", "```", "{", "}", "[", "]", '"', ":", ",", '"name"', '"arguments"',
    '"parameters"', '"search"', '"query"', "null", "true", "1e999", "-0", "1" * 5000, "\\ud800", "\\udc00",
    "\ud800", "\x00", "\n", " ", "\u2028",
]  # fmt: skip
PROTOCOL_SOUP = st.lists(st.one_of(st.sampled_from(FRAGMENTS), ANY_TEXT), max_size=60).map("".join)
WRAPPED_DEEP = st.one_of(
    deep_nesting("[", "]").map(lambda body: f"<tool_call>{body}</tool_call>"),
    deep_nesting('{"a":').map(lambda body: f'<tool_call>{{"name": "x", "arguments": {body}1</tool_call>'),
    deep_nesting("[").map(lambda body: f'<tool_call>{{"name": "x", "arguments": "{body}"}}</tool_call>'),
    deep_nesting('{"a":', "}").map(lambda body: f"Action: search\nAction Input: {body}"),
    deep_nesting("<think>").map(lambda body: body + "<answer>x</answer>"),
    st.integers(1, 20_000).map(lambda n: "<tool_call>" * n),
    st.integers(1, 20_000).map(lambda n: "Action: a\n" * n),
)
ANY_ACTION = st.one_of(ANY_TEXT, PROTOCOL_SOUP, WRAPPED_DEEP)


def _encodable(value) -> None:
    json.dumps(value, ensure_ascii=False).encode("utf-8")


def check_every_parser(text: str) -> None:
    for parser in PARSERS:
        result = parser.parse(text)
        assert isinstance(result, ParseResult)
        assert all(isinstance(call, ToolCall) and isinstance(call.arguments, dict) for call in result.calls)
        for call in result.calls:
            _encodable([call.name, call.arguments])  # what the registry, Parquet and JSON state will do
        if result.error is not None:
            one_line_error(result.error.split("\n")[0])  # ReAct's examples span two lines by design
        assert result.answer is None or isinstance(result.answer, str)


test_parsers_never_raise, test_parsers_never_raise_deep = fuzz_pair(ANY_ACTION, check_every_parser, fast=500)
