"""Compacted episodes as training rows (train/segment_batch.py): segment rows, masks,
log-probs and advantages by hand; token exactness of a compacted episode sampled by the
tiny model (recorded log-probs against recomputation under each segment's context);
an RL step on compacted episodes scores every token under its own context."""

from __future__ import annotations

import pytest
import torch

from ponder.config import ContextConfig, RolloutConfig, SamplingConfig, load_recipe
from ponder.jobs.parts import rl_trainer
from ponder.models.tiny import tiny_policy
from ponder.rollout import RolloutEngine
from ponder.rollout.hf import HFBackend
from ponder.train.batch import collate
from ponder.train.rl import check_recipe
from ponder.train.segment_batch import collate_segments, logprob_gap, segment_bounds, segment_logprob_gap
from ponder.types import Task, Trajectory, Turn

F = -9.0  # the fill of `spread`, where a row holds no response token


def compacted() -> Trajectory:
    """Prompt [1, 2, 3]; action 4 5, observation 6; restart after 3 tokens into the
    prompt [1, 2, 10, 5] (a summary 10 and the kept action's last token); observation
    7, action 8 9."""
    return Trajectory(
        task_id="e", prompt_ids=[1, 2, 3], response_ids=[4, 5, 6, 7, 8, 9], loss_mask=[1, 1, 0, 0, 1, 1],
        old_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.3, -0.4], reward=1.0, group_id="g",
        turns=[Turn(0, "a", n_action_tokens=2, n_observation_tokens=2), Turn(1, "b", n_action_tokens=2)],
        segments=[(3, [1, 2, 10, 5])],
    )  # fmt: skip


def plain() -> Trajectory:
    return Trajectory(task_id="p", prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], old_logprobs=[-0.5, -0.6],
                      reward=0.0, group_id="g", turns=[Turn(0, "c", n_action_tokens=2)])  # fmt: skip


def test_segment_bounds_by_hand() -> None:
    assert segment_bounds(compacted()) == [([1, 2, 3], 0, 3), ([1, 2, 10, 5], 3, 6)]
    assert segment_bounds(plain()) == [([1], 0, 2)]


def test_segment_rows_ids_masks_logprobs_and_turns_by_hand() -> None:
    batch = collate_segments([compacted(), plain()], pad_id=0)
    rows = batch.rows
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 0], [1, 2, 10, 5, 7, 8, 9], [1, 2, 3, 0, 0, 0, 0]]
    assert rows.attention_mask.tolist() == [[1] * 6 + [0], [1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    # response token j of a row with a P-token prompt sits at entry P + j - 1
    assert rows.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]]
    assert torch.allclose(rows.old_logprobs, torch.tensor([[0, 0, -0.1, -0.2, 0, 0], [0, 0, 0, 0, -0.3, -0.4],
                                                           [-0.5, -0.6, 0, 0, 0, 0]]))  # fmt: skip
    assert rows.turn_ids.tolist() == [[-1, -1, 0, 0, 0, -1], [-1, -1, -1, 0, 1, 1], [0, 0, -1, -1, -1, -1]]
    assert rows.rewards.tolist() == [1.0, 1.0, 0.0] and rows.group_ids == ["g", "g", "g"]
    assert batch.layout.episode == [0, 0, 1] and len(batch.episodes) == 2


def test_spread_moves_each_token_value_to_the_row_it_was_sampled_in() -> None:
    batch = collate_segments([compacted(), plain()], pad_id=0)
    # the episode rows: width 9, entry t = 10 * row + t
    values = torch.arange(2 * 8, dtype=torch.float).reshape(2, 8) + torch.tensor([[0.0], [2.0]])
    spread = batch.spread(values, fill=F)
    # episode 0 (P 3): tokens 0-2 at entries 2-4 -> row 0's 2-4; tokens 3-5 at 5-7 -> row 1's 3-5
    # episode 1 (P 1): tokens 0-1 at entries 0-1 (values 10, 11) -> row 2's 0-1
    assert spread.tolist() == [[F, F, 2, 3, 4, F], [F, F, F, 5, 6, 7], [10, 11, F, F, F, F]]
    trained = values[batch.episodes.loss_mask.bool()].sort().values
    assert torch.equal(spread[batch.rows.loss_mask.bool()].sort().values, trained)  # each token once


