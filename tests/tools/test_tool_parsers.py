import pytest

from ponder.tools import HermesParser, ReActParser, SearchR1Parser, ToolRegistry, get_parser, tool
from ponder.tools.parsers import PARSERS
from ponder.types import ToolCall, ToolResult, ToolSpec


@tool
def search(query: str) -> str:
    """Search the corpus.

    Args:
        query: What to look for.
    """
    return f"found {query}"


# ---------------------------------------------------------------- registry of parsers


def test_get_parser_by_name_and_unknown_name():
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("react"), ReActParser)
    assert isinstance(get_parser("search_r1"), SearchR1Parser)
    assert sorted(PARSERS) == ["hermes", "react", "search_r1"]
    with pytest.raises(ValueError, match="^unknown parser 'json'; valid: hermes, react, search_r1$"):
        get_parser("json")


def test_stop_strings():
    assert get_parser("hermes").stop_strings == []
    assert get_parser("react").stop_strings == ["\nObservation:"]
    assert get_parser("search_r1").stop_strings == ["</search>", "</answer>"]


# ---------------------------------------------------------------- Hermes


def test_hermes_single_call_with_think():
    text = '<think>I need facts.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "owls"}}\n</tool_call>'
    parsed = HermesParser().parse(text)
    assert parsed.calls == [
        ToolCall(
            "search",
            {"query": "owls"},
            raw='<tool_call>\n{"name": "search", "arguments": {"query": "owls"}}\n</tool_call>',
        )
    ]
    assert parsed.answer is None
    assert parsed.error is None
    assert parsed.thought == "I need facts."


def test_hermes_several_calls_and_nested_arguments():
    text = (
        'Let me look.\n<tool_call>{"name": "a", "arguments": {"filter": {"tags": ["x", "y"], "range": {"lo": 1}}}}'
        '</tool_call>\n<tool_call>{"name": "b", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    )
    parsed = HermesParser().parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("a", {"filter": {"tags": ["x", "y"], "range": {"lo": 1}}}),
        ("b", {"code": "print('</tool_call>')"}),
    ]
    assert parsed.thought == "Let me look."
    assert parsed.error is None


def test_hermes_arguments_as_json_string_and_parameters_alias():
    parsed = HermesParser().parse('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>')
    assert parsed.calls[0].arguments == {"query": "x"}
    parsed = HermesParser().parse('<tool_call>{"name": "search", "parameters": {"query": "y"}}</tool_call>')
    assert parsed.calls[0].arguments == {"query": "y"}
    parsed = HermesParser().parse('<tool_call>{"name": "now"}</tool_call>')
    assert parsed.calls == [ToolCall("now", {}, raw='<tool_call>{"name": "now"}</tool_call>')]


def test_hermes_plain_text_is_the_answer_without_think():
    parsed = HermesParser().parse("<think>Easy.</think>\n\nParis is the capital. ")
    assert parsed.calls == []
    assert parsed.answer == "Paris is the capital."
    assert parsed.thought == "Easy."
    assert parsed.error is None


def test_hermes_lone_close_think_from_template_prompt():
    parsed = HermesParser().parse("reasoning here</think>Answer: 4")
    assert parsed.thought == "reasoning here"
    assert parsed.answer == "Answer: 4"


def test_hermes_malformed_json_is_an_error():
    parsed = HermesParser().parse('<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>')
    assert parsed.calls == []
    assert parsed.answer is None
    assert parsed.error == (
        "invalid JSON in <tool_call>: Expecting ',' delimiter at char 45; "
        'write <tool_call>{"name": "tool_name", "arguments": {...}}</tool_call>'
    )


def test_hermes_unclosed_tool_call_is_an_error():
    parsed = HermesParser().parse('<tool_call>{"name": "search", "arguments": {"query": "x"}}')
    assert parsed.calls == []
    assert parsed.error.startswith("unclosed <tool_call> (generation cut off?)")
    parsed = HermesParser().parse('<tool_call>{"name": "search", "argu')
    assert parsed.error.startswith("unclosed <tool_call> (generation cut off?)")


