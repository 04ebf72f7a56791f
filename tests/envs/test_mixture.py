"""env.kind mixture: the tasks of several environments in one run. Each part's tasks
under its name, reset and step dispatched to the task's part's environment (with its
own max_turns), each part's own reward on its own tasks, evaluations broken down by
part, a teacher per part, one-line errors naming the bad part, and one RL step of the
tiny model with a teacher per part."""

from __future__ import annotations

import pytest
import torch
import yaml

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.base import PART_KEY, own_task
from ponder.envs.mixture import interleave
from ponder.eval.metrics import summarise
from ponder.eval.report import metrics_table
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import Task
from ponder.wiring import build_env, build_reward

MATH = {"kind": "math", "max_turns": 1, "options": {"n_train": 6, "n_eval": 4, "difficulties": [1, 2], "seed": 1}}
SEARCH = {"kind": "search_qa", "options": {"taskgen": {"n_people": 20, "n_train": 3, "n_eval": 4, "seed": 2}},
          "reward": {"terms": {"format": 0.0, "search_cost": -0.25}}}  # fmt: skip


def recipe_with(parts, *overrides):
    return load_recipe(None, ["model.name=tiny", "env.kind=mixture", "env.max_turns=3",
                              f"env.options={yaml.safe_dump({'parts': parts}, default_flow_style=True).strip()}",
                              *overrides])  # fmt: skip


@pytest.fixture(scope="module")
def mixture():
    recipe = recipe_with({"math": MATH, "search_qa": SEARCH})
    spec = build_env(recipe, tiny_tokenizer())
    yield recipe, spec
    spec.close()


def test_the_tasks_are_both_parts_under_their_names(mixture):
    _, spec = mixture
    assert [own_task(t)[0] for t in spec.eval] == ["math", "search_qa"] * 4  # one of each part in turn
    assert len(spec.train) == 9 and sum(t.kind.startswith("math/") for t in spec.train) == 6
    assert {t.kind for t in spec.train + spec.eval} <= {"math/level1", "math/level2", "search_qa/single_hop",
                                                         "search_qa/multi_hop", "search_qa/in_prompt"}  # fmt: skip
    first = spec.eval[0]
    assert first.id == f"math/{own_task(first)[1].id}" and first.metadata[PART_KEY] == "math"
    part, own = own_task(first)
    assert own.kind in ("level1", "level2") and PART_KEY not in own.metadata
    assert own == next(t for t in spec.parts["math"].spec.eval if t.id == own.id)  # as the part made it
    assert not {t.id for t in spec.train} & {t.id for t in spec.eval}


def test_training_tasks_interleave_by_weight():
    def tasks(name, n):
        return [Task(f"{name}-{i}", "q", []) for i in range(n)]

    splits = {"a": tasks("a", 6), "b": tasks("b", 3)}
    assert [t.id[0] for t in interleave(splits, {"a": 6, "b": 3})] == list("abaabaaba")  # every task, 2:1
    equal = interleave(splits, {"a": 1, "b": 1})  # equal shares: as many as the scarcer part has
    assert [t.id for t in equal] == ["a-0", "b-0", "a-1", "b-1", "a-2", "b-2"]
    recipe = recipe_with({"math": {**MATH, "weight": 1}, "search_qa": {**SEARCH, "weight": 1}})
    with build_env(recipe) as spec:
        assert sorted(own_task(t)[0] for t in spec.train) == ["math"] * 3 + ["search_qa"] * 3


def test_reset_and_step_go_to_the_tasks_part(mixture):
    _, spec = mixture
    math_task, search_task = spec.eval[0], spec.eval[1]
    env = spec.factory()
    assert set(env.stop_strings) == {"</calculator>", "</answer>", "</search>"}  # one batch holds both parts
    opening = env.reset(math_task)
    assert "Solve the math problem" in opening.messages[0]["content"]
    assert [tool.name for tool in opening.tools] == ["calculator"]
    observation, done, info = env.step("<calculator>2+3</calculator>")
    assert [call.name for call in info["turn"].tool_calls] == ["calculator"]  # math's calculator …
    assert done and info["stop_reason"] == "max_turns"  # … and math's own max_turns (1)
    opening = env.reset(search_task)
    assert "<search>" in opening.messages[0]["content"] and [t.name for t in opening.tools] == ["search"]
    observation, done, info = env.step("<search>anything</search>")
    assert not done and "<information>" in observation  # the recipe's env.max_turns (3) for search_qa
    assert info["metrics"] == {"searches": 1.0} and info["reward"] == -0.25  # the part's own search_cost weight
    env.close()


