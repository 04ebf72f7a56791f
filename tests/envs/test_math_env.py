"""The math environment: answer extraction and exact verification (hand-computed), the
calculator's safety, the seeded task generator, the reference solver reaching the
ceiling through the real engine and reward, and one RL step of the tiny model."""

from __future__ import annotations

from fractions import Fraction

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.base import EnvContext
from ponder.envs.math import MathEnv, build_math, math_options
from ponder.envs.math_tasks import GENERATORS, generate_problems, math_splits
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rewards.math import (
    answer_format,
    answers_match,
    calculator_calls,
    correct,
    extract_answer,
    last_number,
    parse_number,
)
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.builtin import CalculatorError, evaluate_expression
from ponder.types import Task, ToolCall, Trajectory, Turn
from ponder.wiring import build_env, build_reward
from ponder.jobs.parts import rl_trainer

# --- numbers and extraction -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-3", Fraction(-3)),
        ("1,000", Fraction(1000)),
        ("$12.50", Fraction(25, 2)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("5.0", Fraction(5)),
        ("x = -5", Fraction(-5)),
        ("28.", Fraction(28)),
        ("$-5", Fraction(-5)),
        ("−7", Fraction(-7)),  # a typographic minus
        ("28 dollars", None),
        ("3 or 4", None),
        ("1,00", None),  # commas only group thousands
        ("3/0", None),
        ("", None),
    ],
)
def test_parse_number_reads_one_exact_number_or_nothing(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("so 4 * 3 = 12 and the total is \\boxed{28}. Check: 30", Fraction(28)),  # boxed wins
        ("\\boxed{\\frac{3}{4}} is it", Fraction(3, 4)),  # nested braces
        ("<think>12 + 7 = 19</think><answer>19</answer> 5", Fraction(19)),  # the tag over a later number
        ("<answer>$1,000</answer>", Fraction(1000)),
        ("<answer>x = 5</answer>", Fraction(5)),
        ("The answer is 28. Then 30 more.", Fraction(28)),  # the number after the phrase
        ("so the answer is: -4", Fraction(-4)),
        ("12 - 7 = 5", Fraction(5)),  # subtraction, not a negative 7
        ("we get 3/4", Fraction(3, 4)),
        ("pi is about 3.14.", Fraction(314, 100)),
        ("no number here", None),
        ("\\boxed{12", Fraction(12)),  # an unclosed box falls back to the last number
    ],
)
def test_extract_answer_prefers_the_most_explicit_mark(text, value):
    assert extract_answer(text) == value


def test_last_number_skips_a_zero_denominator():
    assert last_number("7 then 3/0") == Fraction(7)


@pytest.mark.parametrize(
    ("predicted", "golds", "match"),
    [
        ("28", ["28"], True),
        ("27", ["28"], False),
        ("0.75", ["3/4"], True),  # exact rationals: 0.75 == 3/4
        ("0.33", ["1/3"], False),  # ... and no float tolerance
        ("1,000", ["1000"], True),
        ("-8", ["8"], False),
        ("abc", ["28"], False),  # malformed: no number at all
    ],
)
def test_verifier_compares_exactly(predicted, golds, match):
    assert answers_match(extract_answer(predicted), golds) is match


def _episode(*actions: str, answer: str | None = None, error: str | None = None) -> Trajectory:
    turns = [Turn(i, action) for i, action in enumerate(actions)]
    turns[-1].answer, turns[-1].error = answer, error
    return Trajectory("t", [1], turns=turns)


TASK = Task("t", "What is 4 * 7?", ["28"], kind="level1")


@pytest.mark.parametrize(
    ("trajectory", "expected"),
    [
        (_episode("<answer>28</answer>", answer="28"), (1.0, 1.0)),
        (_episode("<answer>27</answer>", answer="27"), (0.0, 1.0)),  # wrong, but well formed
        (_episode("<answer>28 dollars</answer>", answer="28 dollars"), (1.0, 0.0)),  # right, not one number
        (_episode("<answer>\\boxed{28}</answer>", answer="\\boxed{28}"), (1.0, 0.0)),
        (_episode("4 * 7 = 28. The answer is 28.", error="no tag"), (1.0, 0.0)),  # no tag: read from the text
        (_episode("I do not know", error="no tag"), (0.0, 0.0)),  # unparsable: 0, never None
        # a calculator expression the model never stated is not its answer
        (_episode("<calculator>30 - 2</calculator>", error=None), (0.0, 0.0)),
    ],
)
def test_correct_and_format_components(trajectory, expected):
    assert (correct(trajectory, TASK), answer_format(trajectory, TASK)) == expected


def test_calc_cost_counts_calculator_calls():
    trajectory = _episode("<calculator>4*7</calculator>", "<answer>28</answer>", answer="28")
    trajectory.turns[0].tool_calls = [ToolCall("calculator", {"expression": "4*7"})]
    assert calculator_calls(trajectory, TASK) == 1.0


