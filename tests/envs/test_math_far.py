"""The `far` math split and the diversified training split: every training template has
far phrasings in two disjoint halves, the answers are the problems' own (recomputed
from their steps), no five-word window of a far question occurs in training, the
questions use words, units, new settings and distractors, and training told in
`train_variants` never equals an evaluation question."""

from __future__ import annotations

import random
import re

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.math import math_options
from ponder.envs.math_far import EVAL, FAR_DISTRACTORS, NUMBER_WORDS, PHRASINGS, TRAIN, far_rephrase
from ponder.envs.math_tasks import GENERATORS, generate_problems, math_splits
from ponder.envs.math_variants import VARIANTS, training_tasks, variant_tasks
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.builtin import evaluate_expression
from ponder.wiring import build_env, build_reward

LEVELS = [1, 2, 3, 4]
DIVERSE = ["none", "ood", "far"]


def words(text: str) -> list[str]:
    """Lower-case words with every number (digits or a number word) as `#`: a window
    that differs only in its numbers is the same wording."""
    tokens = re.findall(r"[a-z']+|#", re.sub(r"\d+", "#", text.lower()))
    return ["#" if token in NUMBER_WORDS else token for token in tokens]


def windows(text: str, n: int = 5) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def far(seed: int = 0, n: int = 400):
    return variant_tasks("far", seed, n, LEVELS, None, True, 1)


def test_every_training_template_has_far_phrasings_in_two_disjoint_halves():
    rng = random.Random(0)
    templates = {(level, GENERATORS[level](rng).template) for level in LEVELS for _ in range(300)}
    assert set(TRAIN) == set(EVAL) == templates
    for key in templates:
        assert len(EVAL[key]) >= 2 and len(TRAIN[key]) >= 2 and len(EVAL[key]) + len(TRAIN[key]) >= 4
        assert not {p.text for p in EVAL[key]} & {p.text for p in TRAIN[key]}
    assert not set(FAR_DISTRACTORS["train"]) & set(FAR_DISTRACTORS["eval"])
    assert "far" in VARIANTS


def test_far_keeps_the_held_out_problems_and_recomputes_their_answers():
    _, plain = math_splits(0, 64, 400, LEVELS, None, True, 1)
    changed = far()
    assert [t.metadata["base_question"] for t in changed] == [t.question for t in plain]
    assert [(t.answers, t.kind) for t in changed] == [(t.answers, t.kind) for t in plain]
    for task in changed:
        steps = task.metadata["steps"]
        assert all(evaluate_expression(expression) == value for _, expression, value in steps)
        assert str(steps[-1][2]) == task.answers[0]
        assert task.id.startswith("math-far-") and task.metadata["template"].startswith("far-")
        assert task.question != task.metadata["base_question"]


def test_no_five_word_window_of_a_far_question_occurs_in_training():
    train, _ = math_splits(0, 3000, 400, LEVELS, None, True, 1)
    diverse = training_tasks(DIVERSE, 0, 3000, 400, LEVELS, None, True, 1)  # ood and the train half of far
    trained = set().union(*(windows(t.question) for t in train + diverse))
    shared = {w for t in far() for w in windows(t.question) if w in trained}
    assert not shared, sorted(shared)[:5]


def test_far_uses_every_value_of_the_problem_in_digits_or_words():
    rng = random.Random(1)
    for problem in generate_problems(3, 400, LEVELS, None):
        question = far_rephrase(problem, rng)[0].question
        tokens = set(re.findall(r"[a-z]+|-?\d+", question.lower()))
        for name, value in problem.values.items():
            shown = abs(value) if (problem.level, name) == (4, "b") else value
            spoken = NUMBER_WORDS[shown] if 0 <= shown < len(NUMBER_WORDS) else None
            assert str(shown) in tokens or spoken in tokens, (problem.template, name, question)


def test_far_questions_change_numbers_units_settings_shape_and_add_distractors():
    tasks = far(n=600)
    questions = [t.question for t in tasks]
    spoken = sum(any(w in NUMBER_WORDS for w in re.findall(r"[a-z]+", q.lower())) for q in questions)
    assert spoken / len(questions) > 0.5
    for unit in (" kg", " km", " litres", " minutes", " hours", " cents", " euros"):
        assert any(unit in q for q in questions), unit
    for setting in ("bakery", "train", "garden", "library"):
        assert any(setting in q.lower() for q in questions), setting
    assert sum(q.startswith(("How", "What", "Which", "For how", "Tell")) for q in questions) > 60  # question first
    assert any(" were " in q and " by " in q for q in questions)  # the passive
    lured = [t for t in tasks if t.metadata["lure"] is not None]
    assert 0.25 < len(lured) / len(tasks) < 0.55
    for task in lured:  # the distractor's number is in the question, and is none of the problem's numbers
        lure = task.metadata["lure"]
        assert str(lure) in re.findall(r"\d+", task.question) and str(lure) != task.answers[0]
        assert lure not in task.metadata["values"].values()
        assert all(str(lure) not in e.split() and lure != v for _, e, v in task.metadata["steps"])


