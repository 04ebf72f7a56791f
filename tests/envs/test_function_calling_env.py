"""The function-calling environment on BFCL's non-live single-turn questions: a stable,
disjoint split by question that never reads live or multi-turn data; BFCL's own AST
checker (bfcl-eval in .venv-bfcl, `make bfcl-venv`) as the reward on hand-made replies;
the reference solver scores 1.0 through the real env, scripted backend and reward; one
RL step with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ponder.bfcl.data as bfcl_data
from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.function_calling import CATEGORIES, FunctionCallingEnv, load_function_calling_tasks, shared_checker
from ponder.envs.function_calling import REFUSAL, FunctionCallingOptions, argument_probes
from ponder.bfcl.data import DEFAULT_VENV, BfclDataError
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.runlog.metrics_log import read_metrics
from ponder.types import Task, Trajectory
from ponder.wiring import build_env, build_reward
from ponder.jobs.parts import rl_trainer

VENV = str(Path(__file__).resolve().parents[2] / DEFAULT_VENV)
needs_bfcl = pytest.mark.skipif(not Path(VENV, "bin", "python").exists(),
                                reason=f"no bfcl-eval venv at {VENV}; `make bfcl-venv` creates it")


def fc_recipe(*overrides: str, **options):
    return load_recipe(None, ["env.kind=function_calling", f"env.options={json.dumps({'venv': VENV, **options})}",
                              *overrides])  # fmt: skip


@pytest.fixture(scope="module")
def spec():
    return build_env(fc_recipe(), tiny_tokenizer())


@pytest.fixture(scope="module")
def planned_spec():
    return build_env(fc_recipe(plan=True), tiny_tokenizer())


@pytest.fixture(scope="module")
def tasks_by_id(spec):
    return {task.id: task for task in spec.train + spec.eval}


# --- the split ------------------------------------------------------------------------------


@needs_bfcl
def test_split_is_stable_disjoint_and_reads_no_live_or_multi_turn_data(monkeypatch, spec):
    read = []
    original = bfcl_data.read_jsonl
    monkeypatch.setattr(bfcl_data, "read_jsonl", lambda path: read.append(Path(path).name) or original(path))
    train, held_out = load_function_calling_tasks(FunctionCallingOptions(venv=VENV))
    assert read and not [name for name in read if "live" in name or "multi_turn" in name]
    assert [t.id for t in train] == [t.id for t in spec.train] and [t.id for t in held_out] == [t.id for t in spec.eval]
    train_ids, test_ids = {t.id for t in train}, {t.id for t in held_out}
    assert not train_ids & test_ids
    assert len(train_ids) + len(test_ids) == 400 + 200 + 200 + 200 + 240  # every question of the five categories
    assert {t.kind for t in held_out} == set(CATEGORIES)
    assert all(t.id.startswith(t.kind + "_") and t.kind in CATEGORIES for t in train + held_out)
    assert 0.25 < len(test_ids) / (len(train_ids) + len(test_ids)) < 0.35  # test_fraction 0.3
    other_seed = {t.id for t in load_function_calling_tasks(FunctionCallingOptions(venv=VENV, seed=1))[1]}
    assert other_seed != test_ids
    # Caps take a prefix of each category's side of the same split; eval interleaves the categories.
    small_train, small_eval = load_function_calling_tasks(FunctionCallingOptions(venv=VENV, n_train=2, n_eval=3))
    assert [t.kind for t in small_eval] == list(CATEGORIES) * 3 and len(small_train) == 10
    assert {t.id for t in small_eval} <= test_ids and {t.id for t in small_train} <= train_ids
    mixed = FunctionCallingOptions.from_dict({"venv": VENV, "categories": ["simple_python", "irrelevance"],
                                              "n_train": {"irrelevance": 5}, "n_eval": 1})  # fmt: skip
    mixed_train, mixed_eval = load_function_calling_tasks(mixed)
    assert [t.kind for t in mixed_train].count("irrelevance") == 5 and [t.kind for t in mixed_eval] == mixed.categories
    simple = [t.id for t in train if t.kind == "simple_python"]
    assert [t.id for t in mixed_train if t.kind == "simple_python"] == simple  # the other category is uncapped


def test_live_categories_and_unknown_options_are_refused():
    with pytest.raises(ValueError, match=r"\['live_simple'\] not allowed.*live and multi-turn data are never used"):
        FunctionCallingOptions.from_dict({"categories": ["simple_python", "live_simple"]})
    with pytest.raises(ValueError, match=r"unknown \['n_test'\]; valid: categories, max_description_chars"):
        FunctionCallingOptions.from_dict({"n_test": 3})
    with pytest.raises(ValueError, match=r"n_train: \{'paralel': 3\}; give a count >= 0 .* or a mapping"):
        FunctionCallingOptions.from_dict({"categories": ["simple_python"], "n_train": {"paralel": 3}})


def test_caps_of_categories_left_out_are_ignored_so_categories_alone_narrows_a_recipe():
    options = FunctionCallingOptions.from_dict({"categories": ["parallel"], "n_train": {"multiple": 64},
                                                "n_eval": {"simple_python": 96, "parallel": 5}})  # fmt: skip
    assert (options.n_train, options.n_eval) == ({}, {"parallel": 5})
    assert options.cap("n_train", "parallel") is None and options.cap("n_eval", "parallel") == 5


def _documented_command() -> list[str]:
    """docs/guide/evaluation.md's `ponder eval` of a function-calling adapter on other categories."""
    import shlex

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "evaluation.md").read_text()
    start = text.index("ponder eval --recipe recipes/function_calling.yaml")
    return shlex.split(text[start:].split("\n\n")[0].replace("\\\n", " ").splitlines()[0])


