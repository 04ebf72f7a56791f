"""The RL update skips rows whose advantages are all zero (a GRPO group whose rewards
are all equal): the weights after the update are those of the update that runs every
row (up to the kernels' float rounding, ~1e-8), and rows an entropy term reads are
never skipped."""

import pytest
import torch

from ponder.jobs.parts import rl_trainer
import ponder.train.update as update
from ponder.config import load_recipe
from ponder.train.batch import collate

OVERRIDES = ["model.name=tiny", "train.tasks_per_step=3", "rollout.group_size=2", "rollout.batch_size=6",
             "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "env.options.taskgen.n_people=20",
             "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "lora.r=4"]  # fmt: skip


def _updated(idle: list[int], skip: bool, monkeypatch, *overrides: str) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    trainer = rl_trainer(load_recipe(None, [*OVERRIDES, *overrides]), "unused",
                                    reward=lambda t, task: (1.0, {}))  # fmt: skip
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(3))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    noise = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1))
    advantages = noise * batch.loss_mask
    advantages[idle] = 0.0
    if not skip:
        monkeypatch.setattr(update, "carries_gradient", lambda inputs, mini: [True] * len(mini))
    stats = update.optimise(trainer.update_inputs(), batch, advantages, torch.zeros_like(advantages))
    monkeypatch.undo()
    return [p.detach().clone() for p in trainer._trainable()], stats


@pytest.mark.parametrize("idle", [[1, 4], [0, 1, 2, 3, 4, 5]])
def test_skipping_idle_rows_leaves_the_update_as_it_was(monkeypatch, idle):
    skipped, stats = _updated(idle, True, monkeypatch)
    every, every_stats = _updated(idle, False, monkeypatch)
    assert stats["update/idle_rows"] == len(idle) and every_stats["update/idle_rows"] == 0
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(skipped, every, strict=True))
    assert stats["optim/grad_norm"] == pytest.approx(every_stats["optim/grad_norm"], rel=1e-6)
    assert stats["loss/policy"] == pytest.approx(every_stats["loss/policy"], abs=1e-7)
    moved, _ = _updated([], True, monkeypatch)
    gap = max(float((a - b).abs().max()) for a, b in zip(skipped, moved, strict=True))
    assert gap > 1e-5  # the idle rows were real rows: with advantages they move the weights


def test_a_row_an_entropy_term_reads_is_never_idle(monkeypatch):
    _, stats = _updated([1, 4], True, monkeypatch, "algo.entropy_coef=0.01")
    assert stats["update/idle_rows"] == 0
