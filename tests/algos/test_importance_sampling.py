"""The importance-sampling policy loss and the weighted NLL (ponder/algos/losses.py):
hand-computed examples and the invariances of every loss here."""

from __future__ import annotations

import math

import pytest
import torch

from ponder.algos import demonstration_nll, policy_loss, weighted_nll

T = torch.tensor


def test_importance_sampling_hand_example():
    logprobs = T([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = T([[-1.0, -1.5, -1.0]])
    adv = T([[2.0, -1.0, 0.5]])
    mask = T([[1, 1, 0]])
    loss, metrics = policy_loss("importance_sampling", logprobs, sampler, adv, mask)
    # ρ = e^0 = 1 → −2; ρ = e^-0.5 → +e^-0.5; masked → 0
    torch.testing.assert_close(loss, T([[-2.0, math.exp(-0.5), 0.0]]))
    loss.sum().backward()
    # ∂(−ρA)/∂logπ = −ρA
    torch.testing.assert_close(logprobs.grad, T([[-2.0, math.exp(-0.5), 0.0]]))
    assert metrics["clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx((1.0 + math.exp(-0.5)) / 2, rel=1e-6)


def test_importance_sampling_is_ppo_inside_the_clip_and_vanilla_at_ratio_one():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 7, generator=gen) - 2.0
    near = old + 0.01 * torch.randn(3, 7, generator=gen)  # ratios within [0.8, 1.2]: no clip is active
    adv = torch.randn(3, 7, generator=gen)
    mask = (torch.rand(3, 7, generator=gen) > 0.2).long()
    grads = {}
    for name, logprobs in (("importance_sampling", near), ("ppo", near)):
        leaf = logprobs.clone().requires_grad_(True)
        loss, _ = policy_loss(name, leaf, old, adv, mask)
        loss.sum().backward()
        grads[name] = (loss.detach(), leaf.grad)
    torch.testing.assert_close(grads["importance_sampling"][0], grads["ppo"][0])
    torch.testing.assert_close(grads["importance_sampling"][1], grads["ppo"][1])
    at_one = old.clone().requires_grad_(True)
    policy_loss("importance_sampling", at_one, old, adv, mask)[0].sum().backward()
    torch.testing.assert_close(at_one.grad, torch.where(mask.bool(), -adv, 0.0))


def test_importance_sampling_masked_positions_change_nothing():
    gen = torch.Generator().manual_seed(1)
    logprobs = torch.randn(2, 5, generator=gen) - 1.0
    old = logprobs + 0.3 * torch.randn(2, 5, generator=gen)
    adv = torch.randn(2, 5, generator=gen)
    mask = T([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    off = ~mask.bool()

    def run(lp, ol, ad):
        leaf = lp.clone().requires_grad_(True)
        loss, metrics = policy_loss("importance_sampling", leaf, ol, ad, mask)
        loss.sum().backward()
        return loss.detach(), metrics, leaf.grad

    base = run(logprobs, old, adv)
    noisy = run(torch.where(off, -50.0, logprobs), torch.where(off, 30.0, old), torch.where(off, 1e6, adv))
    torch.testing.assert_close(noisy[0], base[0], rtol=0, atol=0)
    assert noisy[1] == base[1]
    torch.testing.assert_close(noisy[2], base[2], rtol=0, atol=0)


def test_weighted_nll_hand_example_and_demonstration_nll():
    logprobs = T([[-1.0, -2.0, -3.0], [-0.5, float("-inf"), -1.5]])
    weights = T([[1.0, 0.5, 0.0], [2.0, 0.0, 1.0]])
    loss = weighted_nll(logprobs, weights)
    # a weight of 0 drops its token, even one whose log-prob is -inf (no NaN)
    torch.testing.assert_close(loss, T([[1.0, 1.0, 0.0], [1.0, 0.0, 1.5]]))
    mask = T([[1, 1, 0], [1, 0, 1]])
    finite = torch.where(mask.bool(), logprobs, 0.0)
    tokens = float(mask.sum())
    torch.testing.assert_close(weighted_nll(finite, mask.float()).sum() / tokens, demonstration_nll(finite, mask, tokens))


def test_weighted_nll_of_a_batch_is_the_sum_of_its_rows():
    gen = torch.Generator().manual_seed(2)
    logprobs = torch.randn(4, 6, generator=gen) - 2.0
    weights = torch.rand(4, 6, generator=gen) * (torch.rand(4, 6, generator=gen) > 0.3)
    whole = weighted_nll(logprobs, weights).sum()
    rows = sum(weighted_nll(logprobs[i : i + 1], weights[i : i + 1]).sum() for i in range(4))
    torch.testing.assert_close(whole, rows)
