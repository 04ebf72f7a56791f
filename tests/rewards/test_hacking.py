"""Reward-hacking detectors on hand-built episodes that must and must not trigger them,
and shaping penalties with hand-computed totals."""

from __future__ import annotations

import math

import pytest

from ponder.config import RewardConfig, ShapingConfig, load_recipe
from ponder.envs.math import REWARD_WEIGHTS
from ponder.rewards import CompositeReward
from ponder.rewards.hacking import (
    HackingMonitor,
    answer_guessing,
    answer_hedging,
    format_gaming,
    hacking_metrics,
    judge_exploitation,
    math_work,
    repeated_ngram_ratio,
    repetition,
    shown_steps,
    truncated,
)
from ponder.rewards.math import VERBOSE_WORDS, answer_format, contains_answer, correct, verbosity
from ponder.types import Task, ToolCall, ToolResult, Trajectory, Turn
from ponder.wiring import build_env, build_reward

TASK = Task("t", "Noah has 7 pens and gets 5 more. How many?", ["12"], kind="level1", metadata={"needs_search": False})
EQUATION = Task("e", "Solve for x: 7x + 12 = 47.", ["5"], kind="level4", metadata={"needs_search": False})


def episode(*actions: str, answer: str | None = None, stop: str = "answer", task_id: str = "t", reward=None,
            calls: list[tuple[str, str]] = (), breakdown=None) -> Trajectory:  # fmt: skip
    turns = [Turn(i, action) for i, action in enumerate(actions)]
    for expression, result in calls:
        turns[0].tool_calls.append(ToolCall("calculator", {"expression": expression}))
        turns[0].tool_results.append(ToolResult(result, name="calculator"))
    turns[-1].answer = answer
    return Trajectory(task_id, [1], turns=turns, stop_reason=stop, reward=reward, breakdown=dict(breakdown or {}))


def test_shown_steps_check_the_arithmetic():
    steps = shown_steps("7x = 47 - 12 = 35. x = 35 / 7 = 5. Oops 3 + 4 = 8.")
    assert [(e, str(v), ok) for e, v, ok in steps] == [("47 - 12", "35", True), ("35 / 7", "5", True),
                                                       ("3 + 4", "8", False)]  # fmt: skip


def test_an_expression_on_the_right_is_no_claimed_result():
    assert shown_steps("16 * 9 = 16 * 9. Then 12 * 3 = 33.") == [("12 * 3", 33, False)]


def test_worked_answer_is_not_a_guess():
    worked = episode("<think>Total: 7 + 5 = 12.</think>\n<answer>12</answer>", answer="12")
    assert math_work(worked).values == {12}
    assert answer_guessing(worked, TASK) is False


def test_calculator_result_counts_as_work():
    called = episode("<think>Add.</think><calculator>7+5</calculator>", "<answer>12</answer>", answer="12",
                     calls=[("7+5", "12")])  # fmt: skip
    assert answer_guessing(called, TASK) is False


def test_bare_right_answer_is_a_guess():
    assert answer_guessing(episode("<answer>12</answer>", answer="12"), TASK) is True


def test_right_answer_with_false_step_is_a_guess():
    wrong_work = episode("<think>7 + 5 = 13, so 12.</think><answer>12</answer>", answer="12")
    assert answer_guessing(wrong_work, TASK) is True
    unrelated = episode("<think>7 * 5 = 35.</think><answer>12</answer>", answer="12")
    assert answer_guessing(unrelated, TASK) is True  # true step, but it does not reach the answer


def test_wrong_answer_and_non_math_tasks_are_not_guesses():
    assert answer_guessing(episode("<answer>13</answer>", answer="13"), TASK) is False
    qa = Task("q", "Capital of France?", ["Paris"])
    assert answer_guessing(episode("<answer>Paris</answer>", answer="Paris"), qa) is None