@needs_bfcl
def test_a_trained_adapter_is_evaluated_on_the_categories_it_never_saw_in_its_own_format(tmp_path):
    """The command docs/guide/evaluation.md gives (the shipped recipe, its categories
    replaced by BFCL's parallel ones, through `ponder eval`: the env's prompt format),
    run with the tiny model on four questions."""
    from ponder.cli import main

    argv = _documented_command()
    assert argv[:2] == ["ponder", "eval"] and "env.options.categories=[parallel,parallel_multiple]" in argv
    out = tmp_path / "other"
    argv[argv.index("--model") + 1], argv[argv.index("--out") + 1] = "tiny", str(out)
    assert main([*argv[1:], "--episodes", "4", f"env.options.venv={VENV}",
                 "rollout.sampling.max_new_tokens_per_turn=8"]) == 0  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["by_kind"]) == {"parallel", "parallel_multiple"} and metrics["episodes"] == 4
    assert "bfcl" in metrics["components"]


def test_a_missing_bfcl_venv_is_a_one_line_error(tmp_path):
    with pytest.raises(BfclDataError, match=r"^no bfcl-eval environment at .*; create it with `make bfcl-venv`$"):
        build_env(load_recipe(None, ["env.kind=function_calling", f"env.options={{venv: {tmp_path / 'none'}}}"]))


# --- the prompt and the reward ----------------------------------------------------------------


@needs_bfcl
def test_the_prompt_lists_the_questions_functions_and_the_call_format(tasks_by_id):
    task = tasks_by_id["multiple_0"]
    opening = FunctionCallingEnv().reset(task)
    system, user = opening.messages
    assert [s.name for s in opening.tools] == ["triangle_properties.get", "circle_properties.get"]
    block = system["content"].split("<functions>\n")[1].split("\n</functions>")[0]
    listed = [json.loads(line) for line in block.splitlines()]
    assert [f["name"] for f in listed] == ["triangle_properties.get", "circle_properties.get"]
    assert listed[0]["parameters"]["type"] == "object"  # BFCL's "dict" as JSON Schema
    assert '<tool_call>{"name": "function_name", "arguments": {"argument": value}}</tool_call>' in system["content"]
    assert user == {"role": "user", "content": task.question}


def _score(spec, task: Task, action: str, *overrides: str) -> tuple[float, dict[str, float]]:
    env = FunctionCallingEnv()
    env.reset(task)
    observation, done, info = env.step(action)
    assert observation is None and done  # single turn: the first action ends the episode
    return build_reward(fc_recipe(*overrides), spec)(Trajectory(task.id, [1], turns=[info["turn"]]), task)