# --- the calculator ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "is not allowed"),
        ("(1).__class__", "is not allowed"),
        ("9**9**9", "exponent"),
        ("2**5000", "exponent 5000 is larger than 1000"),
        ("1/0", "division by zero"),
        ("1+" * 300 + "1", "longer than 500 characters"),
    ],
)
def test_the_calculator_refuses_code_and_huge_numbers(expression, message):
    with pytest.raises(CalculatorError, match=message):
        evaluate_expression(expression)


def test_the_env_reports_a_refused_expression_as_a_result_and_goes_on():
    env = MathEnv(calculator_on=True, max_turns=3)
    env.reset(TASK)
    observation, done, _ = env.step("<calculator>__import__('os')</calculator>")
    assert not done and observation.startswith("\n\n<result>error: ") and "is not allowed" in observation
    observation, done, _ = env.step("<think>4 * 7</think><calculator>4*7</calculator>")
    assert (observation, done) == ("\n\n<result>28</result>\n\n", False)
    assert env.stop_strings == ["</calculator>", "</answer>"]


def test_without_the_calculator_its_tag_is_a_protocol_error():
    env = MathEnv(calculator_on=False, max_turns=2)
    opening = env.reset(TASK)
    assert opening.tools == [] and env.stop_strings == ["</answer>"]
    assert "<calculator>" not in opening.messages[0]["content"]
    observation, done, info = env.step("<calculator>4*7</calculator>")
    assert not done and info["turn"].tool_calls == []
    hint = "no <answer> tag found; answer with <answer>number</answer>"
    assert observation == f"\n\n<result>error: {hint}</result>\n\n"
    _, done, info = env.step("still no answer")
    assert done and info["stop_reason"] == "max_turns"


# --- the generator ----------------------------------------------------------------------


def test_the_generator_is_seeded_and_its_splits_are_disjoint():
    train, evaluation = math_splits(3, 200, 100, [1, 2, 3, 4], None, True)
    again_train, again_eval = math_splits(3, 200, 100, [1, 2, 3, 4], None, True)
    assert [t.to_dict() for t in train + evaluation] == [t.to_dict() for t in again_train + again_eval]
    assert math_splits(4, 200, 100, [1, 2, 3, 4], None, True)[1][0].question != evaluation[0].question
    assert len({t.question for t in train}) == 200 and len({t.question for t in evaluation}) == 100
    assert not {t.question for t in train} & {t.question for t in evaluation}
    assert {t.kind for t in evaluation} == {"level1", "level2", "level3", "level4"}
    # the held-out split does not depend on how many training tasks are drawn
    fewer_train = math_splits(3, 7, 100, [1, 2, 3, 4], None, True)[1]
    assert [t.question for t in fewer_train] == [t.question for t in evaluation]


def _recomputed(metadata: dict) -> int:
    """The answer from the drawn numbers, written independently of the generator."""
    v, template = metadata["values"], metadata["template"]
    formulas = {
        "add": lambda: v["a"] + v["b"], "sub": lambda: v["a"] - v["b"], "mul": lambda: v["a"] * v["b"],
        "div": lambda: v["total"] // v["b"],
        "bare+": lambda: v["a"] + v["b"], "bare-": lambda: v["a"] - v["b"],
        "bare*": lambda: v["a"] * v["b"], "buy_give": lambda: v["a"] + v["b"] - v["c"],
        "packs": lambda: v["a"] * v["b"] + v["c"], "wage": lambda: v["a"] * v["b"] - v["c"],
        "bare": lambda: v["a"] * v["b"] + v["c"],
        "change": lambda: v["paid"] - v["a"] * v["p1"] - v["b"] * v["p2"],
        "farm": lambda: v["a"] * v["b"] + v["c"] * v["d"] - v["sold"],
        "reading": lambda: v["pages"] - v["a"] * v["b"] - v["c"] * v["d"],
    }  # fmt: skip
    if metadata["level"] == 4:  # a*x + b = c: the one x that satisfies it
        (x,) = [x for x in range(-50, 51) if v["a"] * x + v["b"] == v["c"]]
        return x
    return formulas[template]()


def test_every_answer_is_right_by_recomputation():
    train, evaluation = math_splits(0, 400, 100, [1, 2, 3, 4], None, True)
    for task in train + evaluation:
        answer = int(task.answers[0])
        assert _recomputed(task.metadata) == answer, task.question
        for _, expression, value in task.metadata["steps"]:  # each worked step, by the calculator
            assert evaluate_expression(expression) == value, (task.question, expression)
        assert task.metadata["steps"][-1][2] == answer
        if task.metadata["level"] == 3 or task.metadata["template"] in ("buy_give", "wage", "sub", "div"):
            assert answer >= 0, task.question  # word problems never end in a negative count