def test_a_number_read_from_a_tool_or_the_context_is_no_guess():
    year = Task("y", "In what year was Acme founded?", ["1984"], kind="single_hop")
    searched = episode("<search>Acme</search>", "<answer>1984</answer>", answer="1984")
    searched.turns[0].tool_calls.append(ToolCall("search", {"query": "Acme"}))
    searched.turns[0].tool_results.append(ToolResult("Acme was founded in 1984 by Ada Lin.", name="search"))
    assert answer_guessing(searched, year) is False
    assert answer_guessing(episode("<answer>1984</answer>", answer="1984"), year) is True  # no search: a guess
    in_prompt = Task("p", year.question, ["1984"], context="Acme was founded in 1984.", metadata={"needs_search": False})
    assert answer_guessing(episode("<answer>1984</answer>", answer="1984"), in_prompt) is False
    # a failed tool result or another number read does not make the answer read
    failed = episode("<search>Acme</search>", "<answer>1984</answer>", answer="1984")
    failed.turns[0].tool_calls.append(ToolCall("search", {"query": "Acme"}))
    failed.turns[0].tool_results.append(ToolResult("1984: no such index", name="search", is_error=True))
    assert answer_guessing(failed, year) is True
    other = Task("o", year.question, ["1984"], context="Acme was founded in 1985.")
    assert answer_guessing(episode("<answer>1984</answer>", answer="1984"), other) is True


def test_equation_steps_reach_the_answer():
    solved = episode("<think>7x = 47 - 12 = 35. x = 35 / 7 = 5.</think><answer>5</answer>", answer="5")
    assert answer_guessing(solved, EQUATION) is False


def test_hedging_fires_on_several_distinct_numbers_and_the_hackable_reward_pays_them():
    hedged = episode("<answer>7, 12 or 35</answer>", answer="7, 12 or 35")
    assert answer_hedging(hedged) is True
    assert contains_answer(hedged, TASK) == 1.0 and correct(hedged, TASK) == 0.0  # paid, not right
    single = episode("<answer>12</answer>", answer="12")
    assert answer_hedging(single) is False and contains_answer(single, TASK) == correct(single, TASK) == 1.0
    assert answer_hedging(episode("<answer>12 apples, so 12</answer>", answer="12 apples, so 12")) is False
    assert answer_hedging(episode("<answer>twelve</answer>", answer="twelve")) is None  # no number
    assert answer_hedging(episode("<think>7 + 5 = 12</think>")) is None  # no answer
    assert contains_answer(episode("<answer>13 or 14</answer>", answer="13 or 14"), TASK) == 0.0
    # shaped: the hedged answer's 1.0 is cut by the penalty, the single right one keeps it
    reward = CompositeReward.from_config(
        RewardConfig(shaping=ShapingConfig(hedging=0.5)), {"contains_answer": contains_answer}, {"contains_answer": 1.0}
    )  # fmt: skip
    assert reward(hedged, TASK)[0] == pytest.approx(0.5) and reward(single, TASK)[0] == pytest.approx(1.0)
    rates = hacking_metrics([hedged, single, episode("no answer")], {"t": TASK})
    assert rates["hacking/answer_hedging"] == 0.5  # 1 of the 2 episodes with a numeric answer


def test_the_length_biased_judge_pays_words_and_shaping_charges_the_loop():
    words = lambda n: " ".join(f"w{i}" for i in range(n))  # noqa: E731
    assert VERBOSE_WORDS == 50
    assert verbosity(episode("<answer>12</answer>", answer="12"), TASK) == pytest.approx(1 / 50)
    assert verbosity(episode(words(20), words(5)), TASK) == pytest.approx(0.5)  # words of every turn
    assert verbosity(episode(words(80)), TASK) == 1.0  # capped
    loop = episode("<think>" + " ".join(["so 7 + 5 is"] * 20) + "</think><answer>12</answer>", answer="12")
    plain = episode("<think>" + words(60) + "</think><answer>12</answer>", answer="12")
    assert verbosity(loop, TASK) == verbosity(plain, TASK) == 1.0 and correct(loop, TASK) == 1.0
    assert repetition(loop) and not repetition(plain)
    reward = CompositeReward.from_config(
        RewardConfig(shaping=ShapingConfig(repetition=1.0, truncation=1.0)), {"verbosity": verbosity},
        {"verbosity": 1.0},
    )  # fmt: skip
    cut = episode(words(60), stop="max_tokens")
    assert [reward(t, TASK)[0] for t in (loop, plain, cut)] == pytest.approx([0.0, 1.0, 0.0])


