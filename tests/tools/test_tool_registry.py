import time

import pytest

from ponder.tools import StatefulTool, ToolRegistry, tool
from ponder.types import ToolCall, ToolResult, ToolSpec


@tool
def search(query: str, k: int = 2) -> str:
    """Search the corpus.

    Args:
        query: What to look for.
        k: How many passages.
    """
    return f"{k} passages about {query}"


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: Numerator.
        b: Denominator.
    """
    if b == 0:
        raise ValueError("b must not be zero")
    return a / b


@tool(timeout_s=0.2, isolation="process")  # time.sleep blocks in C: only a kill stops it at the limit
def sleepy(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


@tool
def stats(values: list[int]) -> dict:
    """Summarise numbers.

    Args:
        values: The numbers.
    """
    return {"n": len(values), "total": sum(values), "first": values[0] if values else None}


def make_registry() -> ToolRegistry:
    return ToolRegistry([search, divide, sleepy, stats])


def test_lookup_names_specs_and_contains():
    registry = make_registry()
    assert registry.names() == ["search", "divide", "sleepy", "stats"]
    assert [spec.name for spec in registry.specs()] == ["search", "divide", "sleepy", "stats"]
    assert registry.specs()[0] is search.spec
    assert "divide" in registry
    assert "missing" not in registry
    assert registry.get("search") is search
    assert len(registry) == 4
    with pytest.raises(KeyError, match="unknown tool 'missing'"):
        registry.get("missing")


def test_register_duplicate_name_raises():
    registry = make_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register(search)


def test_register_plain_function_wraps_it_with_tool():
    def shout(text: str) -> str:
        """Upper-case text.

        Args:
            text: The text.
        """
        return text.upper()

    registry = ToolRegistry()
    registry.register(shout)
    assert registry.call(ToolCall("shout", {"text": "hi"})).content == "HI"


def test_successful_call_fills_name_and_elapsed():
    result = make_registry().call(ToolCall("search", {"query": "owls", "k": 3}))
    assert result.content == "3 passages about owls"
    assert result.is_error is False
    assert result.name == "search"
    assert 0.0 <= result.elapsed_s < 1.0


def test_unknown_tool_lists_available():
    result = make_registry().call(ToolCall("browse", {"url": "x"}))
    assert result == ToolResult(
        "unknown tool 'browse'; available: search, divide, sleepy, stats",
        is_error=True,
        name="browse",
        elapsed_s=result.elapsed_s,
    )


def test_wrong_argument_type_is_a_readable_error():
    registry = make_registry()
    assert registry.validate(ToolCall("search", {"query": 3})) == "search: argument 'query' must be string, got 3"
    result = registry.call(ToolCall("search", {"query": "owls", "k": "3"}))
    assert result.is_error is True
    assert result.content == "search: argument 'k' must be integer, got \"3\""


def test_missing_required_and_unexpected_arguments():
    registry = make_registry()
    assert registry.validate(ToolCall("search", {"k": 1})) == "search: missing required argument 'query'"
    assert (
        registry.validate(ToolCall("search", {"query": "a", "limit": 1})) == "search: unexpected argument 'limit'"
    )
    assert registry.validate(ToolCall("search", {"query": "a"})) is None


def test_nested_argument_error_names_the_item():
    message = make_registry().validate(ToolCall("stats", {"values": [1, "two", 3]}))
    assert message == "stats: argument 'values[1]' must be integer, got \"two\""


def test_several_errors_are_reported_on_one_line():
    message = make_registry().validate(ToolCall("divide", {"a": "1", "c": 2}))
    assert message == (
        "divide: argument 'a' must be number, got \"1\"; missing required argument 'b'; unexpected argument 'c'"
    )


def test_exception_in_tool_becomes_error_result():
    result = make_registry().call(ToolCall("divide", {"a": 1, "b": 0}))
    assert result.is_error is True
    assert result.content == "divide raised ValueError: b must not be zero"
    assert result.name == "divide"


def test_timeout_returns_error_without_waiting_for_the_tool():
    started = time.perf_counter()
    result = make_registry().call(ToolCall("sleepy", {"seconds": 2}))
    waited = time.perf_counter() - started
    assert result.is_error is True
    assert result.content == "tool 'sleepy' timed out after 0.2 s"
    assert waited < 1.5
    assert 0.2 <= result.elapsed_s < 1.5


def test_per_call_timeout_overrides_tool_timeout():
    registry = make_registry()
    assert registry.call(ToolCall("sleepy", {"seconds": 0.3}), timeout_s=2.0).content == "awake"
    assert registry.call(ToolCall("sleepy", {"seconds": 1.0}), timeout_s=0.05).content == (
        "tool 'sleepy' timed out after 0.05 s"
    )


def test_registry_default_timeout_applies_when_tool_has_none():
    @tool
    def slow() -> str:
        """Take a while."""
        time.sleep(1.0)
        return "done"

    registry = ToolRegistry([slow], default_timeout_s=0.1)
    assert registry.call(ToolCall("slow", {})).content == "tool 'slow' timed out after 0.1 s"


def test_non_string_results_are_rendered_as_json():
    registry = make_registry()
    assert registry.call(ToolCall("stats", {"values": [4, 5]})).content == '{"n": 2, "total": 9, "first": 4}'
    assert registry.call(ToolCall("divide", {"a": 1, "b": 4})).content == "0.25"


def test_json_rendering_falls_back_to_str_for_unknown_objects():
    class Point:
        def __str__(self) -> str:
            return "Point(1, 2)"

    @tool
    def where() -> dict:
        """Locate the thing."""
        return {"at": Point(), "ok": True}

    assert ToolRegistry([where]).call(ToolCall("where", {})).content == '{"at": "Point(1, 2)", "ok": true}'


def test_call_never_raises_even_for_system_exit():
    @tool
    def quit_now() -> str:
        """Exit the process."""
        raise SystemExit(3)

    result = ToolRegistry([quit_now]).call(ToolCall("quit_now", {}))
    assert result.is_error is True
    assert result.content == "quit_now raised SystemExit: 3"


def test_invalid_schema_is_rejected_at_registration():
    from jsonschema.exceptions import SchemaError

    from ponder.tools import Tool

    broken = Tool(ToolSpec("broken", "x", {"type": "object", "properties": {"a": {"type": "strng"}}}), lambda a: a)
    with pytest.raises(SchemaError):
        ToolRegistry([broken])


class Counter(StatefulTool):
    def __init__(self) -> None:
        super().__init__()
        self.created: list[dict] = []
        self.released: list[dict] = []

    def create(self, start: int = 0) -> dict:
        handle = {"count": start}
        self.created.append(handle)
        return handle

    def call(self, handle: dict, step: int) -> int:
        """Add to the counter and return its value.

        Args:
            step: How much to add.
        """
        handle["count"] += step
        return handle["count"]

    def release(self, handle: dict) -> None:
        self.released.append(handle)


def test_stateful_tool_creates_lazily_shares_handle_and_releases_on_close():
    counter = Counter()
    registry = ToolRegistry()
    registry.register(counter, create_kwargs={"start": 10})
    assert counter.created == []
    assert registry.call(ToolCall("counter", {"step": 2})).content == "12"
    assert registry.call(ToolCall("counter", {"step": 3})).content == "15"
    assert counter.created == [{"count": 15}]
    registry.close()
    assert counter.released == [{"count": 15}]
    assert registry.call(ToolCall("counter", {"step": 1})).content == "11"
    assert len(counter.created) == 2


def test_fresh_copy_gives_each_episode_its_own_handle():
    counter = Counter()
    with ToolRegistry() as first:
        first.register(counter)
        second = first.fresh_copy()
        assert first.call(ToolCall("counter", {"step": 5})).content == "5"
        assert second.call(ToolCall("counter", {"step": 1})).content == "1"
        assert first.call(ToolCall("counter", {"step": 5})).content == "10"
        second.close()
    assert sorted(handle["count"] for handle in counter.released) == [1, 10]


def test_failing_release_does_not_stop_other_releases():
    class Fragile(Counter):
        def release(self, handle: dict) -> None:
            raise RuntimeError("already gone")

    fragile, counter = Fragile(), Counter()
    assert fragile.name == "fragile"
    registry = ToolRegistry()
    registry.register(fragile)
    registry.register(counter)
    registry.call(ToolCall("fragile", {"step": 1}))
    registry.call(ToolCall("counter", {"step": 1}))
    registry.close()
    assert counter.released == [{"count": 1}]


def test_create_kwargs_rejected_for_plain_tools():
    with pytest.raises(ValueError, match="not a StatefulTool"):
        ToolRegistry().register(search, create_kwargs={"x": 1})
