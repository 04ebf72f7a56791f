"""The composite agent reward on hand-built episodes."""

import pytest

from ponder.config import AgentRewardConfig
from ponder.rewards.agent import AgentReward, tool_selection_f1
from ponder.types import Task, ToolCall, Trajectory, Turn

SEARCH_TASK = Task("t1", "Where was Ann born?", ["Oslo"], metadata={"needs_search": True},
                   oracle_actions=["<search>Ann</search>", "<answer>Oslo</answer>"])  # fmt: skip
IN_PROMPT = Task(
    "t2", "Where was Ann born?", ["Oslo"], metadata={"needs_search": False}, oracle_actions=["<answer>Oslo</answer>"]
)


def _episode(*turns):
    return Trajectory("t", [0], turns=list(turns))


def _search(query="Ann", name="search"):
    return Turn(0, f"<search>{query}</search>", "info", tool_calls=[ToolCall(name, {"query": query})])


def _answer(text="Oslo"):
    return Turn(1, f"<answer>{text}</answer>", answer=text)


def test_tool_selection_f1_by_hand():
    assert tool_selection_f1(set(), set()) == 1.0
    assert tool_selection_f1({"search"}, set()) == 0.0
    assert tool_selection_f1({"search", "calc"}, {"search"}) == pytest.approx(2 * 0.5 * 1.0 / 1.5)


def test_optimal_episode_earns_every_component_and_no_penalty():
    reward = AgentReward.from_config(AgentRewardConfig())
    total, breakdown = reward(_episode(_search(), _answer()), SEARCH_TASK)
    assert breakdown == {
        "completion": 1.0, "tool_f1": 1.0, "efficiency": 1.0, "timing": 1.0, "format": 1.0,
        "penalty/wrong_tool": 0.0, "penalty/redundant_call": 0.0, "penalty/format_error": 0.0, "penalty/timeout": 0.0,
    }  # fmt: skip
    assert total == pytest.approx(1.0 + 0.2 + 0.2 + 0.2 + 0.1)
    assert reward.feedback(_episode(_search(), _answer()), SEARCH_TASK) == "answer correct"


def test_named_penalties_and_their_weights():
    reward = AgentReward(
        {"completion": 1.0, "wrong_tool": -0.5, "redundant_call": -0.25, "format_error": -1.0}
    )
    bad_turn = Turn(2, "<search>", error="unclosed <search>")
    episode = _episode(_search(), _search(), _search("x", name="calc"), bad_turn, _answer())
    total, breakdown = reward(episode, SEARCH_TASK)
    assert breakdown["penalty/wrong_tool"] == 1.0  # calc is not a target
    assert breakdown["penalty/redundant_call"] == 1.0  # the repeated identical search
    assert breakdown["penalty/format_error"] == 1.0
    assert breakdown["efficiency"] == pytest.approx(2 / 5)
    assert total == pytest.approx(1.0 - 0.5 - 0.25 - 1.0)
    text = reward.feedback(episode, SEARCH_TASK)
    assert "1 call(s) to a tool outside search" in text and "5 steps where 2 suffice" in text


def test_timing_rewards_not_calling_when_the_answer_is_in_the_prompt():
    reward = AgentReward({"timing": 1.0, "timeout": -1.0})
    assert reward(_episode(_answer()), IN_PROMPT)[0] == 1.0
    called, breakdown = reward(_episode(_search(), _answer()), IN_PROMPT)
    assert called == 0.0 and breakdown["tool_f1"] == 0.0
    assert reward(_episode(_search()), SEARCH_TASK) == (
        -1.0 + 1.0,
        reward(_episode(_search()), SEARCH_TASK)[1],
    )
    assert "should have called search" in reward.feedback(_episode(_answer()), SEARCH_TASK)


def test_unknown_terms_are_rejected():
    with pytest.raises(ValueError, match="unknown agent reward term"):
        AgentReward({"speed": 1.0})
