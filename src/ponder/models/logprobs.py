"""Log-probabilities and entropies of token sequences under a causal LM.

Shapes: input_ids and attention_mask are [B, T] (left padding allowed, mask 1 on
real tokens). Outputs are [B, T-1]: entry t scores input_ids[:, t+1] given the
tokens up to t. Positions whose target is padding hold garbage; callers mask them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token of each left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[targets]; logits [B, T, V], targets [B, T] -> [B, T]."""
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits)[targets] [B, T] and, when `with_entropy`, the entropy of
    softmax(logits) [B, T] (with gradient only when `entropy_grad`), sharing one
    log-sum-exp over the vocabulary: H = lse − Σ p·logits. logits [B, T, V], already
    divided by the temperature; targets [B, T]."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return picked, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        source, norm = (logits, lse) if entropy_grad else (logits.detach(), lse.detach())
        probs = torch.exp(source - norm.unsqueeze(-1))
        return picked, norm - (probs * source).sum(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim; [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each next token: [B, T] ids -> [B, T-1] logprobs (grad flows if enabled)."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return logprobs_from_logits(out.logits[:, :-1], input_ids[:, 1:], temperature)


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """Run the base model with LoRA adapters switched off (a no-op without adapters)."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield
    else:
        yield


def trainable_snapshot(model: Any) -> dict[str, torch.Tensor]:
    """A detached copy of every trainable parameter (LoRA's: a few MB), by name."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def weights_swapped(model: Any, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """Run `model` with the named parameters set to `weights` (e.g. a trainable_snapshot
    of the policy as RL began); their values are restored on exit, gradients untouched."""
    params = dict(model.named_parameters())
    saved = {name: params[name].detach().clone() for name in weights}
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)


@torch.no_grad()
def reference_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Token logprobs under the reference policy = the base model with adapters disabled.

    With LoRA this needs no second copy of the weights. A model without adapters is
    its own reference (full fine-tuning must keep a frozen copy and pass that here).
    """
    with adapters_disabled(model):
        return token_logprobs(model, input_ids, attention_mask, temperature)
