import time

from ponder.agent import Agent, AgentConfig, BackendPolicy, ToolPolicy
from ponder.agent.runner import ANSWER_FROM_MEMORY
from ponder.agent.state import ANSWERED
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools import tool

from .conftest import call


def make(tokenizer, turns, tools, config, sleeps=None):
    backend = ScriptedBackend(tokenizer, {"t1": turns})
    sleep = sleeps.append if sleeps is not None else time.sleep
    return Agent(BackendPolicy(backend), tools, config, sleep=sleep)


def flaky_tool(failures):
    state = {"calls": 0}

    @tool
    def flaky(query: str) -> str:
        """Sometimes fails.

        Args:
            query: What to fetch.
        """
        state["calls"] += 1
        if state["calls"] <= failures:
            raise ConnectionError(f"transient failure {state['calls']}")
        return f"got {query}"

    return flaky, state


def test_retries_with_exponential_backoff_until_success(tokenizer):
    flaky, counts = flaky_tool(failures=2)
    sleeps = []
    config = AgentConfig(tools={"flaky": ToolPolicy(retries=3, backoff_s=0.1, backoff_factor=3.0)})
    agent = make(tokenizer, [call("flaky", query="x"), "done"], [flaky], config, sleeps)
    state = agent.run("q", key="t1")
    assert counts["calls"] == 3
    assert sleeps == [0.1, 0.1 * 3.0]
    assert [(a.kind, a.attempt, a.ok) for a in state.trace] == [("call", 0, False), ("retry", 1, False), ("retry", 2, True)]
    assert state.trace[0].error == "flaky raised ConnectionError: transient failure 1"
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'flaky'; untrusted data]\ngot x\n</tool_response>"


def test_retries_are_bounded(tokenizer):
    flaky, counts = flaky_tool(failures=100)
    config = AgentConfig(tool_policy=ToolPolicy(retries=2, backoff_s=0.0))
    state = make(tokenizer, [call("flaky", query="x"), "gave up"], [flaky], config, []).run("q", key="t1")
    assert counts["calls"] == 3 and len(state.trace) == 3
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'flaky'; untrusted data]\nerror: flaky raised ConnectionError: transient failure 3\n</tool_response>"
    assert state.status == ANSWERED


@tool
def search_a(query: str) -> str:
    """Primary search (down).

    Args:
        query: What to find.
    """
    raise TimeoutError("search A is down")


@tool
def search_b(query: str) -> str:
    """Secondary search.

    Args:
        query: What to find.
    """
    return f"B found {query}"


@tool
def search_c(query: str) -> str:
    """Third search (also down).

    Args:
        query: What to find.
    """
    raise RuntimeError("search C is down")


def test_fallback_to_the_next_declared_tool(tokenizer):
    config = AgentConfig(tools={"search_a": ToolPolicy(retries=1, backoff_s=0.0, fallbacks=["search_c", "search_b"])})
    agent = make(tokenizer, [call("search_a", query="owls"), "owls"], [search_a, search_b, search_c], config, [])
    state = agent.run("q", key="t1")
    assert [(a.requested, a.tool, a.kind, a.ok) for a in state.trace] == [
        ("search_a", "search_a", "call", False),
        ("search_a", "search_a", "retry", False),
        ("search_a", "search_c", "fallback", False),
        ("search_a", "search_b", "fallback", True),
    ]
    observation = state.messages[3]["content"]
    assert "[search_a failed; result from fallback tool search_b]\nB found owls" in observation
    assert state.turns[0].tool_results[0].is_error is False


def test_when_every_fallback_fails_the_model_is_told_to_answer_from_memory(tokenizer):
    config = AgentConfig(tools={"search_a": ToolPolicy(fallbacks=["search_c"])})
    agent = make(tokenizer, [call("search_a", query="owls"), "Owls hoot (from memory)."], [search_a, search_c], config)
    state = agent.run("q", key="t1")
    observation = state.messages[3]["content"]
    assert "search A is down" in observation and "search C is down" in observation
    assert observation.endswith(ANSWER_FROM_MEMORY + "\n</tool_response>")
    assert state.answer == "Owls hoot (from memory)."


def test_unknown_tool_is_an_error_observation_not_retried(tokenizer):
    config = AgentConfig(tool_policy=ToolPolicy(retries=3))
    state = make(tokenizer, [call("teleport", to="mars"), "ok"], [search_b], config, []).run("q", key="t1")
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'teleport'; untrusted data]\nerror: unknown tool 'teleport'; available: search_b\n</tool_response>"
    assert [(a.tool, a.ok) for a in state.trace] == [("teleport", False)]


def test_a_hanging_tool_times_out_and_the_loop_goes_on(tokenizer):
    @tool(isolation="process")  # blocked in C (sleep): only a kill stops it at the limit
    def hang() -> str:
        """Never returns."""
        time.sleep(30)
        return "never"

    config = AgentConfig(tools={"hang": ToolPolicy(timeout_s=0.2, retries=1, backoff_s=0.0)})
    started = time.monotonic()
    state = make(tokenizer, [call("hang"), "it hung"], [hang], config).run("q", key="t1")
    assert time.monotonic() - started < 3
    # Not retried: the call may have half-run, and the tool is not marked idempotent.
    assert state.trace[-1].error == "tool 'hang' timed out after 0.2 s" and len(state.trace) == 1
    assert state.answer == "it hung"


def test_a_timed_out_call_is_retried_only_when_the_tool_is_idempotent(tokenizer):
    @tool(isolation="process", idempotent=True)
    def lookup_slowly() -> str:
        """Never returns in time."""
        time.sleep(30)
        return "never"

    config = AgentConfig(tools={"lookup_slowly": ToolPolicy(timeout_s=0.2, retries=2, backoff_s=0.0)})
    state = make(tokenizer, [call("lookup_slowly"), "gave up"], [lookup_slowly], config).run("q", key="t1")
    assert [(a.kind, a.ok) for a in state.trace] == [("call", False), ("retry", False), ("retry", False)]


def test_the_run_time_limit_caps_a_tool_timeout(tokenizer):
    @tool(isolation="process")
    def slow() -> str:
        """Takes ten seconds."""
        time.sleep(10)
        return "late"

    config = AgentConfig(wall_clock_s=0.5, tools={"slow": ToolPolicy(timeout_s=20, retries=5)})
    started = time.monotonic()
    state = make(tokenizer, [call("slow"), "never reached"], [slow], config).run("q", key="t1")
    assert time.monotonic() - started < 3
    assert (state.status, state.stop_reason) == ("stopped", "timeout")
    assert len(state.trace) == 1  # no retry: no time was left for one


def test_a_ten_megabyte_result_is_cut(tokenizer):
    @tool
    def firehose() -> str:
        """Returns far too much."""
        return "x" * 10_000_000

    config = AgentConfig(max_observation_chars=1000)
    state = make(tokenizer, [call("firehose"), "ok"], [firehose], config).run("q", key="t1")
    observation = state.messages[3]["content"]
    assert len(observation) < 1100 + len("[output of tool 'firehose'; untrusted data]\n")  # the source line
    # The registry keeps the first 100,000 characters (plus its cut mark); the agent cuts that to 1000.
    assert observation.endswith("…[truncated: 99031 more characters]\n</tool_response>")
    assert state.status == ANSWERED
