"""The judge reward: parsing malformed replies (never a silent 0), pairwise position-bias
control, and the self-judge on a real local policy."""

from __future__ import annotations

import pytest

from ponder.config import JudgeConfig, load_recipe
from ponder.rewards.judge import JudgeParseError, JudgeReward, pairwise, parse_score, parse_verdict
from ponder.types import Task, Trajectory, Turn

TASK = Task("t", "What is 7 + 5?", ["12"], oracle_actions=["<think>7 + 5 = 12.</think><answer>12</answer>"])


def answered(text: str) -> Trajectory:
    return Trajectory("t", [1], turns=[Turn(0, text, answer=None)])


@pytest.mark.parametrize("reply, score", [
    ("Score: 7", 7.0), ("score = 7/10", 7.0), ("The rating is 3.", 3.0), ("[[10]]", 10.0),
    ("**Score:** 8", 8.0), ("Score: 6. To repeat, Score: 6", 6.0), ("Score: 1", 1.0),
])  # fmt: skip
def test_parse_score_reads_the_one_score(reply, score):
    assert parse_score(reply, 1, 10) == score


@pytest.mark.parametrize("reply, message", [
    ("The answer looks right to me.", "no score in the judge's reply: 'The answer looks right to me.'"),
    ("", "no score"),
    ("Score: 7. On reflection, Score: 3", r"2 different scores \[3.0, 7.0\]"),
    ("Score: 11", r"judge score 11 outside \[1, 10\]"),
    ("Score: 0", r"judge score 0 outside \[1, 10\]"),
    ("Score: -2", "outside"),
    ("Score: 4/5", "judge scored on /5, not /10"),
])  # fmt: skip
def test_parse_score_refuses_malformed_replies(reply, message):
    with pytest.raises(JudgeParseError, match=message):
        parse_score(reply, 1, 10)


def test_parse_verdict():
    assert parse_verdict("B is better.\nVerdict: B") == "B"
    assert parse_verdict("[[A]]") == "A" and parse_verdict("Verdict: tie") == "tie"
    with pytest.raises(JudgeParseError, match="no verdict"):
        parse_verdict("Both are fine.")
    with pytest.raises(JudgeParseError, match=r"different verdicts \['A', 'B'\]"):
        parse_verdict("Verdict: A ... actually Verdict: B")


def judge_that(choose):
    """A judge as a function of the prompt (the canned stand-in for a model in unit tests)."""

    def complete(messages):
        prompt = messages[0]["content"]
        first = prompt.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
        return f"Verdict: {choose(first)}"

    return complete


def test_pairwise_asks_both_orders_and_flags_position_bias():
    fair = pairwise(judge_that(lambda first: "A" if first == "good" else "B"), "q", "good", "bad")
    assert (fair.prefer_first, fair.consistent, fair.verdicts) == (1.0, True, ("A", "B"))
    assert pairwise(judge_that(lambda first: "A" if first == "good" else "B"), "q", "bad", "good").prefer_first == 0.0
    biased = pairwise(judge_that(lambda first: "A"), "q", "good", "bad")  # always the first slot
    assert (biased.prefer_first, biased.consistent) == (0.5, False)


def test_pairwise_reward_counts_disagreements():
    reward = JudgeReward(judge_that(lambda first: "A"), JudgeConfig(pairwise=True))
    assert reward(answered("<answer>12</answer>"), TASK) == 0.5
    assert reward.position_disagreements == 1


def test_unparsable_reply_is_none_or_an_error_never_zero():
    rambling = lambda messages: "Looks fine."  # noqa: E731
    lenient = JudgeReward(rambling, JudgeConfig(on_unparsable="none"))
    assert lenient(answered("<answer>12</answer>"), TASK) is None
    assert (lenient.unparsable, lenient.judged) == (1, 0)
    strict = JudgeReward(rambling, JudgeConfig(on_unparsable="error"))
    with pytest.raises(JudgeParseError, match="task t: no score in the judge's reply: 'Looks fine.'"):
        strict(answered("<answer>12</answer>"), TASK)
    with pytest.raises(ValueError, match="on_unparsable: 'zero'; valid: none, error"):
        JudgeReward(rambling, JudgeConfig(on_unparsable="zero"))


def test_scores_map_onto_zero_one():
    reward = JudgeReward(lambda messages: "Score: 4", JudgeConfig(scale_min=1, scale_max=10))
    assert reward(answered("x"), TASK) == pytest.approx(3 / 9)


def test_self_judge_runs_the_policy_and_is_labelled_hackable():
    from ponder.models import tiny_policy
    from ponder.wiring import build_env, build_reward

    recipe = load_recipe(None, ["model.name=tiny", "env.kind=math", "env.options.n_train=4", "env.options.n_eval=2",
                                "reward.judge.weight=0.5", "reward.judge.self_judge=true",
                                "reward.judge.max_tokens=8"])  # fmt: skip
    policy = tiny_policy()
    reward = build_reward(recipe, build_env(recipe), policy)
    judge = reward.components["judge"]
    assert judge.hackable and reward.weights["judge"] == 0.5
    total, breakdown = reward(answered("<answer>12</answer>"), TASK)
    # the random model writes no score: the episode is unscorable and counted, not scored 0
    assert total is None and "judge" not in breakdown and judge.unparsable == 1


def test_judge_needs_exactly_one_source():
    from ponder.wiring import build_judge

    for overrides in ([], ["reward.judge.url=http://127.0.0.1:9/v1", "reward.judge.self_judge=true"]):
        recipe = load_recipe(None, ["reward.judge.weight=1", *overrides])
        with pytest.raises(ValueError, match="set exactly one of url"):
            build_judge(recipe)
