"""The RL update with a sampler whose log-probs are not the trainer's (vLLM): old
log-probs recomputed by the trainer, the mismatch reported, each token's loss weighted
by the truncated importance weight."""

import math

import pytest
import torch


def test_update_weights_each_token_loss_and_recomputes_old_logprobs():
    from ponder.config import load_recipe
    from ponder.train.batch import collate
    from ponder.train.rl import RLTrainer
    from ponder.train.update import _micro_batch_loss, recompute_old_logprobs

    overrides = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
                 "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.taskgen.n_people=20",
                 "env.taskgen.n_train=8", "env.taskgen.n_eval=2", "lora.r=4", "algo.loss=ppo"]  # fmt: skip
    trainer = RLTrainer.from_recipe(load_recipe(None, overrides), "unused", reward=lambda t, task: (1.0, {}))
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    sampled = batch.old_logprobs.clone()
    metrics = recompute_old_logprobs(trainer.policy, batch, 2, 1.0)
    # the hf backend samples with the trainer's own numbers: nothing to correct
    assert torch.equal(batch.sampler_logprobs, sampled)
    assert metrics["rollout/logprob_mismatch"] < 1e-4 and abs(metrics["rollout/sampler_kl"]) < 1e-6
    advantages = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0))
    batch.advantages, batch.returns = advantages * batch.loss_mask, torch.zeros_like(advantages)
    inputs = trainer.update_inputs()
    batch.sampler_logprobs = None
    plain, _ = _micro_batch_loss(inputs, batch, 10.0)
    batch.sampler_logprobs = batch.old_logprobs + math.log(2.0)  # the sampler found every token twice as likely
    halved, stats = _micro_batch_loss(inputs, batch, 10.0)
    assert stats["policy/tis_weight"] == pytest.approx(0.5)
    assert float(halved.detach()) == pytest.approx(0.5 * float(plain.detach()), rel=1e-5)
    inputs.algo.tis_cap = None  # no weight: the loss is the plain one
    unweighted, _ = _micro_batch_loss(inputs, batch, 10.0)
    assert float(unweighted.detach()) == pytest.approx(float(plain.detach()), rel=1e-6)