def test_the_same_seed_gives_the_same_far_tasks():
    first, again, other = far(7, 50), far(7, 50), far(8, 50)
    assert [(t.question, t.answers, t.metadata["lure"]) for t in first] == [
        (t.question, t.answers, t.metadata["lure"]) for t in again
    ]
    assert [t.question for t in first] != [t.question for t in other]


def test_train_variants_tell_the_training_problems_in_several_ways():
    plain, evaluation = math_splits(0, 600, 200, LEVELS, None, True, 1)
    diverse = training_tasks(DIVERSE, 0, 600, 200, LEVELS, None, True, 1)
    assert [t.metadata["base_question"] for t in diverse] == [t.question for t in plain]
    assert [(t.id, t.answers, t.kind) for t in diverse] == [(t.id, t.answers, t.kind) for t in plain]
    drawn = [t.metadata["variant"] for t in diverse]
    assert all(drawn.count(v) > 150 for v in DIVERSE)
    assert training_tasks(["none"], 0, 600, 200, LEVELS, None, True, 1)[5].question == plain[5].question
    assert [t.question for t in diverse] == [t.question for t in training_tasks(DIVERSE, 0, 600, 200, LEVELS,
                                                                                 None, True, 1)]  # fmt: skip
    # no training question is an evaluation question, in any variant
    held_out = {t.question for t in evaluation}
    for variant in VARIANTS[1:]:
        held_out |= {t.question for t in variant_tasks(variant, 0, 200, LEVELS, None, True, 1)}
    assert not {t.question for t in diverse} & held_out
    # the far training tasks use only the train half of the far phrasings
    far_train = [t for t in diverse if t.metadata["variant"] == "far"]
    assert far_train and all(t.metadata["template"].startswith("far-") for t in far_train)
    for task in far_train:
        assert any(piece in task.question for piece in fixed_pieces("train")), task.question
        assert not any(piece in task.question for piece in fixed_pieces("eval")), task.question


def fixed_pieces(half: str) -> list[str]:
    """The wording between the placeholders of every `half` phrasing (three words or more)."""
    pieces = []
    for phrasings in PHRASINGS[half].values():
        for phrasing in phrasings:
            own = [p.strip() for p in re.split(r"\{[^}]+\}", phrasing.text) if len(p.split()) >= 3]
            assert own, phrasing.text
            pieces += own
    return pieces


def test_train_variants_and_max_repeated_calls_are_options_checked_up_front():
    options = math_options({})
    assert options["train_variants"] == ["none"] and options["max_repeated_calls"] == 0
    with pytest.raises(ValueError, match="train_variants for math: want a list of none, ood, far"):
        math_options({"train_variants": ["bait"]})
    with pytest.raises(ValueError, match="train_variants for math"):
        math_options({"train_variants": []})
    with pytest.raises(ValueError, match="max_repeated_calls for math: want a whole number >= 0, got -1"):
        math_options({"max_repeated_calls": -1})


def test_the_reference_solver_solves_far_and_the_diverse_training_split():
    options = "env.options={n_train: 24, n_eval: 24, variant: far, train_variants: [none, ood, far]}"
    recipe = load_recipe(None, ["env.kind=math", options])
    spec = build_env(recipe)
    assert all(t.id.startswith("math-far-") for t in spec.eval) and len(spec.train) == 24
    assert {t.metadata["variant"] for t in spec.train} == set(DIVERSE)
    tasks = spec.eval + spec.train
    backend = ScriptedBackend(tiny_tokenizer(), {t.id: t.oracle_actions for t in tasks})
    rollout = RolloutConfig(group_size=1, batch_size=8, sampling=SamplingConfig(max_new_tokens_per_turn=512))
    trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(tasks)
    score_trajectories(trajectories, {t.id: t for t in tasks}, build_reward(recipe, spec))
    assert [t.reward for t in trajectories] == pytest.approx([1.1] * 48)
    assert {t.breakdown.get("lure_taken") for t in trajectories} <= {None, 0.0}
