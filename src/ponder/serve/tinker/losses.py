"""Tinker's built-in losses, each a thin mapping onto ponder's registered pure functions
(ponder/algos/losses.py). Every Tinker loss is a per-token loss summed over every
datum's every position (no mean): positions that should not count carry weight 0 or
advantage 0 in the datum itself.

    cross_entropy        −Σ weights · logπ(target)                     weighted_nll
    importance_sampling  −Σ exp(logπ − logq) · A                       POLICY_LOSSES["importance_sampling"]
    ppo                  −Σ min(ρA, clip(ρ, low, high)·A)               POLICY_LOSSES["ppo"]

logq is the sampler's log-prob (`logprobs` in loss_fn_inputs), A the `advantages`;
ppo's thresholds come from loss_fn_config `clip_low_threshold` / `clip_high_threshold`
(Tinker's defaults 0.8 and 1.2, i.e. ponder's clip_low = clip_high = 0.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ponder.algos.losses import LossConfig, policy_loss, weighted_nll
from ponder.registry import Registry

# (logprobs [B, T], inputs by name each [B, T], loss_fn_config) -> loss per token [B, T]
PerToken = Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], torch.Tensor]


@dataclass(frozen=True)
class TinkerLoss:
    """A Tinker loss: the loss_fn_inputs it needs (besides target_tokens) and may take
    (with their defaults), the loss_fn_config keys it reads (with defaults), and its
    loss per token."""

    required: tuple[str, ...]
    optional: dict[str, float]
    config: dict[str, float]
    per_token: PerToken


TINKER_LOSSES: Registry[TinkerLoss] = Registry("Tinker loss")


def _cross_entropy(logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]) -> torch.Tensor:
    return weighted_nll(logprobs, inputs["weights"])


def _policy(name: str) -> PerToken:
    def per_token(logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]) -> torch.Tensor:
        low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
        cfg = LossConfig(clip_low=1.0 - low, clip_high=high - 1.0)
        everywhere = torch.ones_like(logprobs, dtype=torch.long)  # Tinker sums every position
        loss, _ = policy_loss(name, logprobs, inputs["logprobs"], inputs["advantages"], everywhere, cfg)
        return loss

    return per_token


TINKER_LOSSES.add("cross_entropy", TinkerLoss((), {"weights": 1.0}, {}, _cross_entropy))
TINKER_LOSSES.add("importance_sampling", TinkerLoss(("logprobs", "advantages"), {}, {}, _policy("importance_sampling")))
TINKER_LOSSES.add("ppo", TinkerLoss(("logprobs", "advantages"), {}, {
    "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, _policy("ppo")))  # fmt: skip


def loss_config(loss: TinkerLoss, name: str, given: dict[str, float | str]) -> dict[str, float]:
    """The loss's config: its defaults updated by `given`; a key it does not read or a
    value that is not a number is a ValueError naming it."""
    unknown = sorted(set(given) - set(loss.config))
    if unknown:
        takes = ", ".join(sorted(loss.config)) or "none"
        raise ValueError(f"loss_fn_config {unknown} is not read by {name} (it takes: {takes})")
    config = dict(loss.config)
    for key, value in given.items():
        if not isinstance(value, (int, float)):
            raise ValueError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
        config[key] = float(value)
    return config
