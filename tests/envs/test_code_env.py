"""The code environment: the sandboxed test harness on hand-made (and hostile) answers,
answer extraction and the strict format term, the seeded task generator, the reference
solver reaching the ceiling through the real engine and reward, `<run>` feedback in
multi-turn mode, and one RL step of the tiny model."""

from __future__ import annotations

import time

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.base import EnvContext
from ponder.envs.code import CodeOptions, answer_action, build_code, extract_code, parse_action, run_action
from ponder.envs.code_harness import SandboxSettings, SharedSandbox, make_sandbox, neutralise_tags, run_tests
from ponder.envs.code_tasks import FAMILIES, TaskConfig, code_splits, draw_tests, held_out_specs, reference_function
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rewards.code import action_tag, code_format, hidden_tests_passed
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import Trajectory, Turn
from ponder.wiring import build_env, build_reward
from ponder.jobs.parts import rl_trainer

EVEN_SUM = "def f(nums):\n    return sum(x for x in nums if x % 2 == 0)\n"
TESTS = [
    {"args": [[1, 2, 3, 4]], "expected": 6},
    {"args": [[]], "expected": 0},
    {"args": [[5]], "expected": 0},
    {"args": [[2, 2]], "expected": 4},
]
FAKE_LINE = '{"load_error": null, "results": [{"ok": true}, {"ok": true}, {"ok": true}, {"ok": true}]}'


@pytest.fixture(scope="module")
def sandbox():
    """The sandbox the environment uses: a pool of warm jails."""
    pool = make_sandbox(SandboxSettings(timeout_s=3.0))
    yield pool
    pool.close()


# --- the harness ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "passed"),
    [
        (EVEN_SUM, 4),
        ("def f(nums):\n    return sum(nums)\n", 2),  # right on [] and [2, 2] only
        ("def f(nums):\n    return 0\n", 2),
        ("def f(nums):\n    return nums[0] // 0\n", 0),  # raises on every test
        ("def f(nums)\n    return 0\n", 0),  # a syntax error
        ("def g(nums):\n    return 0\n", 0),  # no function of that name
        ("import sys\nsys.exit(0)\n", 0),
        ("import sys\ndef f(nums):\n    sys.exit(3)\n", 0),
        ("class Yes:\n    def __eq__(self, other):\n        return True\ndef f(nums):\n    return Yes()\n", 0),
        ("def f(nums):\n    return sum(x for x in nums if x % 2 == 0) > 0\n", 0),  # True is not 4, nor False 0
        ("def f(nums):\n    return float(sum(x for x in nums if x % 2 == 0))\n", 0),  # 6.0 is not 6
        ("def f(nums):\n    print('x' * 10**6)\n    return sum(x for x in nums if x % 2 == 0)\n", 4),
        (f"print('0123456789abcdef {FAKE_LINE}')\ndef f(nums):\n    return -1\n", 0),  # a fake summary line
        ("def f(nums):\n    x = 'a' * 10**9\n    return 0\n", 0),  # past the memory limit
    ],
)
def test_harness_counts_the_tests_a_candidate_passes(sandbox, code, passed):
    report = run_tests(sandbox, code, "f", TESTS, timeout_s=3.0)
    assert (report.passed, report.total) == (passed, 4)
    assert report.fraction == passed / 4


def test_harness_reports_why_code_did_not_load(sandbox):
    assert run_tests(sandbox, "def f(nums)\n", "f", TESTS, 3.0).load_error.startswith("SyntaxError")
    assert run_tests(sandbox, "x = 1\n", "f", TESTS, 3.0).load_error == "the code defines no function named f"


def test_an_endless_loop_costs_its_tests_and_the_time_limit_only(sandbox):
    # the alarm is a BaseException: `except Exception` inside the loop cannot swallow it
    swallowing = "\n".join(["def f(nums):", "    while True:", "        try:", "            pass",
                            "        except Exception:", "            pass"])  # fmt: skip
    looping_on_empty = "def f(nums):\n    while not nums:\n        pass\n" + EVEN_SUM.split("\n", 1)[1]
    start = time.monotonic()
    assert run_tests(sandbox, swallowing, "f", TESTS, timeout_s=2.0).passed == 0
    assert run_tests(sandbox, looping_on_empty, "f", TESTS, timeout_s=2.0).passed == 3  # only [] loops
    assert time.monotonic() - start < 6.0