def _rollout(spec, tasks, scripts):
    config = RolloutConfig(group_size=1, batch_size=len(tasks),
                           sampling=SamplingConfig(max_new_tokens_per_turn=1 << 12, max_total_tokens=1 << 15))
    trajectories, _ = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts), spec.factory, config).run(tasks)
    return trajectories


def test_each_part_is_scored_by_its_own_reward(mixture):
    recipe, spec = mixture
    tasks = spec.eval
    trajectories = _rollout(spec, tasks, {t.id: t.oracle_actions for t in tasks})
    score_trajectories(trajectories, {t.id: t for t in tasks}, build_reward(recipe, spec))
    for task, episode in zip(tasks, trajectories):
        if own_task(task)[0] == "math":  # math's default reward: correct 1 + format 0.1
            assert set(episode.breakdown) >= {"correct", "format"} and "em" not in episode.breakdown
            assert episode.reward == pytest.approx(1.1)
        else:  # search_qa's with the part's terms: em 1, format 0, search_cost -0.25 per search
            assert "correct" not in episode.breakdown and episode.breakdown["em"] == 1.0
            assert episode.reward == pytest.approx(1.0 - 0.25 * episode.breakdown["search_cost"])
    wrong = _rollout(spec, tasks, {t.id: ["<answer>-123456</answer>"] for t in tasks})
    score_trajectories(wrong, {t.id: t for t in tasks}, build_reward(recipe, spec))
    assert [t.reward for t in wrong] == pytest.approx([0.1, 0.0] * 4)  # math's format bonus; search's is 0 here


def test_evaluations_break_down_by_part(mixture):
    recipe, spec = mixture
    tasks = spec.eval
    trajectories = _rollout(spec, tasks, {t.id: t.oracle_actions for t in tasks})
    tasks_by_id = {t.id: t for t in tasks}
    score_trajectories(trajectories, tasks_by_id, build_reward(recipe, spec))
    metrics = summarise(trajectories, tasks_by_id)
    assert sorted(metrics["by_part"]) == ["math", "search_qa"]
    assert metrics["by_part"]["math"]["episodes"] == 4 and metrics["by_part"]["math"]["reward"] == pytest.approx(1.1)
    assert all(kind.split("/")[0] in ("math", "search_qa") for kind in metrics["by_kind"])
    assert "by_part" not in summarise(trajectories[:0], {})  # no mixture, no part rows
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(metrics_table(metrics, width=400))
    rows = [line.split()[0] for line in console.export_text().splitlines() if line.strip()]
    assert rows[rows.index("all") + 1 : rows.index("all") + 3] == ["math", "math/level1"]  # a part, then its kinds
    assert "search_qa" in rows


