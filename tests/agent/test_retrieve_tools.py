"""The `retrieve_tools` step: each turn shows the policy only the top-k retrieved tools,
and the turn records which tools were offered."""

from ponder.agent import Agent, AgentConfig, BackendPolicy
from ponder.agent.state import AgentState
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools.retrieval.toolindex import ToolIndex
from ponder.types import Trajectory

from .conftest import add, call, lookup


def _agent(tokenizer, turns, topk):
    backend = ScriptedBackend(tokenizer, {"t1": list(turns)})
    index = ToolIndex([add.spec, lookup.spec], kind="bm25")
    config = AgentConfig(retrieve_tools_topk=topk)
    return Agent(BackendPolicy(backend), [add, lookup], config, tool_retriever=index)


def test_only_retrieved_tools_are_shown_and_recorded(tokenizer):
    agent = _agent(tokenizer, [call("add", a=2, b=3), "The sum is 5."], topk=1)
    seen = []
    agent.on_event = lambda kind, payload: seen.append(payload) if kind == "tools_offered" else None
    state = agent.run("Add two integers: 2 and 3", key="t1")
    assert state.answer == "The sum is 5."
    assert state.turns[0].offered_tools == ["add"]
    assert '"name": "add"' in state.messages[0]["content"]
    assert '"name": "lookup"' not in state.messages[0]["content"]
    assert seen[0] == ["add"]
    # the record survives JSON (resume) and Parquet-shaped rows (rollouts, RL)
    assert AgentState.from_json(state.to_json()).turns[0].offered_tools == ["add"]
    row = state.to_trajectory().to_row()
    assert Trajectory.from_row(row).turns[0].offered_tools == ["add"]


def test_topk_zero_shows_every_tool(tokenizer):
    agent = _agent(tokenizer, ["done"], topk=0)
    state = agent.run("Add two integers", key="t1")
    assert state.turns[0].offered_tools == []
    assert '"name": "lookup"' in state.messages[0]["content"] and '"name": "add"' in state.messages[0]["content"]
