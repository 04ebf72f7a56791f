"""Preference losses (DPO and relatives), as pure tensor functions (the EWC
penalty is in ponder.algos.continual, importable from here too).

Preference losses are registered with one signature:

    loss_fn(margin, beta, label_smoothing) -> losses [B]

where `margin` [B] = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)),
the difference of the chosen and rejected log-ratios (reference terms are 0 when
reference-free). `dpo_loss` builds the margin from sequence log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ponder.algos.continual import ewc_penalty  # noqa: F401  (re-exported)
from ponder.algos.utils import masked_mean, masked_sum
from ponder.registry import Registry

PreferenceLoss = Callable[[torch.Tensor, float, float], torch.Tensor]
#: trait `average_logprobs`: the loss is defined on token-mean sequence log-probs, not sums
PREFERENCE_LOSSES: Registry[PreferenceLoss] = Registry("preference loss", {"average_logprobs": False})


@PREFERENCE_LOSSES.register("sigmoid")
def sigmoid_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO: −log σ(β·m), with conservative label smoothing ε (Mitchell 2023):
    (1 − ε)·(−log σ(β·m)) + ε·(−log σ(−β·m)). margin [B] -> [B]."""
    return (
        -F.logsigmoid(beta * margin) * (1 - label_smoothing) - F.logsigmoid(-beta * margin) * label_smoothing
    )


@PREFERENCE_LOSSES.register("hinge")
def hinge_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """SLiC hinge: max(0, 1 − β·m). Label smoothing does not apply. margin [B] -> [B]."""
    return torch.relu(1 - beta * margin)


@PREFERENCE_LOSSES.register("ipo", average_logprobs=True)
def ipo_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """IPO (Azar 2023): (m − 1/(2β))², with β as τ; use token-mean log-probs. [B] -> [B]."""
    return (margin - 1 / (2 * beta)) ** 2


@dataclass
class PreferenceLossConfig:
    """loss: a name in PREFERENCE_LOSSES; beta; label_smoothing; reference_free."""

    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    reference_free: bool = False


def sequence_logprobs(
    token_logprobs: torch.Tensor, loss_mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """Per-sequence log-probability: sum (or mean, `average`) of token_logprobs [B, T]
    over loss_mask [B, T] (1 = a response token). -> [B]."""
    return (
        masked_mean(token_logprobs, loss_mask, dim=-1)
        if average
        else masked_sum(token_logprobs, loss_mask, dim=-1)
    )


def with_chosen_nll(losses: torch.Tensor, chosen_token_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """RPO (Pang et al. 2024; TRL's `rpo_alpha`): the preference loss plus α times the
    chosen response's per-token negative log-likelihood, so the chosen reply's own
    probability is pushed up, not only its margin over the rejected one.
    losses, chosen_token_mean (mean log-prob per chosen token) [B] -> [B]."""
    return losses - alpha * chosen_token_mean


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    cfg: PreferenceLossConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(losses [B], stats) from sequence log-probs [B] of the policy and the reference.

    stats: chosen_reward / rejected_reward = β·(log π − log π_ref) per side [B]
    (detached), and accuracy = chosen_reward > rejected_reward. With
    cfg.reference_free (or no reference given) the reference terms are 0.
    """
    if cfg.reference_free or ref_chosen is None or ref_rejected is None:
        ref_chosen, ref_rejected = torch.zeros_like(chosen), torch.zeros_like(rejected)
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    losses = PREFERENCE_LOSSES.get(cfg.loss)(chosen_ratio - rejected_ratio, cfg.beta, cfg.label_smoothing)
    chosen_reward = cfg.beta * chosen_ratio.detach()
    rejected_reward = cfg.beta * rejected_ratio.detach()
    stats = {
        "chosen_reward": chosen_reward,
        "rejected_reward": rejected_reward,
        "accuracy": (chosen_reward > rejected_reward).float(),
    }
    return losses, stats
