"""The judge reward against a real `ponder serve` (tiny model + a grader adapter trained
here to answer the judge's rubric prompts by heart), through the `openai` client: a
well-formed score, a second score, and no score at all, end to end."""

from __future__ import annotations

import pytest
import torch

from .conftest import running_server, train_adapter
from ponder.config import load_recipe
from ponder.models.adapters import save_trained
from ponder.rewards.judge import JudgeParseError
from ponder.serve import ServeConfig
from ponder.types import Task, Trajectory, Turn
from ponder.wiring import build_env, build_reward

TASK = Task("t", "What is 7 + 5?", ["12"])
# Responses far apart in their tokens, so the tiny adapter tells the four prompts apart.
RIGHT, WRONG, TWO, NONE = "<answer>12</answer>", "I guess thirteen", "perhaps fourteen, or so", "no idea at all!"
REPLIES = {RIGHT: "Score: 9", WRONG: "Score: 2", TWO: "Score: 2, or maybe Score: 8", NONE: "It is hard to say."}


# A short rubric (reward.judge.rubric) the tiny adapter can learn by heart in seconds.
RUBRIC = "Grade from {low} to {high} the answer to {question}: {response}"


def prompt(response: str) -> str:
    return RUBRIC.format(question=TASK.question, response=response, low=1, high=10, reference="12")


@pytest.fixture(scope="module")
def grader_url(tmp_path_factory):
    transcripts = [({"messages": [{"role": "user", "content": prompt(r)}]}, reply) for r, reply in REPLIES.items()]
    path = tmp_path_factory.mktemp("grader") / "grader"
    torch.manual_seed(0)  # the LoRA's A matrices
    save_trained(train_adapter(transcripts, steps=200, model="grader"), path)
    config = ServeConfig(model="tiny", adapters={"grader": str(path)}, max_tokens_limit=64, batch_window_ms=5)
    with running_server(config) as running:
        yield running.url


def judge_reward(url: str, on_unparsable: str):
    recipe = load_recipe(None, ["model.name=tiny", "env.kind=math", "env.options.n_train=4", "env.options.n_eval=2",
                                "reward.judge.weight=1.0", f"reward.judge.url={url}", "reward.judge.model=grader",
                                "reward.judge.max_tokens=32", f"reward.judge.on_unparsable={on_unparsable}",
                                "reward.terms.correct=0", "reward.terms.format=0"])  # fmt: skip
    recipe.reward.judge.rubric = RUBRIC
    return build_reward(recipe, build_env(recipe))


def episode(response: str) -> Trajectory:
    return Trajectory("t", [1], turns=[Turn(0, response)])


def test_served_judge_scores_and_refuses_malformed_replies(grader_url):
    reward = judge_reward(grader_url, "none")
    judge = reward.components["judge"]
    assert reward(episode(RIGHT), TASK)[0] == pytest.approx(8 / 9)
    assert reward(episode(WRONG), TASK)[0] == pytest.approx(1 / 9)
    assert judge.judged == 2 and not judge.hackable
    for malformed in (TWO, NONE):  # two scores; none
        total, breakdown = reward(episode(malformed), TASK)
        assert total is None and "judge" not in breakdown
    assert judge.unparsable == 2


def test_served_judge_with_on_unparsable_error_names_the_reply(grader_url):
    reward = judge_reward(grader_url, "error")
    with pytest.raises(JudgeParseError, match=r"task t: the judge gave 2 different scores \[2.0, 8.0\]"):
        reward(episode(TWO), TASK)
    with pytest.raises(JudgeParseError, match="task t: no score in the judge's reply: 'It is hard to say.'"):
        reward(episode(NONE), TASK)