@pytest.mark.parametrize(("override", "message"), [
    ("algo.advantage=gae", "algo.advantage gae .* needs a forward over whole episodes"),
    ("algo.kl_in_reward=true", "algo.kl_in_reward needs a forward over whole episodes"),
    ("algo.aggregation=seq_mean_token_mean", "algo.aggregation seq_mean_token_mean weighs rows"),
])  # fmt: skip
def test_what_compacted_episodes_cannot_train_is_refused(override, message) -> None:
    recipe = load_recipe(None, ["model.name=tiny", "rollout.context.max_tokens=512", override])
    with pytest.raises(ValueError, match=f"rollout.context: {message}"):
        check_recipe(recipe)
    check_recipe(load_recipe(None, ["model.name=tiny", override]))  # without compaction it trains


class Words:
    """Shows a fixed observation after every action, for `turns` actions."""

    stop_strings: list[str] = []

    def __init__(self, turns: int) -> None:
        self.turns, self.count = turns, 0

    def reset(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Answer."}, {"role": "user", "content": task.question}]

    def step(self, action: str) -> tuple[str | None, bool, dict]:
        self.count += 1
        return (None, True, {}) if self.count >= self.turns else (f"Observation {self.count}: more.", False, {})


@pytest.mark.parametrize("summariser", ["rule", "policy", "drop"])
def test_recorded_logprobs_equal_recomputation_under_each_segments_context(summariser) -> None:
    policy = tiny_policy(seed=1)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=12, max_total_tokens=2048)
    config = RolloutConfig(batch_size=4, group_size=2, sampling=sampling,
                           context=ContextConfig(max_tokens=160, summariser=summariser, summary_max_tokens=24))
    engine = RolloutEngine(HFBackend(policy, sampling, seed=3), lambda: Words(10), config)
    trajectories, _ = engine.run([Task("a", "Count to ten.", ["x"]), Task("b", "Name ten words.", ["y"])])
    assert all(t.segments and len(t.turns) == 10 for t in trajectories)
    exact = segment_logprob_gap(policy, trajectories, temperature=1.0)
    assert exact["tokens"] == sum(sum(t.loss_mask) for t in trajectories)
    assert exact["mean"] < 1e-5 and exact["max"] < 1e-4, exact
    # scored as one stream (every token after all before it), the later segments' tokens are not
    naive = logprob_gap(policy, collate(trajectories, policy.tokenizer.pad_token_id), temperature=1.0)
    assert naive["mean"] > 100 * max(exact["mean"], 1e-7), (naive, exact)


TINY_STEP = [
    "model.name=tiny", "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
    "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=6", "env.options.max_obs_tokens=16",
    "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=16", "env.options.taskgen.n_eval=4",
    "lora.r=4", "algo.micro_batch_size=2", "algo.epochs=2", "train.save_every=100",
]  # fmt: skip


def test_an_rl_step_scores_compacted_episodes_under_their_own_contexts(tmp_path) -> None:
    probe = rl_trainer(load_recipe(None, TINY_STEP), tmp_path / "probe")
    task = probe.sampler.next_batch(1)[0]
    prompt = len(probe.engine._new_episode(task, 0).trajectory.prompt_ids)
    recipe = load_recipe(None, [*TINY_STEP, f"rollout.context.max_tokens={prompt + 120}",
                                "rollout.context.summariser=drop"])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path / "run")
    trainer.backend.logprobs_match_trainer = False  # the trainer recomputes the old log-probs and logs the gap
    run, seen = trainer.engine.run, []

    def recording_run(tasks, *args, **kwargs):
        trajectories, stats = run(tasks, *args, **kwargs)
        seen.extend(trajectories)
        return trajectories, stats

    trainer.engine.run = recording_run
    metrics = trainer.train_step()
    assert any(t.segments for t in seen), [len(t.prompt_ids) + len(t.response_ids) for t in seen]
    assert metrics["context/compactions"] > 0
    assert metrics["rollout/logprob_mismatch"] < 1e-5, metrics["rollout/logprob_mismatch"]
