import json

import pytest

from ponder.agent import Agent, AgentConfig, AgentState, BackendPolicy, StateError, ToolPolicy
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools import tool

from .conftest import add, call, lookup

PERSON = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
TURNS = [
    call("lookup", query="Ada"),
    "not a tool call </tool_call>",
    call("add", a=30, b=6),
    call("nope", x=1),
    '{"age": "36"}',
    call("flaky", query="again"),
    '{"age": 36}',
]


def build_agent(tokenizer, served=0):
    """A fresh agent in a fresh 'process': new backend (told how many turns it already served),
    new tools with their own state."""
    backend = ScriptedBackend(tokenizer, {"t1": TURNS})
    backend.turns_served["t1"] = served
    failures = {"left": 1}

    @tool
    def flaky(query: str) -> str:
        """Fails once per process.

        Args:
            query: What to fetch.
        """
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("blip")
        return f"fetched {query}"

    config = AgentConfig(answer_schema=PERSON, max_corrections=2, tools={"flaky": ToolPolicy(retries=1, backoff_s=0)})
    return Agent(BackendPolicy(backend), [add, lookup, flaky], config)


def comparable(state: AgentState) -> dict:
    data = state.to_dict()
    data.pop("elapsed_s")
    for attempt in data["trace"]:
        attempt.pop("elapsed_s")
    for turn in data["turns"]:
        for result in turn["tool_results"]:
            result.pop("elapsed_s")
    return data


def test_resume_from_every_step_boundary_equals_an_uninterrupted_run(tokenizer, tmp_path):
    reference = build_agent(tokenizer).run("How old was Ada?", key="t1")
    assert reference.status == "answered" and reference.answer == {"age": 36}
    total = reference.counters.steps
    assert total > 15
    for stop_after in range(total):
        first = build_agent(tokenizer).run("How old was Ada?", key="t1", max_steps=stop_after)
        assert first.counters.steps == stop_after and not first.finished
        path = tmp_path / f"state-{stop_after}.json"
        first.save(path)
        restored = AgentState.load(path)
        resumed = build_agent(tokenizer, served=restored.counters.model_calls).run(restored)
        assert comparable(resumed) == comparable(reference), f"resume after step {stop_after} differs"


def test_state_holds_pending_calls_at_the_boundary(tokenizer):
    state = build_agent(tokenizer).run("q", key="t1", max_steps=1)
    data = json.loads(state.to_json())
    assert data["phase"] == "calling_tools"
    assert data["pending_calls"] == [{"name": "lookup", "arguments": {"query": "Ada"}, "raw": TURNS[0], "id": None}]
    state = build_agent(tokenizer).run("q", key="t1", max_steps=2)
    assert json.loads(state.to_json())["pending_results"][0]["content"] == "fact about Ada"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{oops", "agent state is not valid JSON"),
        ('{"version": 99}', "not an agent state of version 1"),
        ('{"version": 1, "phase": "dreaming"}', "unknown phase 'dreaming'"),
        ('{"version": 1, "phase": "done", "bogus": 1}', "malformed agent state"),
    ],
)
def test_bad_state_files_fail_with_one_line(text, message):
    with pytest.raises(StateError, match=message):
        AgentState.from_json(text)


def test_a_finished_state_does_not_step_again(tokenizer):
    agent = build_agent(tokenizer)
    state = agent.run("q", key="t1")
    before = comparable(state)
    agent.step(state)
    assert comparable(state) == before
