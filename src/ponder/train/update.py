"""The optimisation half of an RL step: epochs × mini-batches × micro-batches.

Gradient accumulation is exact: every micro-batch's loss is divided by the
mini-batch's aggregation denominator (ponder.algos.aggregation_denominator), so a
mini-batch of 8 in micro-batches of 1 gives the same gradient as one pass of 8.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ponder.algos import (
    LossConfig,
    aggregate,
    aggregation_denominator,
    entropy_bonus,
    kl_estimate,
    policy_loss,
    sampler_mismatch,
    tis_weights,
    value_loss,
)
from ponder.algos.distill import DISTILL_LOSSES, DistillConfig, TeacherScores
from ponder.algos.utils import masked_mean
from ponder.config import AlgoConfig
from ponder.models import Policy
from ponder.models.cpu_threads import cpu_block
from ponder.models.forward import forward_policy
from ponder.models.value_head import ValueHead
from ponder.train.batch import TokenBatch
from ponder.train.optim import NonFiniteError, optimizer_step
from ponder.train.sft import masked_nll_pass


@dataclass
class UpdateInputs:
    """Everything an RL update reads besides the batch: the policy (and value head),
    the algorithm's settings, the loss config, the sampling temperature the
    log-probs are taken at, the KL coefficient now, the optimizer with its
    schedule, parameters and clipping norm, and the step's demonstrations (with
    algo.sft_coef > 0: their SFT loss joins every optimizer step). `masks_for(input_ids,
    loss_mask, constraints)`: the masks actions were sampled under (rollout.constrain),
    or None."""

    policy: Policy
    value_head: ValueHead | None
    algo: AlgoConfig
    loss: LossConfig
    temperature: float
    kl_coef: float
    params: list[torch.nn.Parameter]
    optimizer: Any
    scheduler: Any
    max_grad_norm: float | None
    demonstrations: TokenBatch | None = None
    masks_for: Callable[..., Any] | None = None
    distill: DistillTerm | None = None


@dataclass
class DistillTerm:
    """A distillation loss beside the policy loss (teacher.loss gkd or topk; opd is an
    advantage, train/rl.py): `loss` a DISTILL_LOSSES name, weighted by `coef`.
    `teacher_logits(part, keep)` -> (the teacher's logits / T at positions keep [rows,
    K, V], the rows of `part` it scores), for losses that read the teacher's logits;
    `topk` losses read the batch's teacher_topk_* instead."""

    loss: str
    coef: float
    config: DistillConfig
    teacher_logits: Callable[[TokenBatch, torch.Tensor], tuple[torch.Tensor, list[int]]] | None = None


@torch.no_grad()
def forward_pass_no_grad(
    policy: Policy,
    batch: TokenBatch,
    micro_batch_size: int,
    temperature: float,
    value_head: ValueHead | None = None,
    masks_for: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """Value estimates (with value_head), or else the model's logprobs as it is now
    (the reference's inside the trainer's reference context), [B, L-1], in micro-batches;
    under the masks the actions were sampled with (`masks_for`, see UpdateInputs)."""
    out = torch.zeros_like(batch.old_logprobs)
    for start in range(0, len(batch), micro_batch_size):
        rows = list(range(start, min(start + micro_batch_size, len(batch))))
        part = batch.select(rows).to(policy.device)
        with cpu_block():  # fewer while other processes hold the cores
            masks = masks_for(part.input_ids, part.loss_mask, part.constraints) if masks_for is not None else None
            logprobs, _, values = forward_policy(
                policy.model, part.input_ids, part.attention_mask, temperature, value_head, part.loss_mask,
                masks=masks,
            )  # fmt: skip
        result = values if value_head is not None else logprobs
        out[rows, : result.shape[1]] = result.to(out.device)
    return out


def recompute_old_logprobs(policy: Policy, batch: TokenBatch, micro_batch_size: int, temperature: float,
                           masks_for: Callable[..., Any] | None = None) -> dict[str, float]:
    """For a sampler whose kernels are not the trainer's (vLLM, a bf16 decoder): its
    log-probs move to batch.sampler_logprobs, old_logprobs become the trainer's own
    (the PPO ratio's denominator; the TIS weight corrects for the gap); returns the gap
    as metrics. An update of one pass at the sampling weights needs no extra forward:
    see `take_old_logprobs_from_forward`."""
    batch.sampler_logprobs = batch.old_logprobs
    batch.old_logprobs = forward_pass_no_grad(policy, batch, micro_batch_size, temperature, masks_for=masks_for)
    mismatch = sampler_mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask)
    return {f"rollout/{name}": value for name, value in mismatch.items()}


