"""Group filters (dynamic sampling): hand-computed masks and the invariance that
dropping the all-equal groups never changes what the rest learn."""

import math

import pytest
import torch

from ponder.algos import AdvantageConfig, AdvantageInput, compute_advantages
from ponder.algos.filters import GROUP_FILTERS, informative_groups, keep_all

NAN = math.nan


def test_informative_groups_by_hand():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, NAN, NAN, 0.3, 0.0, 0.0])
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e", "f", "f"]
    # a: equal; b: differ; c: equal; d: one scorable reward; e: one scorable; f: equal (0, 0)
    assert informative_groups(rewards, groups).tolist() == [False, False, True, True] + [False] * 8
    # a group's members need not sit next to each other
    assert informative_groups(torch.tensor([0.0, 1.0, 1.0, 0.0]), ["x", "y", "x", "y"]).tolist() == [True] * 4
    assert keep_all(rewards, groups).all() and len(informative_groups(torch.zeros(0), [])) == 0
    assert GROUP_FILTERS.get("informative") is informative_groups
    with pytest.raises(ValueError, match="unknown group filter 'dapo'; valid: informative, none"):
        GROUP_FILTERS.get("dapo")


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_dropping_all_equal_groups_leaves_the_rest_s_advantages_unchanged(estimator):
    rewards = [1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.3, 0.3]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    mask = torch.ones(len(rewards), 3, dtype=torch.long)
    full, _ = compute_advantages(estimator, AdvantageInput(torch.tensor(rewards), mask, groups), AdvantageConfig())
    keep = informative_groups(torch.tensor(rewards), groups)
    assert keep.tolist() == [True, True, False, False, True, True, False, False]
    kept_rewards = torch.tensor(rewards)[keep]
    kept_groups = [g for g, k in zip(groups, keep.tolist()) if k]
    kept, _ = compute_advantages(estimator, AdvantageInput(kept_rewards, mask[keep], kept_groups), AdvantageConfig())
    assert torch.allclose(kept, full[keep])
    assert torch.count_nonzero(full[~keep]) == 0  # what was dropped carried no signal