def test_judge_unverified_charges_paid_but_wrong_and_asks_the_judge_once():
    calls = []

    def judge(trajectory, task):
        calls.append(trajectory)
        return verbosity(trajectory, task)

    shaping = ShapingConfig(judge="verbosity", verified="correct", judge_unverified=1.0)
    components = {"verbosity": judge, "correct": correct}
    weights = {"verbosity": 1.0, "correct": 0.0}
    reward = CompositeReward.from_config(RewardConfig(shaping=shaping), components, weights)
    long = "<think>" + " ".join(f"w{i}" for i in range(60)) + "</think>"
    right, wrong = (episode(f"{long}<answer>{n}</answer>", answer=n) for n in ("12", "13"))
    short_wrong = episode("<answer>13</answer>", answer="13")
    totals = [reward(t, TASK) for t in (right, wrong, short_wrong)]
    assert [total for total, _ in totals] == pytest.approx([1.0, 0.0, 0.0])  # wrong: the judge's pay back
    assert [b["shaping/judge_unverified"] for _, b in totals] == pytest.approx([0.0, 1.0, 1 / 50])
    assert len(calls) == 3  # once per episode, not again for the shaping rule
    for trajectory, (total, breakdown) in zip((right, wrong, short_wrong), totals):
        trajectory.reward, trajectory.breakdown = total, breakdown
    rates = hacking_metrics([right, wrong, short_wrong], {"t": TASK}, shaping)
    assert rates["hacking/judge_unverified_rate"] == pytest.approx(1 / 3)  # the metric and the rule agree


def test_judge_unverified_names_components_of_the_reward():
    recipe = load_recipe(None, ["env.kind=math", "env.options={n_train: 2, n_eval: 2}",
                                "reward.shaping.judge_unverified=1"])  # fmt: skip
    with pytest.raises(ValueError, match="reward.shaping.judge_unverified: no reward component 'judge'"):
        build_reward(recipe, build_env(recipe))
    recipe = load_recipe(None, ["env.kind=math", "env.options={n_train: 2, n_eval: 2}",
                                "reward.shaping.judge_unverified=1",
                                "reward.shaping.judge=verbosity"])  # fmt: skip
    assert build_reward(recipe, build_env(recipe)).weights["shaping/judge_unverified"] == -1.0


def test_format_gaming_fires_on_empty_tags_only():
    assert format_gaming(episode("<think></think><answer>12</answer>", answer="12"))
    assert format_gaming(episode("<think>ok</think><answer> . </answer>", answer=" . "))
    assert not format_gaming(episode("<think>Total: 7 + 5 = 12.</think><answer>12</answer>", answer="12"))
    assert not format_gaming(episode("12"))  # no tags at all is a format failure, not gaming


def test_repetition_ratio_and_detector():
    loop = "the answer is twelve " * 10
    assert repeated_ngram_ratio(loop, 4) == pytest.approx(1 - 4 / 37)
    assert repetition(episode(loop))
    prose = "Noah had seven pens and then he got five more so now he holds twelve pens in total today"
    assert repeated_ngram_ratio(prose, 4) == 0.0
    assert not repetition(episode(prose))
    assert repeated_ngram_ratio("a a a a a a a", 4) == 0.0  # shorter than 2n words: too short to judge


def test_truncation():
    assert truncated(episode("<think>7 + 5 =", stop="max_tokens"))
    assert not truncated(episode("<answer>12</answer>", answer="12"))
    assert not truncated(episode("<think>x</think>", stop="max_turns"))


def test_step_rates_and_length_correlation():
    batch = [
        episode("<answer>12</answer>", answer="12", reward=1.0),  # guess
        episode("<think>Total: 7 + 5 = 12.</think><answer>12</answer>", answer="12", reward=1.0),
        episode("<think></think><answer>13</answer>", answer="13", reward=0.0),  # format gaming
        episode("<think>" + "again and again and " * 8, stop="max_tokens", reward=0.0),  # loop, truncated
    ]
    for trajectory, tokens in zip(batch, (4, 12, 6, 40)):
        trajectory.turns[0].n_action_tokens = tokens
    metrics = hacking_metrics(batch, {"t": TASK})
    assert metrics["hacking/answer_guessing"] == 0.25
    assert metrics["hacking/format_gaming"] == 0.25
    assert metrics["hacking/repetition"] == 0.25
    assert metrics["hacking/truncation_rate"] == 0.25
    # rewards 1,1,0,0 against lengths 4,12,6,40: negative, computed by hand
    xs, ys = [4, 12, 6, 40], [1, 1, 0, 0]
    mx, my = 15.5, 0.5
    expected = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(
        sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)
    )
    assert metrics["hacking/length_reward_corr"] == pytest.approx(expected)
    assert "hacking/judge_unverified_rate" not in metrics


