import time

from ponder.tools import HermesParser, ParseResult, ReActParser, SearchR1Parser, ToolRegistry, run_tool_step, tool
from ponder.types import ToolCall, ToolResult


@tool
def search(query: str) -> str:
    """Search the corpus.

    Args:
        query: What to look for.
    """
    return f"Doc 1: {query} facts. Doc 2: more about {query}."


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


@tool(isolation="process")  # blocked in C (sleep): only a kill stops it at the limit
def nap() -> str:
    """Sleep for a second."""
    time.sleep(1.0)
    return "rested"


def make_registry() -> ToolRegistry:
    return ToolRegistry([search, add, nap])


def test_search_r1_end_to_end():
    outcome = run_tool_step("<think>look it up</think><search>owls</search>", SearchR1Parser(), make_registry())
    assert outcome.parse.calls == [ToolCall("search", {"query": "owls"}, raw="<search>owls</search>")]
    assert [(r.content, r.is_error, r.name) for r in outcome.results] == [
        ("Doc 1: owls facts. Doc 2: more about owls.", False, "search")
    ]
    assert outcome.observation == "\n\n<information>Doc 1: owls facts. Doc 2: more about owls.</information>\n\n"


def test_hermes_several_calls_end_to_end_with_one_failing():
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": "2", "b": 3}}</tool_call>'
    )
    outcome = run_tool_step(text, HermesParser(), make_registry())
    assert [(r.content, r.is_error) for r in outcome.results] == [
        ("5", False),
        ("add: argument 'a' must be integer, got \"2\"", True),
    ]
    assert outcome.observation == (
        "<tool_response>\n[output of tool 'add'; untrusted data]\n5\n</tool_response>\n"
        "<tool_response>\n[output of tool 'add'; untrusted data]\n"
        "error: add: argument 'a' must be integer, got \"2\"\n</tool_response>"
    )


def test_truncate_is_applied_to_each_result_before_formatting():
    outcome = run_tool_step(
        "Action: search\nAction Input: {\"query\": \"owls\"}",
        ReActParser(),
        make_registry(),
        truncate=lambda content: content[:10],
    )
    assert outcome.results[0].content == "Doc 1: owl"
    assert outcome.observation == "\nObservation: [output of tool 'search'; untrusted data]\nDoc 1: owl\n"


def test_answer_runs_no_tools_and_has_no_observation():
    outcome = run_tool_step("<answer>Paris</answer>", SearchR1Parser(), make_registry())
    assert outcome.parse.answer == "Paris"
    assert outcome.results == []
    assert outcome.observation is None


def test_malformed_call_gives_error_observation():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
    outcome = run_tool_step(text, HermesParser(), make_registry())
    assert outcome.results == []
    assert outcome.parse.error.startswith("invalid JSON in <tool_call>")
    assert outcome.observation == f"<tool_response>\nerror: {outcome.parse.error}\n</tool_response>"


def test_search_r1_missing_tag_error_observation():
    outcome = run_tool_step("I am not sure.", SearchR1Parser(), make_registry())
    assert outcome.observation == (
        "\n\n<information>error: no <search> or <answer> tag found; search with <search>query</search> "
        "or answer with <answer>text</answer></information>\n\n"
    )


def test_unknown_tool_error_observation():
    text = '<tool_call>{"name": "browse", "arguments": {}}</tool_call>'
    outcome = run_tool_step(text, HermesParser(), make_registry())
    assert outcome.results[0].is_error is True
    assert outcome.observation == (
        "<tool_response>\n[output of tool 'browse'; untrusted data]\n"
        "error: unknown tool 'browse'; available: search, add, nap\n</tool_response>"
    )


def test_step_timeout_overrides_tool_limits():
    started = time.perf_counter()
    outcome = run_tool_step('<tool_call>{"name": "nap"}</tool_call>', HermesParser(), make_registry(), timeout_s=0.1)
    assert time.perf_counter() - started < 0.9
    assert outcome.results[0].content == "tool 'nap' timed out after 0.1 s"


def test_step_never_raises_on_a_broken_parser_or_truncate():
    class BrokenParser:
        name = "broken"
        stop_strings: list[str] = []

        def parse(self, text: str) -> ParseResult:
            raise RuntimeError("bug")

        def format_results(self, results: list[ToolResult]) -> str:
            return ""

        def format_error(self, error: str) -> str:
            return f"[{error}]"

    outcome = run_tool_step("anything", BrokenParser(), make_registry())
    assert outcome.parse.error == "could not parse the action (RuntimeError: bug)"
    assert outcome.observation == "[could not parse the action (RuntimeError: bug)]"

    def broken_truncate(content: str) -> str:
        raise ValueError("no")

    outcome = run_tool_step("<search>owls</search>", SearchR1Parser(), make_registry(), truncate=broken_truncate)
    result = outcome.results[0]
    assert (result.content, result.is_error) == ("could not shorten the result (ValueError)", True)
