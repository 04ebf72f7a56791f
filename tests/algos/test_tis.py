"""Truncated importance sampling for a sampler with other kernels (vLLM): the weight and
the mismatch metrics on a hand-computed example (the update's use: tests/train/test_tis_update.py)."""

import math

import pytest
import torch

from ponder.algos import sampler_mismatch, tis_weights

OLD = torch.tensor([[-1.0, -2.0, -0.5, -4.0]])  # the trainer's log-probs
SAMPLER = torch.tensor([[-1.0, -1.0, -3.0, -1.0]])  # the sampler's, for the same tokens
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is the environment's


def test_tis_weight_is_the_truncated_ratio_and_zero_off_the_mask():
    weights = tis_weights(OLD, SAMPLER, MASK, cap=2.0)
    # exp(0) = 1; exp(-1) = 0.3679; exp(2.5) = 12.18 truncated to 2; masked: 0
    assert weights[0].tolist() == pytest.approx([1.0, math.exp(-1.0), 2.0, 0.0])
    assert tis_weights(OLD, SAMPLER, MASK, cap=100.0)[0, 2] == pytest.approx(math.exp(2.5))
    with pytest.raises(ValueError, match="algo.tis_cap must be > 0"):
        tis_weights(OLD, SAMPLER, MASK, cap=0.0)


def test_sampler_mismatch_by_hand():
    metrics = sampler_mismatch(OLD, SAMPLER, MASK)
    # |Δ| = 0, 1, 2.5 over the three policy tokens
    assert metrics["logprob_mismatch"] == pytest.approx(3.5 / 3)
    # k3 of KL(sampler ‖ trainer) per token, with d = old − sampler: e^d − d − 1
    k3 = [math.exp(d) - d - 1 for d in (0.0, -1.0, 2.5)]
    assert metrics["sampler_kl"] == pytest.approx(sum(k3) / 3)
    # what happens at masked positions does not count
    changed = SAMPLER.clone()
    changed[0, 3] = -50.0
    assert sampler_mismatch(OLD, changed, MASK) == metrics
