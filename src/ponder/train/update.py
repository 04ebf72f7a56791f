"""The optimisation half of an RL step: epochs × mini-batches × micro-batches.

Gradient accumulation is exact: every micro-batch's loss is divided by the
mini-batch's aggregation denominator (ponder.algos.aggregation_denominator), so a
mini-batch of 8 in micro-batches of 1 gives the same gradient as one pass of 8.
"""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from ponder.algos import aggregate, aggregation_denominator, entropy_bonus, kl_estimate, policy_loss, value_loss
from ponder.algos.utils import masked_mean
from ponder.models import Policy, adapters_disabled
from ponder.models.value_head import ValueHead, forward_policy
from ponder.train.batch import TokenBatch

if TYPE_CHECKING:
    from ponder.train.rl import RLTrainer


@torch.no_grad()
def forward_pass_no_grad(
    policy: Policy,
    batch: TokenBatch,
    micro_batch_size: int,
    temperature: float,
    value_head: ValueHead | None = None,
    reference: bool = False,
) -> torch.Tensor:
    """Reference logprobs (adapters disabled) or value estimates, [B, L-1], in micro-batches."""
    out = torch.zeros_like(batch.old_logprobs)
    for start in range(0, len(batch), micro_batch_size):
        rows = list(range(start, min(start + micro_batch_size, len(batch))))
        part = batch.select(rows)
        with adapters_disabled(policy.model) if reference else contextlib.nullcontext():
            logprobs, _, values = forward_policy(
                policy.model, part.input_ids, part.attention_mask, temperature, value_head, part.loss_mask
            )
        result = logprobs if reference else values
        out[rows, : result.shape[1]] = result
    return out


def optimise(trainer: RLTrainer, batch: TokenBatch, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """algo.epochs passes over the batch in shuffled mini-batches; averaged metrics."""
    algo = trainer.recipe.algo
    batch.advantages, batch.returns = advantages, returns
    size = algo.mini_batch_size or len(batch)
    totals: dict[str, float] = defaultdict(float)
    updates = 0
    for _ in range(algo.epochs):
        order = list(range(len(batch)))
        random.shuffle(order)  # python RNG: seeded and checkpointed with the run
        for start in range(0, len(order), size):
            for key, value in _mini_batch_step(trainer, batch.select(order[start : start + size])).items():
                totals[key] += value
            updates += 1
    return {key: value / updates for key, value in totals.items()}


def _mini_batch_step(trainer: RLTrainer, mini: TokenBatch) -> dict[str, float]:
    """Accumulate gradients over micro-batches, clip, step optimizer and scheduler."""
    algo, loss_cfg = trainer.recipe.algo, trainer.loss_config()
    denominator = aggregation_denominator(algo.aggregation, mini.loss_mask, loss_cfg)
    trainer.policy.model.train()
    stats: dict[str, float] = defaultdict(float)
    tokens = float(mini.loss_mask.sum())
    # Micro-batches of similar lengths pad less; the accumulated gradient is the same.
    # (Keeping a GRPO group together instead, so its whole prompt is read once, padded
    # 26 % more on multi-turn search-QA and made the update 35 % slower; the prefix all
    # rows share, the system prompt, is read once per micro-batch either way.)
    lengths = mini.attention_mask.sum(-1).tolist()
    rows = sorted(range(len(mini)), key=lambda i: lengths[i])
    for start in range(0, len(rows), algo.micro_batch_size):
        part = mini.select(rows[start : start + algo.micro_batch_size])
        loss, part_stats = _micro_batch_loss(trainer, part, denominator)
        if not torch.isfinite(loss):
            raise _training_error(trainer, "loss is NaN or infinite")
        loss.backward()
        weight = float(part.loss_mask.sum()) / max(tokens, 1.0)
        for key, value in part_stats.items():
            stats[key] += value * weight
    max_norm = trainer.recipe.optim.max_grad_norm or float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer._trainable(), max_norm)
    if not torch.isfinite(grad_norm):
        trainer.optimizer.zero_grad(set_to_none=True)
        raise _training_error(trainer, "gradient norm is NaN or infinite")
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    stats["optim/grad_norm"] = float(grad_norm)
    return dict(stats)


def _micro_batch_loss(trainer: RLTrainer, part: TokenBatch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
    algo, loss_cfg = trainer.recipe.algo, trainer.loss_config()
    temperature = trainer.recipe.rollout.sampling.temperature
    mask = part.loss_mask
    logprobs, entropy, values = forward_policy(
        trainer.policy.model, part.input_ids, part.attention_mask, temperature, trainer.value_head, mask,
        with_entropy=True, entropy_grad=algo.entropy_coef > 0,
    )  # fmt: skip
    per_token, metrics = policy_loss(algo.loss, logprobs, part.old_logprobs, part.advantages, mask, loss_cfg)
    loss = aggregate(algo.aggregation, per_token, mask, loss_cfg, denominator)
    stats = {f"policy/{k}": float(v) for k, v in metrics.items()}
    stats["loss/policy"] = float(masked_mean(per_token.detach(), mask))
    if part.ref_logprobs is not None:
        token_kl = kl_estimate(logprobs, part.ref_logprobs, algo.kl_estimator)
        stats["policy/kl"] = float(masked_mean(token_kl.detach(), mask))
        if not algo.kl_in_reward:
            loss = loss + trainer.kl.coef * aggregate(algo.aggregation, token_kl, mask, loss_cfg, denominator)
    if algo.entropy_coef > 0:
        bonus = entropy_bonus(entropy, mask)
        loss = loss + algo.entropy_coef * aggregate(algo.aggregation, bonus, mask, loss_cfg, denominator)
    stats["policy/entropy"] = float(masked_mean(entropy.detach(), mask))
    if values is not None:
        per_value, value_metrics = value_loss(values, part.old_values, part.returns, mask, algo.value_clip)
        loss = loss + algo.value_coef * aggregate(algo.aggregation, per_value, mask, loss_cfg, denominator)
        stats.update({f"value/{k}": float(v) for k, v in value_metrics.items()})
        stats["loss/value"] = float(masked_mean(per_value.detach(), mask))
    return loss, stats


class TrainingError(RuntimeError):
    """Training cannot go on (NaN loss or reward); the last good checkpoint is intact."""


def _training_error(trainer: RLTrainer, what: str) -> Exception:
    return TrainingError(f"step {trainer.step + 1}: {what}; stopped, last good checkpoint kept in {trainer.run_dir}")
