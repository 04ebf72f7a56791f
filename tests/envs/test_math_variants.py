"""The out-of-distribution and adversarial math evaluation sets: the bait is never the
answer, a distractor leaves the answer alone, the rephrasings never occur in training,
the same seed gives the same tasks, and the reference solver still solves them all."""

from __future__ import annotations

import random

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.math import math_options
from ponder.envs.math_tasks import GENERATORS, generate_problems, math_splits
from ponder.envs.math_variants import (
    REPHRASED,
    lure_taken,
    question_skeleton,
    rephrase,
    variant_tasks,
)
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.builtin import evaluate_expression
from ponder.types import Trajectory, Turn
from ponder.wiring import build_env, build_reward

LEVELS = [1, 2, 3, 4]


def tasks(variant: str, seed: int = 0, n: int = 200):
    return variant_tasks(variant, seed, n, LEVELS, None, True, 1)


def test_every_training_template_has_a_rephrasing():
    rng = random.Random(0)
    templates = {(level, GENERATORS[level](rng).template) for level in LEVELS for _ in range(200)}
    assert templates == set(REPHRASED)


@pytest.mark.parametrize("variant", ["ood", "distractor", "bait"])
def test_variants_keep_the_held_out_problems_and_their_answers(variant):
    _, plain = math_splits(0, 64, 200, LEVELS, None, True, 1)
    changed = tasks(variant)
    assert [t.metadata["base_question"] for t in changed] == [t.question for t in plain]
    assert [t.answers for t in changed] == [t.answers for t in plain]
    assert [t.kind for t in changed] == [t.kind for t in plain]
    assert all(t.id.startswith(f"math-{variant}-") and t.metadata["variant"] == variant for t in changed)
    for task in changed:  # the steps still compute the answer
        steps = task.metadata["steps"]
        assert all(evaluate_expression(expression) == value for _, expression, value in steps)
        assert str(steps[-1][2]) == task.answers[0]


def test_the_bait_is_never_the_answer_and_is_in_the_prompt():
    for seed in range(3):
        for task in tasks("bait", seed):
            bait = task.metadata["lure"]
            assert isinstance(bait, int) and str(bait) != task.answers[0]
            assert task.question.startswith(task.metadata["base_question"])
            assert task.question.endswith(f"{bait}.")


def test_a_distractor_adds_an_irrelevant_number_and_leaves_the_answer_alone():
    for task in tasks("distractor"):
        number, base = task.metadata["lure"], task.metadata["base_question"]
        assert str(number) != task.answers[0]
        assert str(number) not in base.split() and f"${number}" not in base
        assert all(str(number) not in expression.split() for _, expression, _ in task.metadata["steps"])
        added = set(task.question.split()) - set(base.split())
        assert any(str(number) in word for word in added)
        # the base question's words all survive, in order: only a sentence was inserted
        words = iter(task.question.split())
        assert all(word in words for word in base.split())


def test_the_rephrased_templates_never_occur_in_training():
    train, evaluation = math_splits(0, 2000, 200, LEVELS, None, True, 1)
    trained = {question_skeleton(t.question) for t in train + evaluation}
    rephrased = tasks("ood")
    assert not {t.question for t in rephrased} & {t.question for t in train}
    assert not {question_skeleton(t.question) for t in rephrased} & trained
    assert all(t.metadata["template"].startswith("ood-") for t in rephrased)


def test_rephrase_uses_every_value_of_the_problem():
    rng = random.Random(1)
    for problem in generate_problems(3, 300, LEVELS, None):
        question = rephrase(problem, rng).question
        for name, value in problem.values.items():
            shown = str(abs(value)) if (problem.level, name) == (4, "b") else str(value)
            assert shown in question, (problem.template, name, question)


@pytest.mark.parametrize("variant", ["ood", "distractor", "bait"])
def test_the_same_seed_gives_the_same_tasks(variant):
    first, again, other = tasks(variant, 7, 50), tasks(variant, 7, 50), tasks(variant, 8, 50)
    assert [(t.id, t.question, t.answers) for t in first] == [(t.id, t.question, t.answers) for t in again]
    assert [t.question for t in first] != [t.question for t in other]


def test_lure_taken_scores_answering_with_the_planted_number():
    task = tasks("bait", n=1)[0]

    def said(text: str) -> Trajectory:
        return Trajectory(task.id, [1], turns=[Turn(0, f"<answer>{text}</answer>", answer=text)])

    assert lure_taken(said(str(task.metadata["lure"])), task) == 1.0
    assert lure_taken(said(task.answers[0]), task) == 0.0
    assert lure_taken(said("1"), tasks("ood", n=1)[0]) is None  # no lure planted


def test_variant_is_an_env_option_checked_up_front():
    assert math_options({})["variant"] == "none"
    with pytest.raises(ValueError, match="variant for math: want one of none, ood, distractor, bait"):
        math_options({"variant": "adversarial"})


@pytest.mark.parametrize("variant", ["ood", "distractor", "bait"])
def test_the_reference_solver_solves_every_variant(variant):
    options = f"env.options={{n_train: 4, n_eval: 24, variant: {variant}}}"
    recipe = load_recipe(None, ["env.kind=math", options])
    spec = build_env(recipe)
    assert all(t.id.startswith(f"math-{variant}-") for t in spec.eval)
    assert not any(t.id.startswith("math-eval") for t in spec.eval) and len(spec.train) == 4
    backend = ScriptedBackend(tiny_tokenizer(), {t.id: t.oracle_actions for t in spec.eval})
    rollout = RolloutConfig(group_size=1, batch_size=8, sampling=SamplingConfig(max_new_tokens_per_turn=512))
    trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(spec.eval)
    score_trajectories(trajectories, {t.id: t for t in spec.eval}, build_reward(recipe, spec))
    assert [t.reward for t in trajectories] == pytest.approx([1.1] * 24)
    lured = [t.breakdown.get("lure_taken") for t in trajectories]
    assert lured == ([None] * 24 if variant == "ood" else [0.0] * 24)