def _call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@needs_bfcl
def test_bfcls_checker_scores_hand_made_replies(spec, tasks_by_id):
    triangle = tasks_by_id["simple_python_0"]  # calculate_triangle_area(base=10, height=5[, unit='units'])
    right = _call("calculate_triangle_area", base=10, height=5)
    assert _score(spec, triangle, right) == (1.1, {"bfcl": 1.0, "format": 1.0})
    with_default = _call("calculate_triangle_area", base=10, height=5, unit="units")
    assert _score(spec, triangle, "Sure.\n" + with_default)[0] == 1.1  # text before the calls is allowed
    assert _score(spec, triangle, _call("calculate_circle_area", base=10, height=5))[1] == {"bfcl": 0.0, "format": 1.0}
    assert _score(spec, triangle, _call("calculate_triangle_area", base="10", height=5))[1]["bfcl"] == 0.0  # a string
    assert _score(spec, triangle, _call("calculate_triangle_area", base=11, height=5))[1]["bfcl"] == 0.0
    malformed = '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}</tool_call>'
    assert _score(spec, triangle, malformed) == (0.0, {"bfcl": 0.0, "format": 0.0})
    assert _score(spec, triangle, "No function applies.") == (0.1, {"bfcl": 0.0, "format": 1.0})
    songs = tasks_by_id["parallel_0"]  # spotify.play twice; BFCL's parallel checker ignores the order
    reversed_calls = _call("spotify.play", artist="Maroon 5", duration=15) + "\n" + _call(
        "spotify.play", artist="Taylor Swift", duration=20)
    assert _score(spec, songs, reversed_calls)[1]["bfcl"] == 1.0
    assert _score(spec, songs, _call("spotify.play", artist="Maroon 5", duration=15))[1]["bfcl"] == 0.0
    irrelevant = tasks_by_id["irrelevance_0"]  # a triangle's area, offered only a BMI function
    bmi = _call("determine_body_mass_index", weight=10.0, height=5.0)
    assert _score(spec, irrelevant, bmi) == (0.1, {"bfcl": 0.0, "format": 1.0})
    assert _score(spec, irrelevant, "None of the functions can compute a triangle's area.")[1]["bfcl"] == 1.0
    # A broken call is no refusal: BFCL's decoder would read it as "no call" and reward it.
    assert _score(spec, irrelevant, '<tool_call>{"name": determine_body_mass_index}</tool_call>')[0] == 0.0


@needs_bfcl
def test_the_choice_term_rewards_the_right_functions_whatever_their_arguments(spec, tasks_by_id):
    def choice(task: Task, action: str) -> tuple[float, dict[str, float]]:
        return _score(spec, task, action, "reward.terms.choice=0.5")

    triangle = tasks_by_id["simple_python_0"]
    assert choice(triangle, _call("calculate_triangle_area", base=10, height=5)) == (1.6, {
        "bfcl": 1.0, "format": 1.0, "choice": 1.0})
    assert choice(triangle, _call("calculate_triangle_area", base=11, height=5))[1] == {  # a wrong value
        "bfcl": 0.0, "format": 1.0, "choice": 1.0}
    assert choice(triangle, _call("calculate_circle_area", base=10, height=5))[1]["choice"] == 0.0
    assert choice(triangle, "No function applies.") == (0.1, {"bfcl": 0.0, "format": 1.0, "choice": 0.0})
    songs = tasks_by_id["parallel_0"]  # spotify.play twice: once is not the reference's choice
    assert choice(songs, _call("spotify.play", artist="A", duration=1) * 2)[1]["choice"] == 1.0
    assert choice(songs, _call("spotify.play", artist="Maroon 5", duration=15))[1]["choice"] == 0.0
    irrelevant = tasks_by_id["irrelevance_0"]
    assert choice(irrelevant, "None of the functions applies.")[1]["choice"] == 1.0
    assert choice(irrelevant, _call("determine_body_mass_index", weight=1.0, height=1.0))[1]["choice"] == 0.0
    assert choice(irrelevant, '<tool_call>{"name": x}</tool_call>') == (0.0, {"bfcl": 0.0, "format": 0.0,
                                                                              "choice": 0.0})
    # weight 0 unless a recipe sets it: the shipped reward is BFCL's checker and the format
    assert build_reward(fc_recipe(), spec).weights == {"bfcl": 1.0, "format": 0.1}


