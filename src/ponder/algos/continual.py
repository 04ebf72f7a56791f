"""Continual-learning math as pure tensor functions: the quadratic anchor penalty
(EWC, SI, MAS), SI's path-integral importance, MAS's output sensitivity, A-GEM's
gradient projection and DER++'s logit-matching term.

Parameters are dicts name -> tensor (the trainable weights, same shapes in every
dict). Sequence tensors follow train/batch.py's alignment: entry t of a row concerns
the prediction of token t+1; `mask` [B, K] is 1 where that token is an assistant
token (a position the loss reads) and 0 elsewhere (prompt, tool output, padding).
The stateful parts (accumulators, buffers) are in ponder.train.continual.
"""

from __future__ import annotations

import torch


def quadratic_penalty(
    params: dict[str, torch.Tensor],
    anchors: dict[str, torch.Tensor],
    importance: dict[str, torch.Tensor],
    weight: float,
) -> torch.Tensor:
    """weight · Σ_i Ω_i · (θ_i − θ*_i)² over the names in `anchors` (θ* after the
    previous task, Ω the per-weight importance, both shaped like the parameter).
    SI (c = weight) and MAS (λ = weight) use it as it is, EWC with weight λ/2.
    A scalar with gradient through `params`; 0 with no anchors."""
    total = None
    for name, anchor in anchors.items():
        term = (importance[name] * (params[name] - anchor) ** 2).sum()
        total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    return weight * total


def ewc_penalty(
    params: dict[str, torch.Tensor],
    anchors: dict[str, torch.Tensor],
    fisher: dict[str, torch.Tensor],
    weight: float,
) -> torch.Tensor:
    """EWC (Kirkpatrick 2017): (weight / 2) · Σ_i F_i · (θ_i − θ*_i)² over the named
    parameters in `anchors` (θ* after the previous task, F its diagonal Fisher, same
    shapes as the parameters). A scalar with gradient through `params`."""
    return quadratic_penalty(params, anchors, fisher, 0.5 * weight)


def si_path_step(task_grad: torch.Tensor, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """One step's contribution to SI's path integral (Zenke et al. 2017, eq. 3):
    ω += −g · Δθ, with g the task loss's gradient at the step's start and
    Δθ = after − before the update the optimizer applied. All [shape of θ]."""
    return -task_grad * (after - before)


def si_importance(omega: torch.Tensor, delta: torch.Tensor, xi: float) -> torch.Tensor:
    """SI's per-weight importance of one task: Ω = max(ω, 0) / (Δ² + ξ), with ω the
    task's accumulated path integral, Δ = θ_end − θ_start the weight's total move over
    the task, ξ > 0 the damping that bounds Ω where a weight barely moved. A negative
    ω (momentum carried the weight uphill) is clipped to 0 so the quadratic stays a
    penalty. All [shape of θ]."""
    return omega.clamp(min=0) / (delta**2 + xi)


def output_sensitivity(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MAS's function of the output (Aljundi et al. 2018) for sequences: per row, the
    squared L2 norm of the logit vector, averaged over the row's assistant positions,
    F(x) = (1/|A|) Σ_{t∈A} ‖z_t‖². Averaging (not summing) over positions keeps an
    example's importance independent of its answer's length.
    logits [B, K, V] (the positions a forward kept), mask [B, K] -> [B] (0 for a row
    with no assistant position)."""
    norms = (logits.float() ** 2).sum(-1)
    weights = mask.to(norms.dtype)
    return (norms * weights).sum(-1) / weights.sum(-1).clamp(min=1)


def agem_project(grad: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A-GEM (Chaudhry et al. 2019, eq. 11): the gradient g [P] (every trainable weight,
    flattened) projected so it no longer increases the loss on the memory:
    g̃ = g − (g·g_ref / g_ref·g_ref) · g_ref when g·g_ref < 0, else g unchanged.
    g_ref [P] is the gradient of the loss on a batch from the episodic memory; after
    the projection g̃·g_ref = 0. A zero g_ref leaves g unchanged."""
    dot = torch.dot(grad, ref)
    norm = torch.dot(ref, ref)
    if dot >= 0 or norm == 0:
        return grad
    return grad - (dot / norm) * ref


def derpp_logit_term(
    logits: torch.Tensor, stored: torch.Tensor, mask: torch.Tensor, index: torch.Tensor | None = None
) -> torch.Tensor:
    """DER++'s logit matching (Buzzega et al. 2020): the mean squared difference
    between the current logits and those stored with a buffered example, over its
    assistant positions.

    logits [B, K, V]: the current model's. stored [B, K, E]: the logits recorded when
    the example entered the buffer: all V of them (E = V, index None), or only the
    top-E of each position with their vocabulary ids in `index` [B, K, E] (compact
    storage; the current logits are read at those ids). mask [B, K]: 1 = an assistant
    position. Mean over the E entries, then over the masked positions of the batch.
    A scalar with gradient through `logits`; 0 with no masked position."""
    current = logits.float() if index is None else logits.float().gather(-1, index.long())
    per_position = ((current - stored.float()) ** 2).mean(-1)
    weights = mask.to(per_position.dtype)
    return (per_position * weights).sum() / weights.sum().clamp(min=1)


def nearest_centroid(states: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The index of the most cosine-similar centroid for each state (a per-task adapter
    router): states [N, H], centroids [F, H] -> [N] (long). Ties go to the lower index."""
    similarity = torch.nn.functional.normalize(states.float(), dim=-1) @ torch.nn.functional.normalize(
        centroids.float(), dim=-1
    ).T
    return similarity.argmax(-1)
