import json

import pytest

from ponder.agent import Agent, AgentConfig, BackendPolicy
from ponder.agent.multi import Coordinator, PeerChat, TeamConfig
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools.builtin import calculator

from .conftest import call, lookup


def plan(*subtasks, answer=None):
    if answer is not None:
        return json.dumps({"answer": answer})
    return json.dumps({"subtasks": [{"role": r, "task": t} for r, t in subtasks]})


def team(tokenizer, scripts, clock=None):
    backend = ScriptedBackend(tokenizer, scripts)
    policy = BackendPolicy(backend)
    extra = {"clock": clock} if clock else {}
    agents = {
        "planner": Agent(policy, [], AgentConfig(max_corrections=1), **extra),
        "researcher": Agent(policy, [lookup], AgentConfig(), **extra),
        "coder": Agent(policy, [calculator], AgentConfig(), **extra),
        "summarizer": Agent(policy, [], AgentConfig(), **extra),
    }
    return agents, backend


def coordinator(agents, config=None, clock=None, merger=True):
    roles = {"researcher": agents["researcher"], "coder": agents["coder"]}
    extra = {"clock": clock} if clock else {}
    return Coordinator(agents["planner"], roles, agents["summarizer"] if merger else None, config, **extra)


def test_coordinator_plans_dispatches_and_answers(tokenizer):
    scripts = {
        "planner": [plan(("researcher", "When was the bridge built?"), ("coder", "years from 1890 to 2024")),
                    plan(answer="The bridge is 134 years old.")],
        "researcher": [call("lookup", query="bridge"), "It was built in 1890."],
        "coder": [call("calculator", expression="2024 - 1890"), "134"],
    }
    agents, backend = team(tokenizer, scripts)
    result = coordinator(agents).run("How old is the bridge?")
    assert (result.status, result.stop_reason, result.answer, result.rounds) == ("answered", "answer", "The bridge is 134 years old.", 2)
    assert [(m.sender, m.to) for m in result.transcript] == [
        ("planner", "researcher"), ("researcher", "planner"), ("planner", "coder"), ("coder", "planner"), ("planner", "user")]
    assert result.transcript[3].content == "134"
    assert [r["agent"] for r in result.runs] == ["planner", "researcher", "coder", "planner"]
    assert result.runs[2]["tool_attempts"][0]["tool"] == "calculator"
    assert "[coder] years from 1890 to 2024 -> 134" in backend_prompt(agents, result)


def backend_prompt(agents, result):
    # The second planner run read every result: it is the user message of that run's transcript.
    return result.runs[3]["transcript"][1]["content"]


def test_coordinator_merges_after_max_rounds(tokenizer):
    scripts = {
        "planner": [plan(("researcher", "part one")), plan(("researcher", "part two"))],
        "researcher": ["one", "two"],
        "merger": ["one and two"],
    }
    agents, _ = team(tokenizer, scripts)
    result = coordinator(agents, TeamConfig(max_rounds=2)).run("task")
    assert (result.status, result.stop_reason, result.answer, result.rounds) == ("answered", "merged_after_max_rounds", "one and two", 2)


def test_coordinator_stops_a_repeated_plan(tokenizer):
    same = plan(("researcher", "look again"))
    scripts = {"planner": [same, same, same], "researcher": ["nothing", "nothing"]}
    agents, backend = team(tokenizer, scripts)
    result = coordinator(agents, TeamConfig(max_rounds=5), merger=False).run("task")
    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "loop_detected", 2)
    assert result.answer == "[researcher] look again -> nothing"
    assert backend.turns_served["researcher"] == 1


def test_coordinator_with_an_unusable_planner(tokenizer):
    scripts = {"planner": ['{"subtasks": [{"role": "astronaut", "task": "x"}]}', "still wrong"]}
    agents, _ = team(tokenizer, scripts)
    result = coordinator(agents).run("task")
    assert (result.status, result.stop_reason, result.answer) == ("stopped", "planner_failed", None)
    assert result.runs[0]["stop_reason"] == "schema_failed"