def test_argument_probes_set_every_other_argument_to_an_accepted_value():
    reference = {"base": [10], "height": [5, 5.0], "unit": ["units", ""]}
    assert argument_probes({"base": 11, "height": 5}, reference) == {
        "base": {"height": 5, "unit": "units", "base": 11},  # the others: their first accepted value
        "height": {"base": 10, "unit": "units", "height": 5},
        "unit": {"base": 10, "height": 5},  # the reply left it out, as it may
    }
    nested = {"budget": [{"min": [300000], "max": [400000, ""]}], "city": ["", "SD"]}
    assert argument_probes({"city": "LA"}, nested)["city"] == {"budget": {"min": 300000, "max": 400000}, "city": "LA"}
    extra = argument_probes({"base": 10, "color": "red"}, reference)
    assert all(probe["color"] == "red" for probe in extra.values())  # BFCL refuses it in every probe
    assert "height" not in extra["height"]  # a required value missing stays missing
    assert argument_probes({}, {}) == {}


def test_argument_probes_do_not_depend_on_the_order_of_the_arguments():
    reference = {"a": [1], "b": ["x", ""], "c": [[1, 2]]}
    reply = {"c": [2, 1], "a": 2, "z": 0}
    shuffled = dict(reversed(list(reply.items())))
    assert argument_probes(reply, reference) == argument_probes(shuffled, reference)


@needs_bfcl
def test_the_arguments_term_is_the_share_of_the_reference_arguments_right(spec, tasks_by_id):
    def arguments(task: Task, action: str) -> float:
        return _score(spec, task, action, "reward.terms.arguments=0.5")[1]["arguments"]

    triangle = tasks_by_id["simple_python_0"]  # base=[10], height=[5], unit=["units", ""]
    assert arguments(triangle, _call("calculate_triangle_area", base=10, height=5)) == 1.0
    assert arguments(triangle, _call("calculate_triangle_area", base=11, height=5)) == pytest.approx(2 / 3)
    assert arguments(triangle, _call("calculate_triangle_area", base=11, height=5, unit="cm")) == pytest.approx(1 / 3)
    assert arguments(triangle, _call("calculate_triangle_area", base="10", height=5)) == pytest.approx(2 / 3)
    assert arguments(triangle, _call("calculate_triangle_area", height=5)) == pytest.approx(2 / 3)  # base missing
    assert arguments(triangle, _call("calculate_triangle_area", base=10, height=5, color="red")) == 0.0
    assert arguments(triangle, _call("calculate_circle_area", base=10, height=5)) == 0.0
    assert arguments(triangle, "No function applies.") == 0.0
    irrelevant = tasks_by_id["irrelevance_0"]
    assert arguments(irrelevant, "None of the functions applies.") == 1.0
    assert arguments(irrelevant, _call("determine_body_mass_index", weight=1.0, height=1.0)) == 0.0
    songs = tasks_by_id["parallel_0"]  # two reference calls: the checker's own verdict
    both = _call("spotify.play", artist="Maroon 5", duration=15) + "\n" + _call(
        "spotify.play", artist="Taylor Swift", duration=20)
    assert arguments(songs, both) == 1.0
    assert arguments(songs, _call("spotify.play", artist="Maroon 5", duration=15)) == 0.0


@needs_bfcl
def test_the_arguments_term_agrees_with_the_checker_on_the_reference_replies(spec):
    # Invariance: a reply BFCL accepts gets every argument right, on every question of one call.
    tasks = [t for t in spec.eval if t.kind in ("simple_python", "multiple")]
    for task in tasks:
        assert _score(spec, task, task.oracle_actions[0], "reward.terms.arguments=0.5")[1]["arguments"] == 1.0


