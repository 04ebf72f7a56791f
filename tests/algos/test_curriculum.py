"""Curricula over task kinds: hand-computed shares and counts, and invariances."""

import pytest
import torch

from ponder.algos.curriculum import CURRICULA, allocate, informative_shares, uniform_shares, update_signal


def test_informative_shares_by_hand():
    # signal (0.5, 0.0, 0.5), floor 0.25: 0.25/3 + 0.75 * (0.5, 0, 0.5) / 1.0
    shares = informative_shares(torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64), 0.25)
    third = 0.25 / 3
    assert shares.tolist() == pytest.approx([third + 0.375, third, third + 0.375])
    assert float(shares.sum()) == pytest.approx(1.0)


def test_no_signal_anywhere_is_uniform_and_floor_one_is_uniform():
    zeros = torch.zeros(4, dtype=torch.float64)
    assert informative_shares(zeros, 0.1).tolist() == pytest.approx([0.25] * 4)
    skewed = torch.tensor([0.9, 0.1, 0.0, 0.3], dtype=torch.float64)
    assert informative_shares(skewed, 1.0).tolist() == pytest.approx(uniform_shares(skewed, 1.0).tolist())


def test_shares_follow_the_kinds_when_they_are_permuted():
    signal = torch.tensor([0.7, 0.2, 0.0, 0.4], dtype=torch.float64)
    order = torch.tensor([2, 0, 3, 1])
    assert informative_shares(signal[order], 0.3).tolist() == pytest.approx(informative_shares(signal, 0.3)[order].tolist())


def test_scaling_the_signal_does_not_change_the_shares():
    signal = torch.tensor([0.6, 0.2, 0.2], dtype=torch.float64)
    assert informative_shares(signal / 2, 0.2).tolist() == pytest.approx(informative_shares(signal, 0.2).tolist())


def test_allocate_by_hand():
    # 6 slots at (0.5, 0.3, 0.2): exact 3, 1.8, 1.2 -> floors 3, 1, 1; one slot left to the
    # largest remainder (0.8, kind 1)
    assert allocate(torch.tensor([0.5, 0.3, 0.2]), 6) == [3, 2, 1]
    assert allocate(torch.tensor([1 / 3, 1 / 3, 1 / 3]), 4) == [2, 1, 1]  # ties to the lower index
    for size in range(0, 13):
        assert sum(allocate(torch.tensor([0.15, 0.6, 0.25]), size)) == size


def test_update_signal_moves_only_the_kinds_seen():
    signal = torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64)
    observed = torch.tensor([0.0, 0.5, 0.0], dtype=torch.float64)
    seen = torch.tensor([True, True, False])
    assert update_signal(signal, observed, seen, 0.5).tolist() == pytest.approx([0.5, 0.75, 0.5])


def test_unknown_curriculum_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown curriculum 'x'; valid: informative, none"):
        CURRICULA.get("x")
