"""rollout.constrain: every action is sampled to match the grammar, the recorded
logprobs are those of the masked distribution, and the trainer's recomputation with
the same masks gives them back, so the importance ratio at the sampling weights is 1."""

from __future__ import annotations

import re

import pytest
import torch

from ponder.config import load_recipe
from ponder.jobs.parts import rl_trainer
from ponder.train.batch import collate
from ponder.train.update import forward_pass_no_grad

ANSWER = "<answer>[a-z]{1,6}</answer>"
TINY = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=24", "env.max_turns=2", "lora.r=4", "train.steps=1",
        "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2",
        "rollout.constrain.kind=regex", f"rollout.constrain.source={ANSWER}", "sft.steps=0"]  # fmt: skip


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return rl_trainer(load_recipe(None, TINY), tmp_path_factory.mktemp("run"), reward=lambda t, task: (1.0, {}))


def test_every_action_matches_and_the_ratio_at_the_sampling_weights_is_one(trainer):
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    assert trajectories and all(re.fullmatch(ANSWER, turn.action) for t in trajectories for turn in t.turns)
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    mask = batch.loss_mask.bool()
    masked = forward_pass_no_grad(trainer.policy, batch, 4, 1.0, masks_for=trainer.masks_for)
    assert torch.allclose(masked[mask], batch.old_logprobs[mask], atol=2e-4)  # ratio exp(0) = 1
    free = forward_pass_no_grad(trainer.policy, batch, 4, 1.0)
    assert (batch.old_logprobs[mask] - free[mask]).mean() > 0.5  # the mask moved mass onto the sampled tokens


def test_a_constrained_step_trains(trainer):
    metrics = trainer.train_step()
    assert metrics["episode/answered"] == 1.0  # every action is a well-formed answer
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss/policy", "optim/grad_norm"))


def test_a_bad_constraint_is_a_one_line_error():
    with pytest.raises(ValueError, match="rollout.constrain.kind: unknown 'grammar'"):
        load_recipe(None, ["rollout.constrain.kind=grammar", "rollout.constrain.source=x"])
    with pytest.raises(ValueError, match="rollout.constrain.source: a regex is needed"):
        load_recipe(None, ["rollout.constrain.kind=regex"])


def test_kind_tools_constrains_each_episode_to_its_own_tools(tmp_path):
    """rollout.constrain.kind=tools: every episode's actions carry the grammar of the
    tools its environment offered (a call opened is a call to one of them), which the
    trainer replays; the ratio at the sampling weights stays 1 and a step trains."""
    from ponder.rollout.constrain import tool_calls

    overrides = [o for o in TINY if not o.startswith("rollout.constrain")] + ["rollout.constrain.kind=tools"]
    trainer = rl_trainer(load_recipe(None, overrides), tmp_path, reward=lambda t, task: (1.0, {}))
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    env = trainer.env_factory()
    offered = env.reset(trainer.sampler.next_batch(1)[0]).tools
    assert offered and all(t.constraint == tool_calls(offered, None, True, True, opened=True) for t in trajectories)
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    assert batch.constraints == [t.constraint for t in trajectories]
    assert batch.select([1]).constraints == [trajectories[1].constraint]
    mask = batch.loss_mask.bool()
    replayed = forward_pass_no_grad(trainer.policy, batch, 4, 1.0, masks_for=trainer.masks_for)
    assert torch.allclose(replayed[mask], batch.old_logprobs[mask], atol=2e-4)
    metrics = trainer.train_step()
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss/policy", "optim/grad_norm"))
    assert "constraint" not in trajectories[0].to_row()  # in memory only, never written