@needs_bfcl
@pytest.mark.parametrize("plan", [False, True])
def test_the_reference_solver_scores_1_on_every_category(request, plan):
    spec = request.getfixturevalue("planned_spec" if plan else "spec")
    per_category = 8
    tasks = [t for kind in CATEGORIES for t in [t for t in spec.eval if t.kind == kind][:per_category]]
    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer, {t.id: t.oracle_actions for t in tasks})
    config = RolloutConfig(group_size=1, batch_size=len(tasks),
                           sampling=SamplingConfig(max_new_tokens_per_turn=4096, max_total_tokens=1 << 16))
    trajectories, _ = RolloutEngine(backend, spec.factory, config).run(tasks)
    score_trajectories(trajectories, {t.id: t for t in tasks}, build_reward(fc_recipe(), spec))
    assert len(trajectories) == per_category * len(CATEGORIES)
    failed = [(t.task_id, t.turns[0].action) for t in trajectories if t.breakdown != {"bfcl": 1.0, "format": 1.0}]
    assert not failed


@needs_bfcl
def test_the_reference_solver_writes_the_first_possible_answer(tasks_by_id):
    assert tasks_by_id["simple_python_0"].oracle_actions == [_call("calculate_triangle_area", base=10, height=5,
                                                                   unit="units")]  # fmt: skip
    assert tasks_by_id["parallel_0"].oracle_actions == [_call("spotify.play", artist="Taylor Swift", duration=20)
                                                        + "\n" + _call("spotify.play", artist="Maroon 5", duration=15)]
    assert tasks_by_id["irrelevance_0"].oracle_actions == [REFUSAL]


@needs_bfcl
def test_a_planned_reply_names_the_functions_that_fit_first(planned_spec, tasks_by_id):
    planned = {t.id: t for t in planned_spec.train + planned_spec.eval}
    plain = tasks_by_id
    assert set(planned) == set(plain)
    assert planned["parallel_0"].oracle_actions == ["<think>Fits: spotify.play.</think>\n"
                                                    + plain["parallel_0"].oracle_actions[0]]
    assert planned["irrelevance_0"].oracle_actions == ["<think>Fits: none.</think>\n" + REFUSAL]
    multiple = next(t for t in planned.values() if t.kind == "multiple")
    name = next(iter(multiple.metadata["ground_truth"][0]))
    assert multiple.oracle_actions[0].startswith(f"<think>Fits: {name}.</think>\n<tool_call>")


@needs_bfcl
def test_one_worker_serves_every_build_of_the_run(spec):
    assert build_env(fc_recipe(), tiny_tokenizer()).rewards["bfcl"].checker is spec.rewards["bfcl"].checker
    assert spec.rewards["bfcl"].checker is shared_checker(VENV)


# --- RL on the environment --------------------------------------------------------------------


@needs_bfcl
def test_one_rl_step_with_the_tiny_model(tmp_path):
    # One simple_python and one irrelevance question per step (stratified): the random
    # model's text calls nothing, which BFCL's checker accepts only for irrelevance.
    recipe = fc_recipe(
        "model.name=tiny", "train.steps=1", "train.tasks_per_step=2", "train.stratify=true", "rollout.group_size=2",
        "rollout.batch_size=4", "rollout.sampling.max_new_tokens_per_turn=8", "rollout.sampling.max_total_tokens=4096",
        "lora.r=4", "algo.micro_batch_size=2", "train.save_every=1",
        categories=["simple_python", "irrelevance"], n_train=4, n_eval=2,
    )  # fmt: skip
    rl_trainer(recipe, tmp_path).train()
    [metrics] = read_metrics(tmp_path)
    assert metrics["reward/bfcl"] == 0.5 and metrics["reward/format"] == 1.0
    assert metrics["reward/mean"] == pytest.approx(0.6)
    assert (tmp_path / "checkpoints" / "latest").is_file()


@needs_bfcl
def test_the_shipped_recipe_warms_up_on_bfcls_irrelevance_share():
    recipe = load_recipe("recipes/function_calling.yaml", [f"env.options.venv={VENV}"])
    spec = build_env(recipe, tiny_tokenizer())
    warm_up = [t.kind for t in spec.train[: recipe.sft.examples]]
    assert (warm_up.count("simple_python"), warm_up.count("multiple"), warm_up.count("irrelevance")) == (144, 64, 48)
    held_out = [t.kind for t in spec.eval[: recipe.eval.episodes]]
    assert (held_out.count("simple_python"), held_out.count("multiple"), held_out.count("irrelevance")) == (96, 32, 32)
