"""Which sampled groups an RL step learns from: pure functions over episode rewards.

A group whose rewards are all equal gives group-relative estimators (GRPO, RLOO,
`turn`) exactly zero advantage: it costs generation and update time and carries no
signal. DAPO's dynamic sampling drops such groups and samples more tasks in their
place; `informative` is that test. Filters are registered by name
(`algo.group_filter`); the trainer looks them up and never branches on the name.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ponder.algos.advantages import group_index, group_stats
from ponder.registry import Registry

GroupFilter = Callable[[torch.Tensor, list[str]], torch.Tensor]
GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")


@GROUP_FILTERS.register("none")
def keep_all(rewards: torch.Tensor, group_ids: list[str]) -> torch.Tensor:
    """[B] bool, all True: learn from every group."""
    return torch.ones(len(group_ids), dtype=torch.bool)


@GROUP_FILTERS.register("informative")
def informative_groups(rewards: torch.Tensor, group_ids: list[str]) -> torch.Tensor:
    """[B] bool: True for the episodes of groups whose scorable rewards differ.

    rewards: [B] float, NaN = unscorable (left out of the comparison, as the
    estimators leave it out of the baseline); group_ids: [B]. A group with fewer than
    two scorable rewards, or with all of them equal, is dropped.
    """
    if not group_ids:
        return torch.zeros(0, dtype=torch.bool)
    groups = group_index(group_ids)
    valid = ~torch.isnan(rewards)
    stats = group_stats(rewards[:, None], valid[:, None], groups)
    informative = (stats["count"][:, 0] >= 2) & (stats["spread"][:, 0] > 0)
    return informative[groups]