def test_hermes_one_bad_block_fails_the_whole_action():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"arguments": {}}</tool_call>'
    parsed = HermesParser().parse(text)
    assert parsed.calls == []
    assert parsed.error == (
        'missing "name" in <tool_call>; write <tool_call>{"name": "tool_name", "arguments": {...}}</tool_call>'
    )


def test_hermes_shape_errors():
    parser = HermesParser()
    assert parser.parse('<tool_call>{"name": "a", "arguments": [1]}</tool_call>').error == (
        "arguments of 'a' must be a JSON object, got array"
    )
    assert parser.parse('<tool_call>{"name": "a", "arguments": "{oops"}</tool_call>').error.startswith(
        "arguments of 'a' are a string that is not valid JSON"
    )
    assert parser.parse('<tool_call>["a"]</tool_call>').error.startswith(
        "<tool_call> must hold a JSON object, got array"
    )
    assert parser.parse('<tool_call>{"name": "a"} extra</tool_call>').error.startswith(
        "unexpected text after the JSON object"
    )
    assert parser.parse('{"name": "a"}</tool_call>').error.startswith("found </tool_call> without an opening")
    assert parser.parse("<think>still thinking").error.startswith("unclosed <think>")
    assert parser.parse("  ").error.startswith("empty response")


def test_hermes_unknown_tool_parses_then_registry_errors():
    parsed = HermesParser().parse('<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>')
    assert parsed.error is None
    result = ToolRegistry([search]).call(parsed.calls[0])
    assert result.content == "unknown tool 'browse'; available: search"
    assert result.is_error is True


def test_hermes_wrong_argument_type_parses_then_registry_errors():
    parsed = HermesParser().parse('<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>')
    assert parsed.calls[0].arguments == {"query": 7}
    assert ToolRegistry([search]).call(parsed.calls[0]).content == "search: argument 'query' must be string, got 7"


def test_hermes_format_results_and_error():
    parser = HermesParser()
    results = [ToolResult("first", name="a"), ToolResult("bad input", is_error=True, name="b")]
    # Each result names its source; the parser's own error (below) is not tool output.
    assert parser.format_results(results) == (
        "<tool_response>\n[output of tool 'a'; untrusted data]\nfirst\n</tool_response>\n"
        "<tool_response>\n[output of tool 'b'; untrusted data]\nerror: bad input\n</tool_response>"
    )
    verbatim = HermesParser(escape=False, mark_source=False)
    assert verbatim.format_results(results) == (
        "<tool_response>\nfirst\n</tool_response>\n<tool_response>\nerror: bad input\n</tool_response>"
    )
    assert parser.format_error("oops") == "<tool_response>\nerror: oops\n</tool_response>"


# ---------------------------------------------------------------- ReAct


def test_react_action_with_json_input():
    text = 'Thought: I should search.\nAction: search\nAction Input: {"query": "owls", "filter": {"year": [1, 2]}}'
    parsed = ReActParser().parse(text)
    assert parsed.calls == [
        ToolCall(
            "search",
            {"query": "owls", "filter": {"year": [1, 2]}},
            raw='Action: search\nAction Input: {"query": "owls", "filter": {"year": [1, 2]}}',
        )
    ]
    assert parsed.thought == "I should search."
    assert parsed.error is None


def test_react_text_ending_in_stop_string_and_code_fence():
    text = 'Thought: go\nAction: `search`\nAction Input: ```json\n{"query": "x"}\n```\nObservation:'
    parsed = ReActParser().parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("search", {"query": "x"})]


def test_react_final_answer():
    parsed = ReActParser().parse("Thought: I know it.\nFinal Answer: 42 apples")
    assert parsed.calls == []
    assert parsed.answer == "42 apples"
    assert parsed.thought == "I know it."


def test_react_bare_string_input_maps_to_single_parameter_when_spec_known():
    text = "Thought: look\nAction: search\nAction Input: barn owls"
    assert ReActParser().parse(text).calls[0].arguments == {"input": "barn owls"}
    assert ReActParser(specs=[search.spec]).parse(text).calls[0].arguments == {"query": "barn owls"}
    quoted = 'Action: search\nAction Input: "barn owls"'
    assert ReActParser(specs=[search.spec]).parse(quoted).calls[0].arguments == {"query": "barn owls"}
    two_params = ToolSpec("search", "x", {"type": "object", "properties": {"a": {}, "b": {}}})
    assert ReActParser(specs=[two_params]).parse(text).calls[0].arguments == {"input": "barn owls"}


