"""The RL update with a sampler whose log-probs are not the trainer's (vLLM): old
log-probs recomputed by the trainer, the mismatch reported, each token's loss weighted
by the truncated importance weight."""

import math

import pytest
import torch
from ponder.jobs.parts import rl_trainer


def test_update_weights_each_token_loss_and_recomputes_old_logprobs():
    from ponder.config import load_recipe
    from ponder.train.batch import collate
    from ponder.train.update import _micro_batch_loss, recompute_old_logprobs

    overrides = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
                 "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
                 "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4", "algo.loss=ppo"]  # fmt: skip
    trainer = rl_trainer(load_recipe(None, overrides), "unused", reward=lambda t, task: (1.0, {}))
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


def test_old_logprobs_from_the_updates_forward_give_the_recomputed_update():
    """One pass at the sampling weights: taking the trainer's old log-probs from the
    update's own forward (no extra forward) gives the loss, the gradient, the TIS
    weights and the logged mismatch of recomputing them first."""
    from ponder.config import load_recipe
    from ponder.train.batch import collate
    from ponder.train.update import _micro_batch_loss, recompute_old_logprobs, take_old_logprobs_from_forward

    overrides = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
                 "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
                 "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4", "algo.loss=ppo"]  # fmt: skip
    trainer = rl_trainer(load_recipe(None, overrides), "unused", reward=lambda t, task: (1.0, {}))
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    batches = [collate(trajectories, trainer.policy.tokenizer.pad_token_id) for _ in range(2)]
    noise = torch.randn(batches[0].loss_mask.shape, generator=torch.Generator().manual_seed(1))
    advantages = torch.randn(batches[0].loss_mask.shape, generator=torch.Generator().manual_seed(0))
    for batch in batches:  # a sampler with other numbers than the trainer's: up to ±0.6 per token
        batch.old_logprobs = batch.old_logprobs + 0.2 * noise.clamp(-3, 3) * batch.loss_mask
        batch.advantages, batch.returns = advantages * batch.loss_mask, torch.zeros_like(advantages)
    recomputed = recompute_old_logprobs(trainer.policy, batches[0], 2, 1.0)
    take_old_logprobs_from_forward(batches[1])
    inputs = trainer.update_inputs()
    results = []
    for batch in batches:
        inputs.policy.model.zero_grad(set_to_none=True)
        loss, stats = _micro_batch_loss(inputs, batch, 10.0)
        loss.backward()
        grads = [p.grad.clone() for p in inputs.params if p.grad is not None]
        results.append((float(loss.detach()), stats, grads))
    (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-5) and grads_a
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b, strict=True))
    assert stats_b["policy/tis_weight"] == pytest.approx(stats_a["policy/tis_weight"], rel=1e-5)
    assert stats_a["policy/tis_weight"] != pytest.approx(1.0, abs=1e-3)  # the weights are doing something
    for key in ("rollout/logprob_mismatch", "rollout/sampler_kl"):
        assert stats_b[key] == pytest.approx(recomputed[key], rel=1e-4)
    assert stats_b["rollout/logprob_mismatch"] > 0.05


def test_a_bf16_sampler_is_corrected_from_the_updates_own_forward():
    """rollout.sampling.dtype=bfloat16 (ponder's decoder with bf16 matrices): the step
    logs the sampler's gap and the TIS weight, from the update's own forward; with two
    epochs (two passes) the old log-probs are recomputed first."""
    from ponder.config import load_recipe

    base = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
            "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
            "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4",
            "rollout.sampling.dtype=bfloat16"]  # fmt: skip
    rewards = iter([1.0, 0.0] * 100)
    for extra, recomputed in (([], False), (["algo.epochs=2"], True)):
        recipe = load_recipe(None, base + extra)
        trainer = rl_trainer(recipe, "unused", reward=lambda t, task: (next(rewards), {}))
        metrics = trainer.train_step()
        assert 0 < metrics["rollout/logprob_mismatch"] < 1.0
        assert 0 < metrics["policy/tis_weight"] <= recipe.algo.tis_cap
        assert trainer._old_from_forward(4) != recomputed


@pytest.mark.parametrize("setting", ["rollout.sampling.dtype", "lora.base_matmul_dtype"])
def test_an_unknown_precision_fails_the_recipe_check_before_any_work(setting):
    from ponder.config import load_recipe
    from ponder.train.rl import check_recipe

    check_recipe(load_recipe(None, [f"{setting}=auto"]))
    with pytest.raises(ValueError, match=rf"{setting}: unknown 'fp8'; valid: model, auto, float32, bfloat16"):
        check_recipe(load_recipe(None, [f"{setting}=fp8"]))
