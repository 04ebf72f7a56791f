"""Model-merging arithmetic on task vectors (finetuned − base), as pure functions.

Each function takes one tensor per source model, all the same shape (the task
vectors of one weight), and their weights, and returns the merged task vector;
the caller adds it to the base weight. The methods are mergekit's:

- `linear`: the weighted sum Σ wᵢ τᵢ (task arithmetic); with normalize=True the
  weights are divided by their sum (mergekit's `linear`: a weighted average of models
  that share a base).
- `ties` (Yadav et al. 2023, "TIES-Merging"): trim each τᵢ to its `density` fraction
  of largest magnitudes, elect each element's sign as the sign of Σ wᵢ τᵢ (the
  "total mass" rule), and average only the trimmed values that agree with it
  (the disjoint mean: weights renormalised over the models that voted for the sign).
- `dare` (Yu et al. 2023, "Language Models are Super Mario"): drop each element with
  probability p and rescale the survivors by 1/(1−p), so the expectation is τᵢ; then
  merge the sparse vectors with `linear` (dare_linear) or TIES's sign election and
  disjoint mean without the magnitude trim (dare_ties).

Nothing here knows about models or files; models/merging.py applies these to weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ponder.registry import Registry

#: merge_method -> merge(deltas, weights, density, drop_rate, generator) -> task vector.
#: Traits for merging LoRA adapters with PEFT (models/merging.py): `peft`, its
#: combination_type; `normalizes`, whether the weights are divided by their sum;
#: `drops`, whether PEFT's density is 1 − drop_rate (DARE) rather than `density`.
#: linear and task arithmetic use `cat` (the adapters side by side: exactly Σ wᵢ BᵢAᵢ);
#: PEFT's own `linear` averages the A and B factors separately, not a sum of updates.
METHODS: Registry[Callable[..., torch.Tensor]] = Registry(
    "merge method", {"peft": "cat", "normalizes": False, "drops": False}
)


def _check(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if not deltas or len(deltas) != len(weights):
        raise ValueError(f"need one weight per task vector, got {len(deltas)} vectors and {len(weights)} weights")
    return torch.stack([d.float() for d in deltas])


def _weights(weights: Sequence[float], stacked: torch.Tensor) -> torch.Tensor:
    """The weights shaped to broadcast against the stacked task vectors."""
    return torch.tensor(list(weights), dtype=stacked.dtype).view(-1, *([1] * (stacked.dim() - 1)))


def linear(deltas: Sequence[torch.Tensor], weights: Sequence[float], normalize: bool = False) -> torch.Tensor:
    """Σ wᵢ τᵢ, or Σ wᵢ τᵢ / Σ wᵢ with normalize."""
    stacked = _check(deltas, weights)
    total = (stacked * _weights(weights, stacked)).sum(0)
    if normalize:
        norm = sum(weights)
        if norm == 0:
            raise ValueError("normalize: the weights sum to 0")
        total = total / norm
    return total


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """`delta` with all but its ⌈density·n⌉ largest-magnitude elements set to 0."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    keep = math.ceil(density * delta.numel())
    if keep >= delta.numel():
        return delta.clone()
    flat = delta.reshape(-1)
    # The keep-th largest magnitude is the threshold; ties at it are broken by topk's order.
    top = flat.abs().topk(keep).indices
    out = torch.zeros_like(flat)
    out[top] = flat[top]
    return out.view_as(delta)


def elect_and_merge(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TIES's last two steps on already-sparsified task vectors: the elected sign of
    each element is that of Σ wᵢ τᵢ; the result is Σ wᵢ τᵢ / Σ wᵢ over the models
    whose (non-zero) value has the elected sign, 0 where none has."""
    weighted = stacked * weights
    sign = torch.sign(weighted.sum(0))
    agree = (torch.sign(stacked) == sign) & (stacked != 0)
    mass = (weights * agree).sum(0)
    total = (weighted * agree).sum(0)
    return torch.where(mass > 0, total / mass.clamp_min(1e-12), torch.zeros_like(total))


def ties(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float) -> torch.Tensor:
    """TIES-Merging: trim to `density`, elect signs, disjoint weighted mean."""
    stacked = _check(deltas, weights)
    trimmed = torch.stack([trim(d, density) for d in stacked])
    return elect_and_merge(trimmed, _weights(weights, stacked))


def dare_drop(delta: torch.Tensor, drop_rate: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """DARE's random drop: each element kept with probability 1−p and scaled by
    1/(1−p), so E[result] = delta."""
    if not 0 <= drop_rate < 1:
        raise ValueError(f"drop_rate must be in [0, 1), got {drop_rate}")
    if drop_rate == 0:
        return delta.clone()
    keep = torch.rand(delta.shape, generator=generator, dtype=torch.float32) >= drop_rate
    return torch.where(keep, delta / (1 - drop_rate), torch.zeros_like(delta))


def dare(
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    drop_rate: float,
    generator: torch.Generator | None = None,
    sign_election: bool = False,
) -> torch.Tensor:
    """DARE: drop and rescale each task vector, then merge linearly (Σ wᵢ τ̃ᵢ) or, with
    sign_election, by TIES's sign election and disjoint mean (dare_ties)."""
    stacked = _check(deltas, weights)
    dropped = torch.stack([dare_drop(d, drop_rate, generator) for d in stacked])
    if sign_election:
        return elect_and_merge(dropped, _weights(weights, stacked))
    return (dropped * _weights(weights, stacked)).sum(0)


def merge_deltas(
    method: str,
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    density: float = 1.0,
    drop_rate: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One weight's merged task vector by `method` (a name in METHODS)."""
    return METHODS.get(method)(deltas, weights, density, drop_rate, generator)


@METHODS.register("linear", normalizes=True)
def _linear(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, drop_rate: float,
            generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    return linear(deltas, weights, normalize=True)


@METHODS.register("task_arithmetic")
def _task_arithmetic(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, drop_rate: float,
                     generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    return linear(deltas, weights)


@METHODS.register("ties", peft="ties")
def _ties(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, drop_rate: float,
          generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    return ties(deltas, weights, density)


@METHODS.register("dare_linear", peft="dare_linear", drops=True)
def _dare_linear(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, drop_rate: float,
                 generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    return dare(deltas, weights, drop_rate, generator, sign_election=False)


@METHODS.register("dare_ties", peft="dare_ties", drops=True)
def _dare_ties(deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, drop_rate: float,
               generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    return dare(deltas, weights, drop_rate, generator, sign_election=True)