def test_length_gaming_fires_when_reward_follows_length():
    monitor = HackingMonitor(window=3)
    padded = [episode("<answer>1</answer>", answer="1", reward=float(r)) for r in (0, 0, 1, 1)]
    for trajectory, tokens in zip(padded, (10, 20, 60, 80)):
        trajectory.turns[0].n_action_tokens = tokens
    assert monitor.observe(hacking_metrics(padded, {}))["hacking/length_gaming"] == 1.0
    fair = [episode("<answer>1</answer>", answer="1", reward=float(r)) for r in (1, 0, 1, 0)]
    for trajectory, tokens in zip(fair, (10, 20, 60, 80)):
        trajectory.turns[0].n_action_tokens = tokens
    assert HackingMonitor(window=3).observe(hacking_metrics(fair, {}))["hacking/length_gaming"] == 0.0


def test_length_gaming_fires_when_truncation_rises():
    monitor = HackingMonitor(window=3, truncation_threshold=0.2)
    flags = [monitor.observe({"hacking/truncation_rate": rate})["hacking/length_gaming"] for rate in (0.0, 0.1, 0.3)]
    assert flags == [0.0, 0.0, 1.0]
    steady = HackingMonitor(window=3)
    assert [steady.observe({"hacking/truncation_rate": 0.3})["hacking/length_gaming"] for _ in range(3)] == [0.0] * 3


def judged(judge: float, verified: float) -> Trajectory:
    return episode("<answer>1</answer>", answer="1", reward=judge, breakdown={"judge": judge, "correct": verified})


def test_judge_exploitation_over_steps():
    monitor = HackingMonitor(window=3)
    flags = []
    for judge_score in (0.2, 0.5, 0.9):  # judge up, verified flat at 0
        step = hacking_metrics([judged(judge_score, 0.0), judged(judge_score, 0.0)], {})
        assert step["hacking/judge_unverified_rate"] == float(judge_score >= 0.5)
        flags.append(monitor.observe(step).get("hacking/judge_exploitation"))
    assert flags == [None, 1.0, 1.0]
    honest = HackingMonitor(window=3)
    for score in (0.2, 0.5, 0.9):  # judge and verifier rise together
        out = honest.observe(hacking_metrics([judged(score, score)], {}))
    assert out["hacking/judge_exploitation"] == 0.0
    assert judge_exploitation([0.1, 0.4, 0.8], [0.5, 0.5, 0.4])
    assert not judge_exploitation([0.1, 0.4, 0.8], [0.1, 0.3, 0.6])
    assert not judge_exploitation([0.5], [0.5])


def test_shaping_penalties_with_hand_computed_totals():
    shaping = ShapingConfig(guess=0.5, format_gaming=0.2, repetition=0.3)
    reward = CompositeReward.from_config(
        RewardConfig(shaping=shaping), {"correct": correct, "format": answer_format}, {"correct": 1.0, "format": 0.1}
    )
    guess = episode("<answer>12</answer>", answer="12")
    total, breakdown = reward(guess, TASK)
    assert total == pytest.approx(1.0 + 0.1 - 0.5)  # right, well formatted, guessed
    assert breakdown["shaping/guess"] == 1.0 and breakdown["shaping/format_gaming"] == 0.0
    gamed = episode("<think></think><answer>12</answer>", answer="12")
    assert reward(gamed, TASK)[0] == pytest.approx(1.0 + 0.1 - 0.5 - 0.2)
    worked = episode("<think>Total: 7 + 5 = 12.</think><answer>12</answer>", answer="12")
    assert reward(worked, TASK) == (pytest.approx(1.1), {"correct": 1.0, "format": 1.0, "shaping/guess": 0.0,
                                    "shaping/format_gaming": 0.0, "shaping/repetition": 0.0})  # fmt: skip
    assert "shaping/truncation" not in reward.weights  # a zero penalty adds no component


def test_shaping_is_off_by_default_and_refuses_negative_penalties():
    reward = CompositeReward.from_config(RewardConfig(), {"correct": correct}, {"correct": REWARD_WEIGHTS["correct"]})
    assert not any(name.startswith("shaping/") for name in reward.weights)
    with pytest.raises(ValueError, match="reward.shaping.guess: a penalty is >= 0"):
        CompositeReward.from_config(RewardConfig(shaping=ShapingConfig(guess=-1.0)), {}, {})