def test_a_teacher_per_part():
    from ponder.config.sections import TeacherConfig
    from ponder.train.batch import collate
    from ponder.train.teacher import Teacher, check_teacher_kinds
    from ponder.types import Trajectory

    rows = [Trajectory(f"t{i}", [1, 2], [3, 4, 5], [1, 1, 0], [-1.0, -1.0, 0.0]) for i in range(4)]
    batch = collate(rows, 0)

    def constant(value):
        return lambda part, micro, temperature: torch.full(part.old_logprobs.shape, value)

    teacher = Teacher({"math": constant(-0.5), "search_qa": constant(-2.0), "search_qa/in_prompt": constant(-3.0)})
    kinds = ["math/level1", "search_qa/multi_hop", "math/level2", "search_qa/in_prompt"]
    scores = teacher.token_logprobs(batch, kinds, 4, 1.0)
    on = batch.loss_mask.bool()
    assert [scores[i][on[i]].tolist() for i in range(4)] == [[-0.5] * 2, [-2.0] * 2, [-0.5] * 2, [-3.0] * 2]
    assert [teacher.teacher_of(k) for k in ["math/level1", "search_qa/in_prompt", "code/x"]] == [
        "math", "search_qa/in_prompt", None]  # fmt: skip
    check_teacher_kinds(TeacherConfig(model={"math": "a", "search_qa": "b"}), set(kinds))
    with pytest.raises(ValueError, match="teacher.model: 'maths' is no task kind or mixture part"):
        check_teacher_kinds(TeacherConfig(model={"maths": "a"}), set(kinds))


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"kind": "no_such_env"}, "unknown environment 'no_such_env'"),
        ({"options": {"n_train": 2}}, "give the part's `kind`"),
        ({"kind": "math", "options": {"n_trains": 2}}, "unknown ['n_trains']"),
        ({"kind": "verified_qa"}, "eval"),  # it reads its tasks from files, and none are given
        ({"kind": "math", "colour": "red"}, "unknown key 'colour'"),
        ({"kind": "math", "max_turns": 0}, "'env.max_turns' must be >= 1"),
        ({"kind": "math", "reward": {"term": {}}}, "unknown key 'reward.term'"),
        ({"kind": "math", "weight": -1}, "weight: want a number > 0"),
        ({"kind": "mixture"}, "a part cannot be a mixture"),
        ("math", "want an env section"),
    ],
)
def test_a_bad_part_is_one_line_naming_it(part, message):
    with pytest.raises(ValueError) as info:
        build_env(recipe_with({"math": MATH, "bad": part}))
    text = str(info.value)
    assert text.startswith("env.options.parts.bad") and "\n" not in text and message in text


def test_mixture_level_task_files_and_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="give each part its own"):
        build_env(recipe_with({"math": MATH}, f"env.train_tasks={tmp_path / 'tasks.jsonl'}"))
    with pytest.raises(ValueError, match=r"env.options for mixture: unknown \['part'\]"):
        build_env(load_recipe(None, ["env.kind=mixture", "env.options={part: {}}"]))
    with pytest.raises(ValueError, match="env.options.parts.search_qa: give every part a weight"):
        build_env(recipe_with({"math": {**MATH, "weight": 2}, "search_qa": SEARCH}))


def test_the_shipped_recipe_builds():
    math, world = "env.options.parts.math.options", "env.options.parts.search_qa.options.taskgen"
    recipe = load_recipe("recipes/mixture_math_search.yaml", [
        "model.name=tiny", f"{math}.n_train=4", f"{math}.n_eval=2", f"{world}.n_people=20", f"{world}.n_train=2",
        f"{world}.n_eval=2"])  # fmt: skip
    with build_env(recipe) as spec:
        assert [own_task(t)[0] for t in spec.eval] == ["math", "search_qa"] * 2
        reward = build_reward(recipe, spec)
        assert reward.parts["search_qa"].weights["search_cost"] == -0.1
        assert reward.parts["math"].weights["correct"] == 1.0 and "search_cost" not in reward.parts["math"].weights


def test_one_rl_step_with_a_teacher_per_part(tmp_path):
    from ponder.jobs.parts import rl_trainer

    parts = {"math": {**MATH, "options": {**MATH["options"], "n_train": 4}},
             "search_qa": {**SEARCH, "options": {"taskgen": {"n_people": 20, "n_train": 4, "n_eval": 2}}}}  # fmt: skip
    recipe = recipe_with(parts, "train.steps=1", "train.tasks_per_step=4", "rollout.group_size=2",
                         "rollout.batch_size=8", "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4",
                         "algo.micro_batch_size=4", "sft.steps=0", "algo.distill_coef=0.5",
                         "teacher.model={math: tiny, search_qa: tiny}")  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    assert set(trainer.teacher.scorers) == {"math", "search_qa"}
    metrics = trainer.train_step()  # 4 tasks stratified by kind (2 math kinds, 1-3 search-QA ones): both parts
    assert any(key.startswith("kind/math/") for key in metrics) and any(key.startswith("kind/search_qa/")
                                                                        for key in metrics)  # fmt: skip
    assert abs(metrics["distill/reverse_kl"]) < 1e-4  # the teachers are the student's base
    with pytest.raises(ValueError, match="teacher.model: 'code' is no task kind or mixture part"):
        rl_trainer(recipe_with(parts, "algo.distill_coef=0.5", "teacher.model={code: tiny}"), tmp_path / "other")
