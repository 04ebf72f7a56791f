"""Curricula over task kinds: pure functions from each kind's recent learning signal
to its share of the next steps' tasks.

The signal of a kind is the rate of its sampled groups whose rewards differ (the
groups `informative_groups` keeps): a group-relative estimator learns nothing from a
group whose samples all scored the same, so a kind the policy always solves, or
never solves, only costs generation time. The `informative` curriculum moves the
step's tasks towards the kinds that still carry a gradient, and keeps a floor of
the uniform share for every kind so none is forgotten (its lesson may be undone by
the others') and every kind's signal keeps being measured. Curricula are registered
by name (`train.curriculum`); the sampler looks them up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ponder.registry import Registry

Curriculum = Callable[[torch.Tensor, float], torch.Tensor]
#: trait `adaptive`: the shares follow the signal (False: the sampler draws plain
#: shuffled, optionally stratified, epochs instead of a curriculum over kinds)
CURRICULA: Registry[Curriculum] = Registry("curriculum", {"adaptive": True})


@CURRICULA.register("none", adaptive=False)
def uniform_shares(signal: torch.Tensor, floor: float) -> torch.Tensor:
    """[K] shares, all 1/K: every kind alike, whatever its signal."""
    return torch.full_like(signal, 1.0 / len(signal))


@CURRICULA.register("informative")
def informative_shares(signal: torch.Tensor, floor: float) -> torch.Tensor:
    """[K] shares from signal [K] (each kind's informative-group rate, in [0, 1]):
    floor · 1/K + (1 − floor) · signal / Σ signal. With no signal anywhere (Σ = 0),
    uniform. floor in [0, 1]: 1 = uniform; 0 = purely by signal."""
    uniform = uniform_shares(signal, floor)
    total = float(signal.sum())
    if total <= 0:
        return uniform
    return floor * uniform + (1.0 - floor) * signal / total


def allocate(shares: torch.Tensor, size: int) -> list[int]:
    """Task counts [K] summing to `size` from shares [K] (summing to 1): each kind gets
    the floor of its share × size, and the slots left go to the largest remainders
    (ties to the lower index), so the counts are as close to the shares as integers allow."""
    exact = shares.double() * size
    counts = torch.floor(exact).long()
    remainders = (exact - counts).tolist()
    left = size - int(counts.sum())
    for index in sorted(range(len(remainders)), key=lambda i: (-remainders[i], i))[:left]:
        counts[index] += 1
    return counts.tolist()


def update_signal(signal: torch.Tensor, observed: torch.Tensor, seen: torch.Tensor, momentum: float) -> torch.Tensor:
    """Exponential moving average of each kind's informative-group rate.

    signal [K]: the running rates; observed [K]: this step's rates; seen [K] bool: the
    kinds this step sampled (the others keep their rate). momentum in [0, 1): the
    weight of the past."""
    blended = momentum * signal + (1.0 - momentum) * observed
    return torch.where(seen, blended, signal)
