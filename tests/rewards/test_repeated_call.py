"""The repeated-call detector on hand-built episodes (two identical calls pass, three
are flagged, different expressions are not, spacing does not hide a repeat, JSON
`<tool_call>`s count), its per-step rates, its shaping penalty with hand-computed
totals, and the math environment stopping a loop at env.options.max_repeated_calls."""

from __future__ import annotations

import pytest

from ponder.config import RewardConfig, RolloutConfig, SamplingConfig, ShapingConfig, load_recipe
from ponder.envs.math import MathEnv
from ponder.models import tiny_tokenizer
from ponder.rewards import CompositeReward
from ponder.rewards.hacking import hacking_metrics, most_repeated_call, repeated_call
from ponder.rewards.math import answer_format, correct
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.step import REPEATED_CALL, RepeatedCalls, call_key
from ponder.types import Task, ToolCall, ToolResult, Trajectory, Turn
from ponder.wiring import build_env

TASK = Task("t", "What is 12 * 7 + 3?", ["87"], kind="level2", metadata={"needs_search": False})


def calling(*expressions: str, answer: str | None = None, stop: str = "max_turns") -> Trajectory:
    """One turn per calculator call (as the math env records them), then an optional answer."""
    turns = []
    for index, expression in enumerate(expressions):
        turn = Turn(index, f"<think>again</think><calculator>{expression}</calculator>")
        turn.tool_calls.append(ToolCall("calculator", {"expression": expression}))
        turn.tool_results.append(ToolResult("87", name="calculator"))
        turns.append(turn)
    if answer is not None:
        turns.append(Turn(len(turns), f"<answer>{answer}</answer>", answer=answer))
        stop = "answer"
    return Trajectory("t", [1], turns=turns, stop_reason=stop)


def test_two_identical_calls_pass_and_three_are_flagged():
    assert not repeated_call(calling("12*7+3", "12*7+3", answer="87"))
    assert repeated_call(calling("12*7+3", "12*7+3", "12*7+3"))
    assert most_repeated_call(calling("12*7+3", "12*7+3", "12*7+3")) == 3
    assert not repeated_call(calling("12*7", "84+3", "12*7+3"))  # different expressions
    assert most_repeated_call(calling()) == 0 and not repeated_call(calling(answer="87"))
    assert repeated_call(calling("12*7+3", "12*7+3"), k=2)  # k is the count that fires


def test_spacing_does_not_hide_a_repeat_but_words_stay_apart():
    assert repeated_call(calling("12*7+3", "12 * 7 + 3", " 12 *7+ 3\n"))
    assert call_key(ToolCall("calculator", {"expression": "(12 + 3) / 5"})) == call_key(
        ToolCall("calculator", {"expression": "(12+3)/5"})
    )
    search = lambda q: ToolCall("search", {"query": q})  # noqa: E731
    assert call_key(search("new  york")) == call_key(search("new york")) != call_key(search("newyork"))
    assert call_key(search("paris")) != call_key(ToolCall("lookup", {"query": "paris"}))  # another tool


def test_calls_written_in_the_text_count_when_the_turns_recorded_none():
    json_call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}</tool_call>'
    reordered = '<tool_call>{"arguments": {"unit": "C", "city":  "Oslo"}, "name": "get_weather"}</tool_call>'
    loop = Trajectory("t", [1], turns=[Turn(0, json_call), Turn(1, reordered), Turn(2, json_call)])
    assert most_repeated_call(loop) == 3 and repeated_call(loop)
    untagged = Trajectory("t", [1], turns=[Turn(i, "<calculator>2+2</calculator>") for i in range(3)])
    assert repeated_call(untagged)  # the calculator was not offered: the loop is still a loop
    assert not repeated_call(Trajectory("t", [1], turns=[Turn(0, "<tool_call>{not json</tool_call>")] * 3))


def test_an_episode_the_environment_stopped_is_flagged():
    stopped = calling("12*7+3", "12*7+3", stop=REPEATED_CALL)
    assert most_repeated_call(stopped) == 2 and repeated_call(stopped)


def test_step_rates():
    batch = [calling("1+1", "1+1", "1+1"), calling("1+1", "1+1", answer="2"), calling("2+2", stop=REPEATED_CALL),
             calling("3+3", "4+4", answer="8")]  # fmt: skip
    metrics = hacking_metrics(batch, {})
    assert metrics["hacking/repeated_call"] == 0.5
    assert metrics["hacking/repeated_call_stop"] == 0.25
    assert hacking_metrics(batch, {}, ShapingConfig(repeated_call_k=2))["hacking/repeated_call"] == 0.75


