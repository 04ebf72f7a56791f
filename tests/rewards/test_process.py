"""The math process reward (PRM): per-turn scores of hand-built turns with known true and
false steps, the env paying them turn by turn, the composite and the turn-level
advantage seeing the same amounts, and ORM unchanged where an episode shows no steps."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from ponder.algos.advantages import AdvantageConfig, AdvantageInput, compute_advantages
from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.math import MathEnv
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rewards.process import TurnSteps, process, process_rewards, process_score, turn_steps
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.train.batch import collate, turn_rewards
from ponder.types import Task, ToolCall, ToolResult, Trajectory, Turn
from ponder.wiring import build_env, build_reward
from ponder.jobs.parts import rl_trainer

# Three turns of "4 packs of 6, had 3, gave 5 away, then doubled" (gold 44):
#   turn 0: 4 * 6 = 24 (true), 24 + 3 = 27 (true), 27 - 5 = 21 (false); calculator says 22
#   turn 1: 22 * 2 = 44 (true) and writes the earlier result 22 (used); calculator says 44
#   turn 2: answers 44, the earlier result (used)
ACTIONS = [
    "<think>4 * 6 = 24. 24 + 3 = 27. 27 - 5 = 21.</think>\n<calculator>27 - 5</calculator>",
    "<think>So 22 left, and 22 * 2 = 44.</think>\n<calculator>22 * 2</calculator>",
    "<answer>44</answer>",
]
SCORES = [(2 - 1) / 3, (1 + 1) / 2, 1.0]
TASK = Task("t", "…", ["44"], kind="level2", metadata={"needs_search": False})


def scripted_turns() -> list[Turn]:
    turns = [Turn(i, action) for i, action in enumerate(ACTIONS)]
    for turn, (expression, value) in zip(turns, [("27 - 5", "22"), ("22 * 2", "44")]):
        turn.tool_calls.append(ToolCall("calculator", {"expression": expression}))
        turn.tool_results.append(ToolResult(value, name="calculator"))
    turns[-1].answer = "44"
    return turns


def test_turn_steps_count_true_false_and_used_results():
    assert turn_steps(ACTIONS[0], set()) == TurnSteps(true=2, false=1, used=0)
    assert turn_steps(ACTIONS[1], {Fraction(22)}) == TurnSteps(true=1, false=0, used=1)
    assert turn_steps(ACTIONS[2], {Fraction(22), Fraction(44)}) == TurnSteps(true=0, false=0, used=1)
    # a true step that restates a calculator result is credited once, as the step
    assert turn_steps("22 * 2 = 44", {Fraction(44)}) == TurnSteps(true=1, false=0, used=0)
    # the calculator's input is no claim, and a turn cannot use its own call's result
    assert turn_steps("<calculator>3 + 4 = 8</calculator>", set()) == TurnSteps()


def test_process_score_is_the_true_fraction_with_a_penalty_per_false_step():
    assert process_score(TurnSteps()) == 0.0
    assert process_score(TurnSteps(true=3)) == 1.0
    assert process_score(TurnSteps(false=2)) == -1.0
    assert process_score(TurnSteps(true=2, false=1)) == pytest.approx(1 / 3)
    assert process_score(TurnSteps(true=2, false=1), false_penalty=0.5) == pytest.approx(1.5 / 3)


def test_process_rewards_of_a_hand_built_episode():
    turns = scripted_turns()
    assert process_rewards(turns) == pytest.approx(SCORES)
    assert process(Trajectory("t", [1], turns=turns), TASK) == pytest.approx(sum(SCORES))
    assert process_rewards([Turn(0, "<think>Adding them up.</think><answer>12</answer>")]) == [0.0]


def test_the_env_pays_weight_times_the_score_on_each_turn():
    env = MathEnv(calculator_on=True, max_turns=3, process_weight=0.5)
    env.reset(TASK)
    rewards = [env.step(action)[2]["reward"] for action in ACTIONS]
    assert rewards == pytest.approx([0.5 * s for s in SCORES])
    orm = MathEnv(calculator_on=True, max_turns=3)  # weight 0: no per-turn reward at all
    orm.reset(TASK)
    assert all("reward" not in orm.step(action)[2] for action in ACTIONS)


def _rollout(terms: str, scripts, group: int = 1):
    """Scripted episodes of the first level-1 eval task; `scripts(task)` gives the actions
    by engine episode key (`task_id#sample`, or the bare id for every sample)."""
    recipe = load_recipe(None, ["env.kind=math", "env.options={n_train: 2, n_eval: 1, difficulties: [1]}",
                                "env.max_turns=3", f"reward.terms={terms}"])  # fmt: skip
    spec = build_env(recipe)
    (task,) = spec.eval
    sampling = SamplingConfig(max_new_tokens_per_turn=512)
    rollout = RolloutConfig(group_size=group, batch_size=8, sampling=sampling)
    engine = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts(task)), spec.factory, rollout)
    trajectories, _ = engine.run([task])
    score_trajectories(trajectories, {task.id: task}, build_reward(recipe, spec))
    return trajectories


def _turn_advantages(trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate(trajectories, pad_id=0)
    inp = AdvantageInput(batch.rewards, batch.loss_mask, batch.group_ids, batch.turn_ids, batch.turn_rewards,
                         batch.turn_mask)  # fmt: skip
    return compute_advantages("turn", inp, AdvantageConfig(norm_by_std=False))


def test_prm_turn_rewards_through_engine_reward_and_batch():
    (episode,) = _rollout("{process: 0.5}", lambda task: {task.id: ACTIONS})
    assert [turn.reward for turn in episode.turns] == pytest.approx([0.5 * s for s in SCORES])
    assert episode.breakdown["process"] == pytest.approx(sum(SCORES))
    outcome = episode.breakdown["correct"] + 0.1 * episode.breakdown["format"]
    assert episode.reward == pytest.approx(outcome + 0.5 * sum(SCORES))
    # the outcome lands on the last turn, each turn keeps its own process reward
    paid = [0.5 * score for score in SCORES]
    assert turn_rewards(episode) == pytest.approx([paid[0], paid[1], paid[2] + outcome])


def no_steps(task: Task) -> dict[str, list[str]]:
    """Four samples that write no step and restate no calculator result: two answer
    right at once, two call the calculator first and then answer wrong."""
    gold = task.answers[0]
    return {
        f"{task.id}#0": [f"<think>I know this one.</think><answer>{gold}</answer>"],
        f"{task.id}#1": [f"<answer>{gold}</answer>"],
        f"{task.id}#2": ["<think>Check.</think><calculator>1 + 1</calculator>", "<answer>1000</answer>"],
        f"{task.id}#3": ["<calculator>2 * 3</calculator>", "<think>Hmm.</think><answer>-1</answer>"],
    }


def test_an_episode_without_steps_gets_the_same_turn_returns_under_prm_and_orm():
    orm, prm = _rollout("{process: 0.0}", no_steps, 4), _rollout("{process: 0.5}", no_steps, 4)
    assert [e.breakdown["process"] for e in prm] == [0.0] * 4
    assert [len(e.turns) for e in prm] == [1, 1, 2, 2]
    assert [e.reward for e in prm] == [e.reward for e in orm]
    for got, want in zip(_turn_advantages(prm), _turn_advantages(orm)):
        assert torch.equal(got, want)


def test_prm_separates_true_from_false_work_where_orm_cannot():
    def scripts(task: Task) -> dict[str, list[str]]:
        gold = task.answers[0]
        return {f"{task.id}#0": [f"<think>{gold} + 0 = {gold}.</think><answer>{gold}</answer>"],
                f"{task.id}#1": [f"<think>{gold} + 1 = {gold}.</think><answer>{gold}</answer>"]}  # fmt: skip

    orm_advantages, _ = _turn_advantages(_rollout("{process: 0.0}", scripts, 2))
    prm_advantages, _ = _turn_advantages(_rollout("{process: 1.0}", scripts, 2))
    assert torch.count_nonzero(orm_advantages) == 0  # both right: the outcome cannot tell them apart
    assert prm_advantages[0].max() > 0 > prm_advantages[1].min()  # the true step credited, the false charged


def test_one_prm_rl_step_of_the_tiny_model_with_turn_advantages(tmp_path):
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe(None, [
        "model.name=tiny", "env.kind=math", "env.options={n_train: 8, n_eval: 2, seed: 1}", "env.max_turns=2",
        "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2",
        "algo.advantage=turn", "reward.terms={process: 0.5}",
    ])  # fmt: skip
    rl_trainer(recipe, tmp_path).train()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1 and "reward/process" in record
    assert record["reward/mean"] == pytest.approx(record["reward/correct"] + 0.1 * record["reward/format"]
                                                  + 0.5 * record["reward/process"])  # fmt: skip