def take_old_logprobs_from_forward(batch: TokenBatch) -> None:
    """The update will be one pass over the batch at the current weights (one epoch, one
    mini-batch), so its own forward, detached, is the trainer's old log-probs, as
    `recompute_old_logprobs` would compute them without its extra forward: the PPO
    ratio is 1 and the TIS weight compares that forward with the sampler's log-probs
    (a kernel gap; with async rollouts also the update the sampler had not seen). The
    gap is logged by the update (rollout/logprob_mismatch, rollout/sampler_kl)."""
    batch.sampler_logprobs, batch.old_from_forward = batch.old_logprobs, True


def optimise(inputs: UpdateInputs, batch: TokenBatch, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """algo.epochs passes over the batch in shuffled mini-batches; averaged metrics.
    Raises NonFiniteError (weights untouched by that mini-batch) on a NaN loss or gradient."""
    algo = inputs.algo
    batch.advantages, batch.returns = advantages, returns
    size = algo.mini_batch_size or len(batch)
    totals: dict[str, float] = defaultdict(float)
    updates = 0
    for _ in range(algo.epochs):
        order = list(range(len(batch)))
        random.shuffle(order)  # python RNG: seeded and checkpointed with the run
        for start in range(0, len(order), size):
            for key, value in _mini_batch_step(inputs, batch.select(order[start : start + size])).items():
                totals[key] += value
            updates += 1
    return {key: value / updates for key, value in totals.items()}


def _mini_batch_step(inputs: UpdateInputs, mini: TokenBatch) -> dict[str, float]:
    """Accumulate gradients over micro-batches, then the shared optimizer step."""
    algo = inputs.algo
    denominator = aggregation_denominator(algo.aggregation, mini.loss_mask, inputs.loss)
    inputs.policy.model.train()
    stats: dict[str, float] = defaultdict(float)
    # Micro-batches of similar lengths pad less; the accumulated gradient is the same.
    # (Keeping a GRPO group together instead, so its whole prompt is read once, padded
    # 26 % more on multi-turn search-QA and made the update 35 % slower; the prefix all
    # rows share, the system prompt, is read once per micro-batch either way.)
    lengths = mini.attention_mask.sum(-1).tolist()
    moving = carries_gradient(inputs, mini)
    rows = sorted((i for i in range(len(mini)) if moving[i]), key=lambda i: lengths[i])
    tokens = float(mini.loss_mask[rows].sum())
    if not rows:  # every row idle: the optimizer steps on a zero gradient, as if they had run
        for param in inputs.params:
            param.grad = torch.zeros_like(param)
    for start in range(0, len(rows), algo.micro_batch_size):
        part = mini.select(rows[start : start + algo.micro_batch_size]).to(inputs.policy.device)
        with cpu_block():  # fewer while other processes hold the cores
            loss, part_stats = _micro_batch_loss(inputs, part, denominator)
            if not torch.isfinite(loss):
                inputs.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError("loss is NaN or infinite")
            loss.backward()
        weight = float(part.loss_mask.sum()) / max(tokens, 1.0)
        for key, value in part_stats.items():
            stats[key] += value * weight
    if inputs.demonstrations is not None:
        stats["loss/sft"] = _demonstration_backward(inputs, inputs.demonstrations)
    grad_norm, _ = optimizer_step(inputs.params, inputs.optimizer, inputs.scheduler, inputs.max_grad_norm)
    stats["optim/grad_norm"] = grad_norm
    # The loss over the whole mini-batch (idle rows' is exactly 0); policy/* over the rows run.
    all_tokens = float(mini.loss_mask.sum())
    stats["loss/policy"] = stats["loss/policy"] * tokens / max(all_tokens, 1.0)
    stats["update/idle_rows"] = float(len(mini) - len(rows))
    return dict(stats)


def _demonstration_backward(inputs: UpdateInputs, demonstrations: TokenBatch) -> float:
    """Accumulate algo.sft_coef × the demonstrations' token-mean NLL (at temperature 1,
    the warm-up's loss) into the optimizer step's gradient; returns the NLL."""
    nll = masked_nll_pass(inputs.policy, demonstrations, inputs.algo.micro_batch_size, inputs.algo.sft_coef)
    if not math.isfinite(nll):
        inputs.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError("SFT loss on the demonstrations is NaN or infinite")
    return nll


def carries_gradient(inputs: UpdateInputs, mini: TokenBatch) -> list[bool]:
    """Which rows of the mini-batch the loss can move. Every policy loss is proportional
    to the advantage, so a row whose advantages are zero on all its loss tokens (a GRPO
    group whose rewards are all equal) adds an exact zero to the gradient unless a KL,
    entropy, value or distillation term reads it: its forward and backward are skipped,
    and the update is the same (the aggregation's denominator still counts its tokens;
    up to the float rounding of the kernels, ~1e-8, tests/train/test_idle_rows.py)."""
    algo = inputs.algo
    kl_in_loss = mini.ref_logprobs is not None and inputs.kl_coef != 0 and not algo.kl_in_reward
    if inputs.value_head is not None or algo.entropy_coef != 0 or kl_in_loss or inputs.distill is not None:
        return [True] * len(mini)
    return ((mini.advantages != 0) & mini.loss_mask.bool()).any(dim=-1).tolist()


def _micro_batch_loss(inputs: UpdateInputs, part: TokenBatch, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
    algo, loss_cfg = inputs.algo, inputs.loss
    mask = part.loss_mask
    masks = inputs.masks_for(part.input_ids, mask, part.constraints) if inputs.masks_for is not None else None
    kept: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if inputs.distill is not None else None
    logprobs, entropy, values = forward_policy(
        inputs.policy.model, part.input_ids, part.attention_mask, inputs.temperature, inputs.value_head, mask,
        with_entropy=True, entropy_grad=algo.entropy_coef > 0, masks=masks, kept_logits=kept,
    )  # fmt: skip
    old = logprobs.detach() if part.old_from_forward else part.old_logprobs
    per_token, metrics = policy_loss(algo.loss, logprobs, old, part.advantages, mask, loss_cfg)
    if part.sampler_logprobs is not None and algo.tis_cap is not None:
        weights = tis_weights(old, part.sampler_logprobs, mask, algo.tis_cap)
        per_token = per_token * weights
        metrics["tis_weight"] = float(masked_mean(weights, mask))
    loss = aggregate(algo.aggregation, per_token, mask, loss_cfg, denominator)
    stats = {f"policy/{k}": float(v) for k, v in metrics.items()}
    if part.old_from_forward:  # the sampler's gap to the trainer, over the rows run
        gap = sampler_mismatch(old, part.sampler_logprobs, mask)
        stats.update({f"rollout/{k}": v for k, v in gap.items()})
    stats["loss/policy"] = float(masked_mean(per_token.detach(), mask))
    if part.ref_logprobs is not None:
        token_kl = kl_estimate(logprobs, part.ref_logprobs, algo.kl_estimator)
        stats["policy/kl"] = float(masked_mean(token_kl.detach(), mask))
        if not algo.kl_in_reward:
            loss = loss + inputs.kl_coef * aggregate(algo.aggregation, token_kl, mask, loss_cfg, denominator)
    if algo.entropy_coef > 0:
        bonus = entropy_bonus(entropy, mask)
        loss = loss + algo.entropy_coef * aggregate(algo.aggregation, bonus, mask, loss_cfg, denominator)
    stats["policy/entropy"] = float(masked_mean(entropy.detach(), mask))
    if kept:
        per_distill, distill_mask = _distill_per_token(inputs.distill, part, *kept[0])
        loss = loss + inputs.distill.coef * aggregate(algo.aggregation, per_distill, distill_mask, loss_cfg, denominator)
        stats["loss/distill"] = float(masked_mean(per_distill.detach(), distill_mask))
    if values is not None:
        per_value, value_metrics = value_loss(values, part.old_values, part.returns, mask, algo.value_clip)
        loss = loss + algo.value_coef * aggregate(algo.aggregation, per_value, mask, loss_cfg, denominator)
        stats.update({f"value/{k}": float(v) for k, v in value_metrics.items()})
        stats["loss/value"] = float(masked_mean(per_value.detach(), mask))
    return loss, stats


def _distill_per_token(term: DistillTerm, part: TokenBatch, keep: torch.Tensor,
                       student_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The distillation loss per token [b, L-1] at the kept positions (0 elsewhere) and
    the mask of the tokens it covers: policy tokens of the rows a teacher scores."""
    mask = part.loss_mask[:, keep]
    if DISTILL_LOSSES.trait(term.loss, "teacher") == "topk":
        scores = TeacherScores(topk_ids=part.teacher_topk_ids[:, keep], topk_logprobs=part.teacher_topk_logprobs[:, keep])
        mask = mask * scores.topk_logprobs[..., 0].isfinite()
        scores.topk_logprobs = scores.topk_logprobs.nan_to_num(0.0)
        rows = list(range(len(part)))
    else:
        teacher_logits, rows = term.teacher_logits(part, keep)
        scores = TeacherScores(logits=teacher_logits)
    covered = torch.zeros_like(mask)
    covered[rows] = mask[rows]
    per_kept = torch.zeros(mask.shape, device=mask.device)
    if rows:
        index = torch.tensor(rows, device=mask.device)
        values = DISTILL_LOSSES.get(term.loss)(student_logits[index], scores, covered[index], term.config)
        per_kept = per_kept.index_copy(0, index, values)
    shape = part.loss_mask.shape
    full_mask = torch.zeros(shape, dtype=part.loss_mask.dtype, device=mask.device).index_copy(1, keep, covered)
    per_token = torch.zeros(shape, device=mask.device).index_copy(1, keep, per_kept)
    return per_token, full_mask


class TrainingError(RuntimeError):
    """Training cannot go on (NaN loss or reward); the last good checkpoint is intact."""