def test_the_shaping_penalty_with_hand_computed_totals():
    reward = CompositeReward.from_config(
        RewardConfig(shaping=ShapingConfig(repeated_call=0.4)), {"correct": correct, "format": answer_format},
        {"correct": 1.0, "format": 0.1},
    )  # fmt: skip
    assert reward.weights["shaping/repeated_call"] == -0.4
    total, breakdown = reward(calling("12*7+3", "12*7+3", "12*7+3", answer="87"), TASK)
    assert breakdown["shaping/repeated_call"] == 1.0
    assert total == pytest.approx(1.0 + 0.1 - 0.4)  # right and well formatted, but looped
    total, breakdown = reward(calling("12*7+3", "12*7+3", answer="87"), TASK)
    assert breakdown["shaping/repeated_call"] == 0.0 and total == pytest.approx(1.1)
    stopped = calling("12*7+3", "12*7+3", stop=REPEATED_CALL)
    assert reward(stopped, TASK)[0] == pytest.approx(0.0 + 0.1 * answer_format(stopped, TASK) - 0.4)
    off = CompositeReward.from_config(RewardConfig(), {"correct": correct}, {"correct": 1.0})
    assert "shaping/repeated_call" not in off.weights


def test_repeated_calls_counts_and_stops_at_the_limit():
    repeats = RepeatedCalls(3)
    same = ToolCall("calculator", {"expression": "1+1"})
    assert repeats.check([same]) is None and repeats.check([ToolCall("calculator", {"expression": "1 + 1"})]) is None
    assert repeats.check([same]) is same  # the third: reported, and not counted
    assert repeats.counts[call_key(same)] == 2
    assert RepeatedCalls(2).check([same, same]) is same  # two in one action reach a limit of 2
    off = RepeatedCalls(0)
    assert all(off.check([same]) is None for _ in range(10))


def test_the_math_env_stops_the_loop_without_running_the_call_again():
    env = MathEnv(calculator_on=True, max_turns=10, max_repeated_calls=3)
    env.reset(TASK)
    action = "<think>compute</think><calculator>12*7+3</calculator>"
    observation, done, info = env.step(action)
    assert observation == "\n\n<result>87</result>\n\n" and not done
    observation, done, _ = env.step("<calculator>12 * 7 + 3</calculator>")  # the same call, spaced
    assert not done
    observation, done, info = env.step(action)
    assert done and info["stop_reason"] == REPEATED_CALL and info["metrics"] == {"repeated_call_stop": 1.0}
    turn = info["turn"]
    assert turn.error == observation == "stopped: the same calculator call (<calculator>12*7+3</calculator>) " \
                                        "was made 3 times without an answer"
    assert [r.is_error for r in turn.tool_results] == [True] and turn.tool_results[0].content.startswith("not run")
    env.reset(TASK)  # a new episode starts counting again
    assert not env.step(action)[1] and not env.step(action)[1]


def test_max_repeated_calls_ends_episodes_through_the_engine_and_the_metrics_see_it():
    recipe = load_recipe(None, ["env.kind=math", "env.max_turns=6",
                                "env.options={n_train: 2, n_eval: 2, max_repeated_calls: 3}"])  # fmt: skip
    spec = build_env(recipe)
    loop = ["<calculator>2+2</calculator>"] * 6
    backend = ScriptedBackend(tiny_tokenizer(), {t.id: loop for t in spec.eval})
    rollout = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=64))
    trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(spec.eval)
    assert [t.stop_reason for t in trajectories] == [REPEATED_CALL] * 2
    assert [len(t.turns) for t in trajectories] == [3, 3]  # two calls ran, the third ended it
    assert all(t.metrics["repeated_call_stop"] == 1.0 for t in trajectories)
    assert [sum(not r.is_error for turn in t.turns for r in turn.tool_results) for t in trajectories] == [2, 2]
    metrics = hacking_metrics(trajectories, {t.id: t for t in spec.eval})
    assert metrics["hacking/repeated_call"] == metrics["hacking/repeated_call_stop"] == 1.0
    off = build_env(load_recipe(None, ["env.kind=math", "env.max_turns=6", "env.options={n_train: 2, n_eval: 2}"]))
    fresh = ScriptedBackend(tiny_tokenizer(), {t.id: loop for t in off.eval})
    unstopped, _ = RolloutEngine(fresh, off.factory, rollout).run(off.eval)
    assert [(t.stop_reason, len(t.turns)) for t in unstopped] == [("max_turns", 6)] * 2