def test_coordinator_times_out_with_a_clear_result(tokenizer):
    ticks = iter(range(0, 100_000, 5))
    clock = lambda: next(ticks)  # noqa: E731
    scripts = {"planner": [plan(("researcher", "slow work"))] * 5, "researcher": [call("lookup", query="x")] * 50}
    agents, _ = team(tokenizer, scripts, clock=clock)
    result = coordinator(agents, TeamConfig(wall_clock_s=60, max_rounds=50), clock=clock, merger=False).run("task")
    assert (result.status, result.stop_reason) == ("stopped", "timeout")
    assert result.rounds < 50


def test_peer_chat_ends_on_the_final_marker(tokenizer):
    scripts = {"alice": ["@bob what is 6 times 7?"], "bob": [call("calculator", expression="6*7"), "FINAL: 42"]}
    backend = ScriptedBackend(tokenizer, scripts)
    agents = {"alice": Agent(BackendPolicy(backend)), "bob": Agent(BackendPolicy(backend), [calculator])}
    result = PeerChat(agents).run("multiply")
    assert (result.status, result.stop_reason, result.answer, result.rounds) == ("answered", "answer", "42", 1)
    assert [(m.sender, m.to) for m in result.transcript] == [("alice", "bob"), ("bob", "all")]
    assert "alice -> bob: @bob what is 6 times 7?" in result.runs[1]["transcript"][1]["content"]


def test_peer_chat_detects_a_loop(tokenizer):
    scripts = {"alice": ["I agree.", "i  AGREE."], "bob": ["Sounds good."]}
    backend = ScriptedBackend(tokenizer, scripts)
    result = PeerChat({n: Agent(BackendPolicy(backend)) for n in scripts}, TeamConfig(max_rounds=10)).run("t")
    assert (result.status, result.stop_reason, result.rounds, len(result.transcript)) == ("stopped", "loop_detected", 2, 3)


def test_peer_chat_max_rounds(tokenizer):
    scripts = {"alice": ["a1", "a2"], "bob": ["b1", "b2"]}
    backend = ScriptedBackend(tokenizer, scripts)
    result = PeerChat({n: Agent(BackendPolicy(backend)) for n in scripts}, TeamConfig(max_rounds=2)).run("t")
    assert (result.status, result.stop_reason, [m.content for m in result.transcript]) == ("stopped", "max_rounds", ["a1", "b1", "a2", "b2"])


def test_peer_chat_timeout(tokenizer):
    ticks = iter(range(0, 100_000))
    clock = lambda: next(ticks)  # noqa: E731
    scripts = {"alice": [f"a{i}" for i in range(100)], "bob": [f"b{i}" for i in range(100)]}
    backend = ScriptedBackend(tokenizer, scripts)
    agents = {n: Agent(BackendPolicy(backend), clock=clock) for n in scripts}
    result = PeerChat(agents, TeamConfig(max_rounds=100, wall_clock_s=300), clock=clock).run("t")
    assert (result.status, result.stop_reason) == ("stopped", "timeout")
    assert 1 < result.rounds < 100


def test_a_failing_peer_is_reported_and_its_repeated_failure_ends_the_chat(tokenizer):
    scripts = {"alice": [f"a{i}" for i in range(100)], "bob": []}  # bob's model fails every time
    backend = ScriptedBackend(tokenizer, scripts)
    agents = {n: Agent(BackendPolicy(backend)) for n in scripts}
    result = PeerChat(agents, TeamConfig(max_rounds=100)).run("t")
    assert (result.status, result.stop_reason, result.rounds) == ("stopped", "loop_detected", 2)
    assert result.transcript[1].content.startswith("(no answer: error, model_error")
    with pytest.raises(ValueError, match="at least two agents"):
        PeerChat({"solo": agents["alice"]})