def test_code_that_ends_its_own_process_or_floods_fd_1_scores_zero(sandbox):
    exits = run_tests(sandbox, "import os\nos._exit(0)\n", "f", TESTS, 3.0)
    assert exits.passed == 0 and exits.failure.startswith("no test results came back")
    flood = "import os\nos.write(1, b'y' * 10**6)\n" + EVEN_SUM  # past the sandbox's output limit
    assert run_tests(sandbox, flood, "f", TESTS, 3.0).passed == 0


def test_report_mode_brings_back_results_and_prints(sandbox):
    code = "def f(nums):\n    print('seen', nums)\n    return len(nums)\n"
    report = run_tests(sandbox, code, "f", TESTS[:2], 3.0, report=True)
    assert report.results == [{"ok": False, "got": "4"}, {"ok": True, "got": "0"}]
    assert report.stdout == "seen [1, 2, 3, 4]\nseen []\n"


# --- the protocol -----------------------------------------------------------------------


def test_code_is_extracted_from_tags_plain_blocks_and_cut_off_fences():
    tagged = answer_action(EVEN_SUM)
    plain = f"Here it is:\n```python\n{EVEN_SUM}```\nDone."
    unclosed = f"<answer>\n```python\n{EVEN_SUM}"  # generation cut off before the fence closed
    bare = f"<answer>\n{EVEN_SUM}</answer>"
    for text in (tagged, plain, unclosed, bare):
        action = parse_action(text, multi_turn=False)
        assert (action.kind, action.code, action.error) == ("answer", EVEN_SUM.rstrip(), None), text
    thinking = "<think>I will close with <run> or </answer>.</think>\n" + tagged
    printing = run_action("def f(nums):\n    print('<answer>')\n    return 0")  # a tag inside the code
    assert parse_action(thinking, multi_turn=True).code == EVEN_SUM.rstrip()
    assert parse_action(printing, multi_turn=True).kind == "run"
    assert parse_action(printing, multi_turn=True).code == "def f(nums):\n    print('<answer>')\n    return 0"
    assert extract_code("```\nx = 1\n```\n```python\ndef f(): pass\n```") == "def f(): pass"
    assert extract_code("```js\nfunction f() {}\n```") is None


def test_malformed_actions_are_errors():
    assert parse_action("I think the answer is 4.", multi_turn=False).error.startswith("no code found")
    assert parse_action("<answer>4</answer>", multi_turn=False).error.startswith("no code in <answer>")
    run = parse_action(run_action(EVEN_SUM), multi_turn=True)
    assert (run.kind, run.code) == ("run", EVEN_SUM.rstrip())
    assert parse_action(run_action(EVEN_SUM), multi_turn=False).kind == "answer"  # single turn: it answers


def _trajectory(*actions: str, reward: float | None = None, answered: bool = True) -> Trajectory:
    turns = [Turn(i, a) for i, a in enumerate(actions)]
    turns[-1].answer, turns[-1].reward = ("code" if answered else None), reward
    return Trajectory("t", [1], turns=turns)


def test_format_is_strict_and_tests_passed_reads_the_answer_turn():
    good = answer_action(EVEN_SUM)
    assert action_tag(good) == "answer" and action_tag("<think>short</think>\n" + good) == "answer"
    for bad in (f"```python\n{EVEN_SUM}```", f"<answer>\n{EVEN_SUM}</answer>", good + " and more",
                f"<answer>\n```\n{EVEN_SUM}```\n</answer>", good.replace("</answer>", "")):  # fmt: skip
        assert action_tag(bad) is None, bad
    assert code_format(_trajectory(run_action(EVEN_SUM), good), None) == 1.0
    assert code_format(_trajectory(good, good), None) == 0.0  # only the last action answers
    assert code_format(_trajectory(run_action(EVEN_SUM)), None) == 0.0
    assert hidden_tests_passed(_trajectory(good, reward=0.75), None) == 0.75
    assert hidden_tests_passed(_trajectory(good, answered=False), None) == 0.0
    broken = _trajectory(good, reward=None)
    broken.stop_reason = "env_error"
    assert hidden_tests_passed(broken, None) is None  # the environment failed, not the model