def test_react_errors():
    parser = ReActParser()
    assert parser.parse("Thought: hmm\nAction: search").error == (
        "Action 'search' has no 'Action Input:' line; write Action: tool_name\n"
        'Action Input: {"argument": "value"}'
    )
    assert parser.parse('Action: search\nAction Input: {"query": "x"').error.startswith("invalid JSON in Action Input")
    assert parser.parse("Action: search\nAction Input:").error.startswith("empty Action Input for 'search'")
    assert parser.parse("I think the answer is 3").error.startswith("no 'Action:' or 'Final Answer:' found")
    both = 'Action: search\nAction Input: {"query": "x"}\nFinal Answer: 3'
    assert parser.parse(both).error == "found both an Action and a Final Answer; give one of them per turn"
    assert parser.parse("Final Answer:   ").error.startswith("empty Final Answer")


def test_react_wrong_argument_type_reaches_registry():
    parsed = ReActParser().parse('Action: search\nAction Input: {"query": ["a"]}')
    result = ToolRegistry([search]).call(parsed.calls[0])
    assert result.content == "search: argument 'query' must be string, got [\"a\"]"


def test_react_format_results_and_error():
    parser = ReActParser()
    header = "[output of tool 'search'; untrusted data]"
    assert parser.format_results([ToolResult("3 hits", name="search")]) == f"\nObservation: {header}\n3 hits\n"
    assert parser.format_results([ToolResult("nope", True, "search")]) == f"\nObservation: {header}\nerror: nope\n"
    assert ReActParser(mark_source=False).format_results([ToolResult("3 hits")]) == "\nObservation: 3 hits\n"
    assert parser.format_error("bad") == "\nObservation: error: bad\n"


# ---------------------------------------------------------------- Search-R1


def test_search_r1_search_call():
    text = "<think>I need the year.</think>\n<search> when was the eiffel tower built </search>"
    parsed = SearchR1Parser().parse(text)
    assert parsed.calls == [
        ToolCall(
            "search",
            {"query": "when was the eiffel tower built"},
            raw="<search> when was the eiffel tower built </search>",
        )
    ]
    assert parsed.thought == "I need the year."
    assert parsed.answer is None
    assert parsed.error is None


def test_search_r1_answer():
    parsed = SearchR1Parser().parse("<think>Found it.</think><answer> 1889 </answer>")
    assert parsed.answer == "1889"
    assert parsed.calls == []


def test_search_r1_last_tag_wins():
    assert SearchR1Parser().parse("<search>first</search> then <answer>final</answer>").answer == "final"
    parsed = SearchR1Parser().parse("<answer>guess</answer> no wait <search>check this</search>")
    assert parsed.answer is None
    assert parsed.calls[0].arguments == {"query": "check this"}


def test_search_r1_errors():
    parser = SearchR1Parser()
    assert parser.parse("<think>hmm</think> I am not sure.").error == (
        "no <search> or <answer> tag found; search with <search>query</search> or answer with <answer>text</answer>"
    )
    assert parser.parse("<search>   </search>").error.startswith("empty <search>")
    assert parser.parse("<search>eiffel tow").error.startswith("unclosed <search> (generation cut off?)")
    assert parser.parse("<search>a</search><answer>trunc").error.startswith("unclosed <answer>")
    assert parser.parse("<search>a</search><answer>trunc").calls == []


def test_search_r1_custom_tool_name_and_argument():
    parsed = SearchR1Parser(tool_name="retrieve", argument="text").parse("<search>x</search>")
    assert (parsed.calls[0].name, parsed.calls[0].arguments) == ("retrieve", {"text": "x"})


def test_search_r1_format_results_and_error():
    parser = SearchR1Parser()
    assert parser.format_results([ToolResult("  Doc 1: owls  ")]) == "\n\n<information>Doc 1: owls</information>\n\n"
    assert parser.format_results([ToolResult("a"), ToolResult("down", is_error=True)]) == (
        "\n\n<information>a\nerror: down</information>\n\n"
    )
    assert parser.format_error("empty query") == "\n\n<information>error: empty query</information>\n\n"
