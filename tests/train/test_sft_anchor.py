"""algo.sft_coef (InstructGPT's PPO-ptx): every RL update also imitates the warm-up's
demonstrations. Its gradient is exactly sft_coef × the SFT loss's added to the RL
loss's, over seeded shuffled epochs of the demonstrations."""

import pytest
import torch

import ponder.train.update as update
from ponder.algos import demonstration_nll
from ponder.config import load_recipe
from ponder.models.forward import forward_policy
from ponder.train.batch import collate
from ponder.train.rl import RLTrainer, check_recipe
from ponder.jobs.parts import rl_trainer

OVERRIDES = ["model.name=tiny", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
             "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
             "env.options.taskgen.n_train=6", "env.options.taskgen.n_eval=2", "lora.r=4", "algo.micro_batch_size=1"]  # fmt: skip


def _trainer(*overrides: str) -> RLTrainer:
    torch.manual_seed(0)
    return rl_trainer(load_recipe(None, [*OVERRIDES, *overrides]), "unused",
                                 reward=lambda t, task: (1.0, {}))  # fmt: skip


def _update_gradient(trainer: RLTrainer, monkeypatch, scale: float) -> tuple[list[torch.Tensor], dict]:
    """The gradient one update would step on (the optimizer step is intercepted), with
    the RL advantages scale × fixed noise."""
    torch.manual_seed(1)
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    noise = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    grads: list[torch.Tensor] = []

    def captured(params, optimizer, scheduler, max_norm):
        grads.extend(p.grad.detach().clone() for p in params)
        optimizer.zero_grad(set_to_none=True)
        return 0.0, 0.0

    monkeypatch.setattr(update, "optimizer_step", captured)
    stats = update.optimise(trainer.update_inputs(), batch, scale * noise * batch.loss_mask, torch.zeros_like(noise))
    monkeypatch.undo()
    return grads, stats


def _sft_gradient(trainer: RLTrainer) -> tuple[list[torch.Tensor], float]:
    """The SFT loss's gradient on this step's demonstrations, in one pass."""
    demos = trainer.demonstration_batch()
    trainer.policy.model.train()
    logprobs, _, _ = forward_policy(trainer.policy.model, demos.input_ids, demos.attention_mask, loss_mask=demos.loss_mask)
    nll = demonstration_nll(logprobs, demos.loss_mask, float(demos.loss_mask.sum()))
    params = trainer._trainable()
    grads = torch.autograd.grad(nll, params)
    return list(grads), float(nll.detach())


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_update_gradient_is_rl_plus_coef_times_sft(monkeypatch, scale):
    plain, _ = _update_gradient(_trainer(), monkeypatch, scale)
    anchored_trainer = _trainer("algo.sft_coef=0.5", "algo.sft_rows=3")
    anchored, stats = _update_gradient(anchored_trainer, monkeypatch, scale)
    sft, nll = _sft_gradient(anchored_trainer)
    assert stats["loss/sft"] == pytest.approx(nll, rel=1e-5) and nll > 0.1
    for a, p, s in zip(anchored, plain, sft, strict=True):
        assert torch.allclose(a, p + 0.5 * s, rtol=1e-4, atol=1e-6)
    assert max(float(s.abs().max()) for s in sft) > 1e-4  # the anchor is a real gradient


def test_without_a_coefficient_nothing_is_built_or_logged(monkeypatch):
    trainer = _trainer()
    assert trainer.demonstrations == [] and trainer.demonstration_batch() is None
    _, stats = _update_gradient(trainer, monkeypatch, 1.0)
    assert "loss/sft" not in stats


def test_demonstrations_come_in_seeded_epochs_each_once():
    demo = ("algo.sft_coef=1.0", "algo.sft_rows=2", "env.max_turns=4")  # every demonstration completes
    trainer = _trainer(*demo)
    assert len(trainer.demonstrations) == 6
    seen = []
    for step in range(3):
        trainer.step = step
        seen += _unpadded(trainer.demonstration_batch())
    whole = collate(trainer.demonstrations, trainer.policy.tokenizer.pad_token_id)
    assert sorted(seen) == sorted(_unpadded(whole)) and len(set(seen)) == 6  # one epoch: each once
    trainer.step = 1
    again = _trainer(*demo)
    again.step = 1
    assert torch.equal(trainer.demonstration_batch().input_ids, again.demonstration_batch().input_ids)


def _unpadded(batch) -> list[tuple[int, ...]]:
    return [tuple(row[mask.bool()].tolist()) for row, mask in zip(batch.input_ids, batch.attention_mask)]


@pytest.mark.parametrize("override", ["algo.sft_coef=-0.1", "algo.sft_rows=0"])
def test_bad_coefficients_are_refused(override):
    with pytest.raises(ValueError, match=r"algo.sft_coef must be >= 0 and algo.sft_rows >= 1"):
        check_recipe(load_recipe(None, [*OVERRIDES, override]))
