"""Policy losses, the value loss, the entropy bonus and loss aggregations.

Policy losses are registered pure functions with one signature:

    loss_fn(logprobs, old_logprobs, advantages, loss_mask, cfg) -> (loss_per_token, metrics)

all tensors [B, T]; `loss_per_token` is 0 where `loss_mask` is 0 and `metrics` maps
names to floats (masked means over policy tokens). An aggregation then turns
`loss_per_token` into the scalar to backpropagate:

    AGGREGATIONS.get(name)(loss_per_token, loss_mask, cfg, global_denominator=None)

Gradient accumulation: every aggregation is numerator / denominator, the numerator a
sum over the rows given. Split a mini-batch into micro-batches, pass every micro-batch
the denominator of the WHOLE mini-batch (`aggregation_denominator(name, full_mask,
cfg)`), and the summed micro-batch gradients equal the full-batch gradient exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ponder.algos.kl import kl_estimate
from ponder.algos.utils import masked_mean
from ponder.registry import Registry

#: log-ratios are clamped before exp so one stale token cannot overflow (as verl).
LOG_RATIO_CLAMP = 20.0


@dataclass
class LossConfig:
    """Settings of the policy and value losses and of loss aggregation.

    clip_low / clip_high: PPO clips the ratio to [1 − clip_low, 1 + clip_high]; a
        larger clip_high (0.28, DAPO's clip-higher) lets unlikely tokens with A > 0 grow.
    clip_c: dual-clip bound (> 1) for A < 0: the loss is capped at −clip_c·A so one huge
        ratio cannot dominate; None = off.
    aggregation: name in AGGREGATIONS: token_mean, seq_mean_token_mean, seq_mean_token_sum_norm.
    norm_constant: the constant seq_mean_token_sum_norm divides each sequence's token
        sum by (Dr. GRPO: the maximum response length).
    value_clip: the value loss clips new values to old ± value_clip (None = unclipped).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float | None = None
    aggregation: str = "token_mean"
    norm_constant: float = 1.0
    value_clip: float | None = 0.2


PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossConfig],
    tuple[torch.Tensor, dict[str, float]],
]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def _zero_off(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def _ratio_metrics(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """approx_kl: masked mean of k3 estimating KL(π_old ‖ π) from the sampled tokens;
    ratio_mean: masked mean of π/π_old."""
    with torch.no_grad():
        log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        return {
            "approx_kl": float(masked_mean(approx_kl, mask)),
            "ratio_mean": float(masked_mean(log_ratio.exp(), mask)),
        }


@POLICY_LOSSES.register("vanilla")
def vanilla_loss(logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig):
    """REINFORCE: loss = −A · log π(token). Shapes [B, T]; 0 where loss_mask is 0.

    Its gradient, −A·∇log π, equals the PPO surrogate's −A·∇ρ at ρ = 1 (on-policy,
    old == new), so the two differ only once the policy has moved. Metrics as `ppo`
    with clip_fraction 0.
    """
    loss = _zero_off(-advantages * logprobs, loss_mask)
    return loss, {"clip_fraction": 0.0, **_ratio_metrics(logprobs, old_logprobs, loss_mask)}


@POLICY_LOSSES.register("ppo")
def ppo_loss(logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig):
    """PPO clipped surrogate with asymmetric clips (DAPO clip-higher) and optional dual clip.

    logprobs (new, with grad), old_logprobs (behaviour policy), advantages, loss_mask: [B, T].
    ρ = exp(logprobs − old_logprobs) (log-ratio clamped to ±20);
    loss = max(−ρA, −clip(ρ, 1 − clip_low, 1 + clip_high)·A); with clip_c and A < 0 the
    loss is further capped at −clip_c·A (dual clip). 0 where loss_mask is 0.
    Metrics (masked means): clip_fraction (share of tokens where the clipped branch is
    strictly larger, i.e. active and gradient-free), dual_clip_fraction, approx_kl, ratio_mean.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(loss, dtype=torch.bool)
    if cfg.clip_c is not None:
        if cfg.clip_c <= 1.0:
            raise ValueError(f"clip_c must be > 1 (dual-clip bound), got {cfg.clip_c}")
        cap = -advantages * cfg.clip_c
        dual_active = (advantages < 0) & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    metrics = {
        "clip_fraction": float(masked_mean((clipped > unclipped).float(), loss_mask)),
        "dual_clip_fraction": float(masked_mean(dual_active.float(), loss_mask)),
        **_ratio_metrics(logprobs, old_logprobs, loss_mask),
    }
    return _zero_off(loss, loss_mask), metrics


@POLICY_LOSSES.register("importance_sampling")
def importance_sampling_loss(logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig):
    """Importance-weighted policy gradient without clipping: loss = −ρ·A with
    ρ = exp(logprobs − old_logprobs) (log-ratio clamped to ±20). Shapes [B, T]; 0 where
    loss_mask is 0. Tinker's `importance_sampling` (old_logprobs: the sampler's).

    At ρ = 1 its gradient is vanilla's, −A·∇log π; unlike `ppo` it keeps following the
    ratio once the policy has moved. Metrics as `ppo` with clip_fraction 0.
    """
    ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    loss = _zero_off(-advantages * ratio, loss_mask)
    return loss, {"clip_fraction": 0.0, **_ratio_metrics(logprobs, old_logprobs, loss_mask)}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss per token.

    values (new, with grad), old_values (at rollout), returns (targets), mask: [B, T].
    v_clip = old + clip(values − old, ±clip_range); loss = ½·max((v − R)², (v_clip − R)²);
    clip_range None = ½(v − R)². 0 where mask is 0. Metrics: value_clip_fraction (share
    where the clipped error is larger), value_mean, value_error (masked mean of (v − R)²).
    """
    error = (values - returns).square()
    loss = error
    if clip_range is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped_error = (clipped_values - returns).square()
        loss = torch.maximum(error, clipped_error)
        clip_fraction = float(masked_mean((clipped_error > error).float(), mask))
    else:
        clip_fraction = 0.0
    metrics = {
        "value_clip_fraction": clip_fraction,
        "value_mean": float(masked_mean(values.detach(), mask)),
        "value_error": float(masked_mean(error.detach(), mask)),
    }
    return _zero_off(0.5 * loss, mask), metrics


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Entropy regulariser as a loss per token: −entropy where mask is 1, else 0.

    entropy, mask: [B, T]. Aggregate it like the policy loss and add coef × it, so
    minimising the total raises entropy.
    """
    return _zero_off(-entropy, mask)


def demonstration_nll(logprobs: torch.Tensor, mask: torch.Tensor, tokens: float) -> torch.Tensor:
    """Negative log-likelihood of demonstration tokens, summed and divided by `tokens`.

    logprobs: [B, T] the policy's log-probs of the demonstrated tokens; mask: [B, T],
    1 on the tokens to imitate (the policy's turns), 0 on prompt, observations and
    padding; tokens: the demonstration batch's mask sum, so micro-batches of one batch
    add up to its exact token mean. The SFT loss, and the anchor an RL update can mix
    in (AlgoConfig.sft_coef, InstructGPT's PPO-ptx).
    """
    return -(logprobs * mask).sum() / max(tokens, 1.0)


def weighted_nll(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood per token scaled by a real weight: −weights · logprobs.

    logprobs, weights: [B, T] (or [T]); a weight of 0 (prompt, padding) drops the
    token, and weights need not be 0/1. Its sum is Tinker's `cross_entropy`; with a
    0/1 mask and the sum divided by the mask's, it is `demonstration_nll`.
    """
    return _zero_off(-weights * logprobs, weights != 0)


def tis_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights of the trainer's policy over the sampler's, [B, T].

    old_logprobs: the trainer's log-probs of the sampled tokens before the update;
    sampler_logprobs: the generation backend's for the same tokens (another engine's
    kernels, e.g. vLLM's); loss_mask: 1 on policy tokens. w = min(exp(old − sampler),
    cap), log-ratio clamped to ±20, 0 where loss_mask is 0, no gradient. The per-token
    policy loss times w corrects for tokens drawn from a slightly different
    distribution than the trainer's (TIS, as in verl and SkyRL); the cap bounds its variance.
    """
    if cap <= 0:
        raise ValueError(f"algo.tis_cap must be > 0, got {cap}")
    with torch.no_grad():
        log_ratio = (old_logprobs - sampler_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return _zero_off(log_ratio.exp().clamp(max=cap), loss_mask)


def sampler_mismatch(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's, over policy tokens
    ([B, T] each): logprob_mismatch = mean |old − sampler|, sampler_kl = k3 estimate
    of KL(sampler ‖ trainer) from the sampler's own tokens."""
    with torch.no_grad():
        gap = (old_logprobs - sampler_logprobs).abs()
        kl = kl_estimate(sampler_logprobs, old_logprobs, "k3")
        return {"logprob_mismatch": float(masked_mean(gap, loss_mask)), "sampler_kl": float(masked_mean(kl, loss_mask))}


def policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Run the policy loss registered as `name`: (loss_per_token [B, T], metrics)."""
    return POLICY_LOSSES.get(name)(logprobs, old_logprobs, advantages, loss_mask, cfg or LossConfig())


# --- aggregation -------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation split as numerator(loss, mask, cfg) / denominator(mask, cfg).

    The numerator is a sum over rows (so micro-batch numerators add up to the batch's);
    calling the object divides by `global_denominator` when given (the whole
    mini-batch's denominator, for gradient accumulation), else by its own.
    """

    numerator: Callable[[torch.Tensor, torch.Tensor, LossConfig], torch.Tensor]
    denominator: Callable[[torch.Tensor, LossConfig], float]

    def __call__(
        self,
        loss_per_token: torch.Tensor,
        mask: torch.Tensor,
        cfg: LossConfig,
        global_denominator: float | None = None,
    ) -> torch.Tensor:
        denominator = self.denominator(mask, cfg) if global_denominator is None else global_denominator
        return self.numerator(loss_per_token, mask, cfg) / max(float(denominator), 1e-12)


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def _token_sum(loss_per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Σ over all policy tokens. [B, T] → scalar."""
    return _zero_off(loss_per_token, mask).sum()


def _token_count(mask: torch.Tensor, cfg: LossConfig) -> float:
    """Number of policy tokens in the batch."""
    return float(mask.bool().sum())


def _sequence_count(mask: torch.Tensor, cfg: LossConfig) -> float:
    """Number of sequences with at least one policy token (empty rows add nothing and
    are not counted)."""
    return float(mask.bool().any(dim=-1).sum())


def _sum_of_sequence_means(loss_per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Σ_i (Σ_t loss_it / n_i) over sequences; n_i = policy tokens of row i (empty rows: 0)."""
    lengths = mask.bool().sum(dim=-1)
    sums = _zero_off(loss_per_token, mask).sum(dim=-1)
    return torch.where(lengths > 0, sums / lengths.clamp(min=1), torch.zeros_like(sums)).sum()


def _sum_of_normed_sequence_sums(loss_per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig):
    """Σ_i (Σ_t loss_it / norm_constant) — Dr. GRPO's length-unbiased sequence loss."""
    return _zero_off(loss_per_token, mask).sum() / cfg.norm_constant


AGGREGATIONS.add("token_mean", Aggregation(_token_sum, _token_count))
AGGREGATIONS.add("seq_mean_token_mean", Aggregation(_sum_of_sequence_means, _sequence_count))
AGGREGATIONS.add("seq_mean_token_sum_norm", Aggregation(_sum_of_normed_sequence_sums, _sequence_count))


def aggregate(
    name: str,
    loss_per_token: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig | None = None,
    global_denominator: float | None = None,
) -> torch.Tensor:
    """Reduce loss_per_token [B, T] to a scalar with the aggregation registered as `name`.

    mask: [B, T], 1 on the tokens that count. `global_denominator`: the denominator of
    the whole mini-batch when this call sees only a micro-batch (see module doc).
    """
    return AGGREGATIONS.get(name)(loss_per_token, mask, cfg or LossConfig(), global_denominator)


def aggregation_denominator(name: str, mask: torch.Tensor, cfg: LossConfig | None = None) -> float:
    """The denominator aggregation `name` uses for this mask: policy tokens for
    token_mean, non-empty sequences for the seq_* ones. Compute it on the full
    mini-batch mask and pass it as `global_denominator` to every micro-batch."""
    return AGGREGATIONS.get(name).denominator(mask, cfg or LossConfig())