def test_difficulties_and_mix_choose_the_levels():
    problems = generate_problems(0, 60, [2, 4], [3, 1])
    levels = [p.level for p in problems]
    assert set(levels) == {2, 4} and levels.count(2) > levels.count(4)
    assert {p.level for p in generate_problems(0, 10, [4], None)} == {4}
    with pytest.raises(ValueError, match=r"math difficulties \[5\]: each must be one of \[1, 2, 3, 4\]"):
        generate_problems(0, 1, [5], None)
    assert sorted(GENERATORS) == [1, 2, 3, 4]


def test_options_are_checked():
    assert math_options({}, 4)["max_turns"] == 4
    with pytest.raises(ValueError, match=r"unknown \['n_tran'\]; valid: seed, n_train"):
        math_options({"n_tran": 5})
    with pytest.raises(ValueError, match=r"env.options.mix for math: want one weight >= 0 per difficulty"):
        math_options({"difficulties": [1, 2], "mix": [1.0]})
    with pytest.raises(ValueError, match=r"env.options.n_eval for math: want a whole number >= 0, got -1"):
        math_options({"n_eval": -1})


# --- the reference solver through the real env, engine and reward -----------------------


@pytest.mark.parametrize("calculator", [True, False])
def test_the_reference_solver_reaches_the_ceiling(calculator):
    options = f"env.options={{n_train: 4, n_eval: 24, calculator: {calculator}}}"
    recipe = load_recipe(None, ["env.kind=math", options])
    spec = build_env(recipe)
    reward = build_reward(recipe, spec)
    assert reward.weights == {"correct": 1.0, "format": 0.1, "calc_cost": 0.0, "process": 0.0, "lure_taken": 0.0,
                              "contains_answer": 0.0, "verbosity": 0.0}  # fmt: skip
    backend = ScriptedBackend(tiny_tokenizer(), {t.id: t.oracle_actions for t in spec.eval})
    rollout = RolloutConfig(group_size=1, batch_size=8, sampling=SamplingConfig(max_new_tokens_per_turn=512))
    trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(spec.eval)
    score_trajectories(trajectories, {t.id: t for t in spec.eval}, reward)
    assert [t.reward for t in trajectories] == pytest.approx([1.1] * 24)
    assert all(t.stop_reason == "answer" for t in trajectories)
    calls = {t.task_id: t.breakdown["calc_cost"] for t in trajectories}
    for task in spec.eval:  # the solver calls the calculator on levels 3-4, when it is offered
        assert calls[task.id] == float(calculator and task.kind in ("level3", "level4")), task.id
    with_call = next((t for t in trajectories if t.breakdown["calc_cost"]), None)
    if calculator:
        assert with_call.turns[0].observation == f"\n\n<result>{with_call.turns[1].answer}</result>\n\n"


def test_reward_terms_override_the_math_defaults():
    overrides = ["env.kind=math", "env.options={n_train: 2, n_eval: 2}", "reward.terms={calc_cost: -0.05}"]
    recipe = load_recipe(None, overrides)
    weights = build_reward(recipe, build_env(recipe)).weights
    assert weights == {"correct": 1.0, "format": 0.1, "calc_cost": -0.05, "process": 0.0, "lure_taken": 0.0,
                       "contains_answer": 0.0, "verbosity": 0.0}  # fmt: skip


def test_the_shipped_recipe_builds_the_math_env():
    recipe = load_recipe("recipes/math.yaml")
    spec = build_math(EnvContext(dict(recipe.env.options), None, recipe))
    assert (len(spec.train), len(spec.eval)) == (512, 128)
    assert recipe.sft.behaviour == "oracle" and recipe.algo.advantage == "grpo"
    assert spec.factory().max_turns == recipe.env.max_turns == 3


# --- one RL step on the math env with the tiny model ------------------------------------


def test_one_rl_step_of_the_tiny_model_on_math(tmp_path):
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe(None, [
        "model.name=tiny", "env.kind=math", "env.options={n_train: 8, n_eval: 2, seed: 1}", "env.max_turns=2",
        "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2",
    ])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    assert all(task.id.startswith("math-train-") for task in trainer.sampler.tasks)
    trainer.train()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1
    for name in ("correct", "format", "calc_cost"):
        assert 0.0 <= record[f"reward/{name}"] <= 2.0  # two turns of 8 tokens: at most two calls
    # the random model never writes a closed <answer> tag in 8 tokens: no format credit
    assert record["reward/format"] == 0.0
    assert record["reward/mean"] == pytest.approx(record["reward/correct"])
    assert (tmp_path / "checkpoints" / "latest").exists()


def test_calculator_from_one_makes_the_solver_use_the_calculator_on_every_level():
    from ponder.envs.math_tasks import generate_problems, worked_solution

    problems = {p.level: p for p in generate_problems(0, 40, [1, 2, 3, 4], None)}
    for level, problem in problems.items():
        default = worked_solution(problem, calculator=True)
        always = worked_solution(problem, calculator=True, calculator_from=1)
        assert ("<calculator>" in default[0]) == (level >= 3)
        assert "<calculator>" in always[0] and always[1] == f"<answer>{problem.answer}</answer>"