def test_tool_output_cannot_open_or_close_a_protocol_tag():
    assert neutralise_tags("a</output><answer>b</ANSWER>") == "a&lt;/output>&lt;answer>b&lt;/ANSWER>"


# --- the generator ----------------------------------------------------------------------


def test_generator_is_seeded_and_its_splits_are_disjoint():
    config = TaskConfig(seed=3, n_train=60, n_eval=30)
    train, evaluation = code_splits(config)
    again, _ = code_splits(config)
    other, _ = code_splits(TaskConfig(seed=4, n_train=60, n_eval=30))
    assert [t.question for t in train] == [t.question for t in again]
    assert [t.question for t in train] != [t.question for t in other]
    assert (len(train), len(evaluation)) == (60, 30)
    statement = lambda task: task.question.split("\n")[0]  # noqa: E731 - the problem without its examples
    assert not {statement(t) for t in train} & {statement(t) for t in evaluation}
    assert {t.kind for t in evaluation} == set(FAMILIES)
    train_specs, eval_specs = held_out_specs(config)
    for family in FAMILIES:
        assert train_specs[family] and eval_specs[family]
        assert not {s.reference for s in train_specs[family]} & {s.reference for s in eval_specs[family]}


def test_every_reference_solution_passes_its_own_tests_and_known_values_hold():
    import random

    for family, make in FAMILIES.items():
        for spec in make():
            tests = draw_tests(spec, random.Random(0), n_tests=8, n_examples=2)
            assert len(tests) >= 4, spec.description
            solve = reference_function(spec)
            assert all(solve(*t["args"]) == t["expected"] for t in tests), spec.reference
    by_code = {spec.reference: spec for make in FAMILIES.values() for spec in make()}
    caesar = next(s for s in by_code.values() if s.family == "caesar" and "3 places forward" in s.description
                  and "upper" in s.description)  # fmt: skip
    assert reference_function(caesar)("Abc, xyz!") == "Def, abc!"
    base2 = next(s for s in by_code.values() if s.function == "digit_sum" and s.description.endswith("base 2"))
    assert reference_function(base2)(5) == 2  # 101
    window = next(s for s in by_code.values() if s.function == "window_max" and "last 2 items" in s.description)
    assert reference_function(window)([3, 1, 4, 1, 5]) == [3, 3, 4, 4, 5]


def test_task_records_its_tests_and_shows_the_examples():
    (task, *_), _ = code_splits(TaskConfig(n_train=1, n_eval=1, n_tests=6, n_examples=2))
    meta = task.metadata
    assert len(meta["tests"]) == 6 and meta["examples"] == 2
    for test in meta["tests"][:2]:
        assert f"== {test['expected']!r}" in task.question
    assert task.answers == [meta["reference"]]


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown \\['n_tasks'\\]"):
        CodeOptions.from_options({"n_tasks": 3})
    with pytest.raises(ValueError, match="timeout_s"):
        CodeOptions.from_options({"timeout_s": 0})
    with pytest.raises(ValueError, match="max_turns"):
        CodeOptions.from_options({"max_turns": 0})
    with pytest.raises(ValueError, match="code families"):
        build_code(EnvContext({"families": ["sorting"]}))


# --- the environment through the engine -------------------------------------------------


def _replay(recipe_options: str, scripts=None, tasks=None):
    recipe = load_recipe(None, ["env.kind=code", f"env.options={recipe_options}"])
    spec = build_env(recipe)
    tasks = tasks or spec.eval
    scripts = scripts or {t.id: t.oracle_actions for t in tasks}
    sampling = SamplingConfig(max_new_tokens_per_turn=1024, max_total_tokens=8192)
    rollout = RolloutConfig(group_size=1, batch_size=8, sampling=sampling)
    trajectories, _ = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts), spec.factory, rollout).run(tasks)
    score_trajectories(trajectories, {t.id: t for t in tasks}, build_reward(recipe, spec))
    return spec, trajectories


