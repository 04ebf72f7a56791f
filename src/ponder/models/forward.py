"""The policy's forward pass for training: per-token log-probs (and entropy, and a
value head's estimates) at the positions the loss reads, with a shared prompt read once."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ponder.models.logprobs import logprobs_and_entropy, position_ids_from_mask
from ponder.models.value_head import ValueHead

# A forbidden token's logit under a constraint: finite, so its probability is exactly 0
# and the entropy's p·logit is 0, where -inf would give 0·-inf = nan.
MASKED = -1e9


def forward_policy(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    value_head: ValueHead | None = None,
    loss_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    masks: Any = None,
    kept_logits: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One pass: (logprobs [B, L-1], entropy [B, L-1] or None, values [B, L-1] or None).

    With `loss_mask` [B, L-1], the vocabulary projection runs only at the K
    positions where some row has a policy token (the rest of logprobs is 0):
    prompt and observation positions need no logits, and at 49k vocabulary
    entries they would dominate the cost. Entropy (of softmax(logits/T)) is
    computed at the same positions when `with_entropy` (the RL update logs it; the
    reference pass, SFT and DPO do not need it), with gradient only when `entropy_grad`.
    values[:, t] estimates the return from the state after token t, the state in
    which token t+1 is chosen; that lines up with logprobs[:, t].

    Rows that begin with the same tokens (the G samples of a GRPO group share their
    prompt; every row of a chat batch shares the system prompt) read that prefix once:
    see `_forward_after_shared_prefix`. The result and its gradient are the same.
    With activation offload on, the tensors saved for backward (the logits' too) go
    to host memory (`saved_activations`).
    `masks` (a rollout.constrain.ConstraintMasks, for actions sampled under a grammar):
    `masks.at(keep, vocab)` says which tokens each position allowed; the others' logits
    are pushed to MASKED first, so logprobs are those of the masked distribution.
    `kept_logits`: a list that receives (keep [K], the logits at those positions divided
    by the temperature [B, K, V], with their graph): what a loss over the whole
    next-token distribution reads (algos/distill.py), without a second pass.
    """
    with saved_activations(model, input_ids):
        keep = None
        if loss_mask is not None:
            keep = loss_mask.bool().any(0).nonzero().squeeze(-1)
        shared = 0
        if value_head is None and keep is not None:
            shared = common_prefix_length(input_ids, attention_mask, keep)
        if shared >= MIN_SHARED_PREFIX:
            out = _forward_after_shared_prefix(model, input_ids, attention_mask, keep, shared)
        else:
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask),
                use_cache=False,
                output_hidden_states=value_head is not None,
                logits_to_keep=keep if keep is not None else 0,
            )
        if keep is None:
            keep = torch.arange(input_ids.shape[1] - 1, device=input_ids.device)
            logits = out.logits[:, :-1]
        else:
            logits = out.logits
        scaled = logits / temperature if temperature > 0 and temperature != 1.0 else logits
        if masks is not None:
            allowed = masks.at(keep, scaled.shape[-1]).to(scaled.device)
            scaled = scaled.float().masked_fill(~allowed, MASKED)
        if kept_logits is not None:
            kept_logits.append((keep, scaled))
        picked, entropy = logprobs_and_entropy(scaled, input_ids[:, keep + 1], with_entropy, entropy_grad)
        shape = (input_ids.shape[0], input_ids.shape[1] - 1)
        logprobs = picked.new_zeros(shape).index_copy(1, keep, picked)
        if entropy is not None:
            entropy = entropy.new_zeros(shape).index_copy(1, keep, entropy)
        values = value_head(out.hidden_states[-1][:, :-1]) if value_head is not None else None
        return logprobs, entropy, values


def saved_activations(model: Any, input_ids: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Where autograd keeps what the backward pass reads: in host memory when the model
    was given `activation_offload` (model.activation_offload, models.loading) and a
    gradient is being taken (pinned, so a GPU copies them back asynchronously), else
    where they were made."""
    if getattr(model, "activation_offload", False) and torch.is_grad_enabled():
        return torch.autograd.graph.save_on_cpu(pin_memory=input_ids.is_cuda)
    return contextlib.nullcontext()


# Below this many shared tokens, a second model call costs more than it saves.
MIN_SHARED_PREFIX = 8


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor) -> int:
    """How many leading tokens every row has in common (real tokens, equal ids), capped
    below the first position whose logits are kept; 0 for a single row."""
    if input_ids.shape[0] < 2 or keep.numel() == 0:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    differs = (~same).nonzero()
    common = int(differs[0]) if differs.numel() else input_ids.shape[1]
    return min(common, int(keep.min()))


def _forward_after_shared_prefix(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor, shared: int
) -> Any:
    """The model's output at positions `keep` with the first `shared` tokens (equal in
    every row, right-padded rows) read once: one pass over the prefix builds its keys
    and values, which every row's pass over the rest attends to. The cache is expanded,
    not copied, so gradients from all rows flow back into the one prefix pass."""
    rows = input_ids.shape[0]
    prefix = model(
        input_ids=input_ids[:1, :shared],
        attention_mask=attention_mask[:1, :shared],
        position_ids=torch.arange(shared, device=input_ids.device).unsqueeze(0),
        use_cache=True,
        logits_to_keep=1,  # no prefix position is kept (shared <= keep.min())
    )
    cache = prefix.past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return model(
        input_ids=input_ids[:, shared:],
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask)[:, shared:],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep - shared,
    )
