import pytest

from ponder.agent import Agent, AgentConfig, AgentConfigError, BackendPolicy
from ponder.agent.state import ANSWERED, ERROR, STOPPED
from ponder.rollout.scripted import ScriptedBackend

from .conftest import add, call, lookup, scripted_agent


def test_hermes_tool_call_then_answer(tokenizer):
    agent, _ = scripted_agent(tokenizer, [call("add", a=2, b=3), "The sum is 5."])
    state = agent.run("What is 2 + 3?", key="t1")
    assert (state.status, state.stop_reason, state.answer) == (ANSWERED, "answer", "The sum is 5.")
    assert [m["role"] for m in state.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'add'; untrusted data]\n5\n</tool_response>"
    assert [t.tool_calls[0].arguments for t in state.turns[:1]] == [{"a": 2, "b": 3}]
    assert state.turns[0].tool_results[0].content == "5"
    assert [(a.tool, a.kind, a.ok) for a in state.trace] == [("add", "call", True)]
    assert state.counters.turns == 2 and state.counters.model_calls == 2
    assert '"name": "add"' in state.messages[0]["content"]  # the tools are described to the model


def test_react_style(tokenizer):
    turns = ["Thought: look\nAction: lookup\nAction Input: owls\n", "Thought: done\nFinal Answer: owls hoot"]
    agent, _ = scripted_agent(tokenizer, turns, style="react")
    state = agent.run("Tell me about owls", key="t1")
    assert state.answer == "owls hoot"
    # A bare Action Input maps to the tool's single parameter because the parser got the specs.
    assert state.turns[0].tool_calls[0].arguments == {"query": "owls"}
    assert state.messages[3]["content"] == "Observation: [output of tool 'lookup'; untrusted data]\nfact about owls"
    assert "Action Input" in state.messages[0]["content"]


@pytest.mark.parametrize("garbage", ["", "   ", "<tool_call>{not json</tool_call>", "</tool_call>"])
def test_garbage_output_becomes_an_error_observation(tokenizer, garbage):
    agent, _ = scripted_agent(tokenizer, [garbage, "fine: 4"])
    state = agent.run("q", key="t1")
    assert state.status == ANSWERED and state.answer == "fine: 4"
    assert state.turns[0].error is not None
    assert state.messages[3]["content"].startswith("<tool_response>\nerror: ")


def test_turn_limit_stops_with_the_transcript(tokenizer):
    agent, _ = scripted_agent(tokenizer, [call("lookup", query=f"q{i}") for i in range(10)], max_turns=3)
    state = agent.run("loop forever", key="t1")
    assert (state.status, state.stop_reason) == (STOPPED, "max_turns")
    assert state.counters.turns == 3 and len(state.turns) == 3
    assert len([m for m in state.messages if m["role"] == "assistant"]) == 3


def test_generated_token_limit(tokenizer):
    long_turn = call("lookup", query="x" * 40)
    agent, _ = scripted_agent(tokenizer, [long_turn] * 10, max_generated_tokens=30, max_new_tokens_per_turn=20)
    state = agent.run("q", key="t1")
    assert (state.status, state.stop_reason) == (STOPPED, "max_tokens")
    assert state.counters.generated_tokens <= 30 + 20


def test_context_limit(tokenizer):
    agent, _ = scripted_agent(tokenizer, ["never used"], max_context_tokens=5)
    state = agent.run("a question long enough to exceed five tokens of context", key="t1")
    assert (state.status, state.stop_reason, state.counters.model_calls) == (STOPPED, "max_context", 0)


def test_wall_clock_limit_with_a_clock_that_jumps(tokenizer):
    ticks = iter(range(0, 10_000, 7))  # every reading of the clock is 7 s later
    backend = ScriptedBackend(tokenizer, {"t1": [call("lookup", query="x")] * 20})
    agent = Agent(BackendPolicy(backend), [lookup], AgentConfig(wall_clock_s=30), clock=lambda: next(ticks))
    state = agent.run("q", key="t1")
    assert (state.status, state.stop_reason) == (STOPPED, "timeout")
    assert state.elapsed_s >= 30 and state.counters.turns < 20


def test_a_failing_model_ends_the_run_with_error_and_keeps_the_transcript(tokenizer):
    agent, _ = scripted_agent(tokenizer, [call("add", a=1, b=1)])  # no second turn: the backend raises
    state = agent.run("q", key="t1")
    assert (state.status, state.stop_reason) == (ERROR, "model_error")
    assert "no turn 1" in state.error
    assert len(state.messages) == 4  # system, user, the action, its observation


def test_events_arrive_in_order(tokenizer):
    events = []
    backend = ScriptedBackend(tokenizer, {"t1": [call("add", a=1, b=2), "3"]})
    agent = Agent(BackendPolicy(backend), [add], on_event=lambda kind, payload: events.append(kind))
    agent.run("q", key="t1")
    assert events == ["text", "action", "tool_result", "observation", "text", "action", "done"]


def test_run_is_a_rollout_record(tokenizer):
    agent, _ = scripted_agent(tokenizer, [call("add", a=2, b=2), call("nope"), "4"])
    trajectory = agent.run("q", key="t1").to_trajectory()
    assert trajectory.final_answer == "4"
    assert trajectory.metrics["tool_calls"] == 2.0 and trajectory.metrics["tool_errors"] == 1.0
    assert trajectory.turns[1].tool_results[0].content.startswith("unknown tool 'nope'")


def test_bad_config_fails_with_one_line():
    with pytest.raises(AgentConfigError, match="style 'xml' is unknown"):
        AgentConfig(style="xml")
    with pytest.raises(AgentConfigError, match="retries must be >= 0"):
        AgentConfig(tools={"add": {"retries": -1}})
    with pytest.raises(AgentConfigError, match="unknown key 'tools.add.retry'"):
        AgentConfig(tools={"add": {"retry": 1}})


def test_an_answer_cut_off_at_the_token_cap_stops_with_length(tokenizer):
    agent, _ = scripted_agent(tokenizer, ["The answer is a long story about " + "owls " * 40],
                              max_new_tokens_per_turn=8)
    state = agent.run("Tell me about owls", key="t1")
    assert (state.status, state.stop_reason, state.answer) == (STOPPED, "length", None)
    assert state.error.startswith("the reply was cut off at 8 new tokens (max_new_tokens_per_turn)")
    assert state.counters.generated_tokens == 8
    assert state.messages[-1]["role"] == "assistant"  # the partial reply stays in the transcript
    result = state.result()  # what `ponder run-agent` prints
    assert (result["status"], result["stop_reason"]) == ("stopped", "length")


def test_the_run_budget_cutting_an_answer_is_named(tokenizer):
    turns = [call("lookup", query="owls"), "Owls are " + "very " * 40 + "quiet."]
    agent, _ = scripted_agent(tokenizer, turns, max_new_tokens_per_turn=64, max_generated_tokens=70)
    state = agent.run("Tell me about owls", key="t1")
    assert (state.status, state.stop_reason) == (STOPPED, "length")
    assert "(max_generated_tokens)" in state.error and state.counters.generated_tokens == 70


def test_an_answer_ending_at_the_cap_exactly_is_still_an_answer(tokenizer):
    answer = "Owls hoot."
    size = len(tokenizer.encode(answer, add_special_tokens=False)) + 1  # the end-of-turn token
    agent, _ = scripted_agent(tokenizer, [answer], max_new_tokens_per_turn=size)
    state = agent.run("q", key="t1")
    assert (state.status, state.stop_reason, state.answer) == (ANSWERED, "answer", answer)