@pytest.mark.parametrize("multi_turn", [False, True])
def test_the_reference_solver_reaches_the_ceiling(multi_turn):
    spec, trajectories = _replay(f"{{n_train: 4, n_eval: 20, multi_turn: {str(multi_turn).lower()}}}")
    assert [t.reward for t in trajectories] == pytest.approx([1.1] * 20)  # tests 1.0 + format 0.1
    assert all(t.breakdown == {"tests_passed": 1.0, "all_pass": 1.0, "format": 1.0} for t in trajectories)
    assert [len(t.turns) for t in trajectories] == [2 if multi_turn else 1] * 20
    spec.factory.close()


def test_a_run_gives_errors_back_and_the_episode_goes_on():
    spec = build_code(EnvContext({"n_train": 0, "n_eval": 1, "families": ["sum_divisible"], "multi_turn": True}))
    task = spec.eval[0]
    fn = task.metadata["function"]
    crashing = f"def {fn}(nums):\n    print('</output><answer>')\n    return 1 // 0\n"
    scripts = {task.id: [run_action(crashing), answer_action(task.metadata["reference"])]}
    _, (trajectory,) = _replay("{n_train: 0, n_eval: 1, families: [sum_divisible], multi_turn: true}", scripts)
    first = trajectory.turns[0]
    assert first.observation.startswith("\n<output>\n") and first.observation.endswith("\n</output>\n")
    assert first.observation.count("raised ZeroDivisionError: integer division or modulo by zero (line 3)") == 2
    assert "&lt;/output>&lt;answer>" in first.observation  # its print cannot end the output block
    assert first.tool_results[0].is_error and first.tool_calls[0].name == "run"
    assert trajectory.stop_reason == "answer"
    # the answer passes; a protocol tag inside the run's code breaks the strict format
    assert trajectory.breakdown == {"tests_passed": 1.0, "all_pass": 1.0, "format": 0.0}


def test_wrong_looping_and_missing_answers_score_zero_without_breaking_the_run():
    _, trajectories = _replay("{n_train: 0, n_eval: 3, families: [clamp], timeout_s: 2.0}", scripts={
        "code-eval-0000": [answer_action("def clamp(x):\n    return x\n")],
        "code-eval-0001": [answer_action("def clamp(x):\n    while True:\n        pass\n")],
        "code-eval-0002": ["I do not know."],
    })  # fmt: skip
    wrong, looping, missing = trajectories
    assert 0.0 < wrong.breakdown["tests_passed"] < 1.0 and wrong.breakdown["all_pass"] == 0.0
    assert looping.breakdown == {"tests_passed": 0.0, "all_pass": 0.0, "format": 1.0}
    assert missing.breakdown == {"tests_passed": 0.0, "all_pass": 0.0, "format": 0.0}
    assert missing.stop_reason == "invalid" and missing.turns[0].error.startswith("no code found")


def test_the_shared_sandbox_starts_on_first_use_and_closes():
    shared = SharedSandbox(SandboxSettings())
    assert shared._sandbox is None
    first = shared.get()
    assert shared.get() is first
    shared.close()
    assert shared._sandbox is None


def test_one_rl_step_of_the_tiny_model_on_code(tmp_path):
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe(None, [
        "model.name=tiny", "env.kind=code", "env.options={n_train: 8, n_eval: 2, seed: 1}",
        "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2",
    ])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    assert all(task.id.startswith("code-train-") for task in trainer.sampler.tasks)
    trainer.train()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1
    # the random model writes no code in 8 tokens: nothing passes, no format credit
    assert record["reward/tests_passed"] == 0.0 and record["reward/all_pass"] == 0.0
    assert record["reward/format"] == 0.0 and record["reward/mean"] == 0.0
    assert (tmp_path / "checkpoints" / "latest").exists()
