"""Policy losses, value loss and entropy bonus: hand-computed examples and invariances."""

import math

import pytest
import torch

from ponder.algos import LossConfig, demonstration_nll, entropy_bonus, policy_loss, value_loss

T = torch.tensor
HUGE = 1e30


def ppo_case():
    """Five policy tokens and one masked token; old logprobs 0, so ρ = exp(logprobs)."""
    ratios = [1.5, 1.25, 0.5, 0.5, 0.9, 1.0]
    logprobs = torch.log(T([ratios], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(1, 6, dtype=torch.float64)
    adv = T([[1.0, 1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = T([[1, 1, 1, 1, 1, 0]])
    return logprobs, old, adv, mask


def test_unknown_loss_lists_valid_names():
    logprobs, old, adv, mask = ppo_case()
    with pytest.raises(ValueError, match=r"^unknown policy loss 'grpo'; valid: importance_sampling, ppo, vanilla$"):
        policy_loss("grpo", logprobs, old, adv, mask)


def test_vanilla_hand_example():
    logprobs = T([[-1.0, -2.0, 5.0]], requires_grad=True)
    adv = T([[2.0, -1.0, 7.0]])
    # loss = −A·logπ = [−2·−1, −(−1)·−2, masked] = [2, −2, 0]; d/dlogπ = −A = [−2, 1, 0]
    loss, metrics = policy_loss("vanilla", logprobs, logprobs.detach(), adv, T([[1, 1, 0]]))
    torch.testing.assert_close(loss, T([[2.0, -2.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, T([[-2.0, 1.0, 0.0]]))
    assert metrics == {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}


def test_ppo_hand_example_with_asymmetric_clips():
    logprobs, old, adv, mask = ppo_case()
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)  # ρ kept in [0.8, 1.28]
    # token  ρ     A    −ρA    −clip(ρ)A   max (loss)  clipped branch active?
    #   0   1.5   +1   −1.5    −1.28       −1.28       yes
    #   1   1.25  +1   −1.25   −1.25       −1.25       no (inside 1.28)
    #   2   0.5   +1   −0.5    −0.8        −0.5        no
    #   3   0.5   −1    0.5     0.8         0.8        yes
    #   4   0.9   −1    0.9     0.9         0.9        no
    #   5   masked                          0
    loss, metrics = policy_loss("ppo", logprobs, old, adv, mask, cfg)
    torch.testing.assert_close(loss, T([[-1.28, -1.25, -0.5, 0.8, 0.9, 0.0]], dtype=torch.float64))
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1.25 + 0.5 + 0.5 + 0.9) / 5)
    # approx_kl = mean of k3 = ρ − 1 − ln ρ over the five tokens
    k3 = [r - 1 - math.log(r) for r in (1.5, 1.25, 0.5, 0.5, 0.9)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 5)  # (0.0945+0.0269+0.1931·2+0.0054)/5
    # gradient: clipped tokens 0 and 3 get none; elsewhere d(−ρA)/dlogπ = −ρA
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, T([[0.0, -1.25, -0.5, 0.0, 0.9, 0.0]], dtype=torch.float64))
    # symmetric 0.2 clips token 1 too (1.25 > 1.2): 3 of 5
    _, metrics = policy_loss("ppo", logprobs, old, adv, mask, LossConfig(clip_low=0.2, clip_high=0.2))
    assert metrics["clip_fraction"] == pytest.approx(3 / 5)


def test_ppo_dual_clip_caps_negative_advantage_losses():
    logprobs = torch.log(T([[5.0, 2.0, 5.0]]))
    adv = T([[-1.0, -1.0, 1.0]])
    cfg = LossConfig(clip_c=3.0)
    # ρ=5, A=−1: max(5, 1.2) = 5 > cap 3 → 3 (dual clip); ρ=2, A=−1: 2 < 3 → 2;
    # ρ=5, A=+1: max(−5, −1.2) = −1.2, dual clip only applies to A < 0
    loss, metrics = policy_loss("ppo", logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), cfg)
    torch.testing.assert_close(loss, T([[3.0, 2.0, -1.2]]))
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 3)
    loss, _ = policy_loss("ppo", logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), LossConfig())
    torch.testing.assert_close(loss, T([[5.0, 2.0, -1.2]]))
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        policy_loss("ppo", logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), LossConfig(clip_c=0.5))


def test_ppo_at_ratio_one_has_the_vanilla_gradient():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=gen) - 2.0
    adv = torch.randn(4, 6, generator=gen)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    grads = {}
    for name in ("ppo", "vanilla"):
        logprobs = base.clone().requires_grad_(True)
        loss, _ = policy_loss(name, logprobs, base.clone(), adv, mask)
        loss.sum().backward()
        grads[name] = logprobs.grad
    torch.testing.assert_close(grads["ppo"], grads["vanilla"])
    torch.testing.assert_close(grads["vanilla"], torch.where(mask.bool(), -adv, 0.0))


@pytest.mark.parametrize("name", ["ppo", "vanilla"])
def test_masked_positions_do_not_change_loss_metrics_or_gradient(name):
    gen = torch.Generator().manual_seed(1)
    logprobs = torch.randn(3, 5, generator=gen) - 1.0
    old = logprobs + 0.3 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, 5, generator=gen)
    mask = T([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    off = ~mask.bool()
    cfg = LossConfig(clip_high=0.28, clip_c=3.0)

    def run(lp, ol, ad):
        lp = lp.clone().requires_grad_(True)
        loss, metrics = policy_loss(name, lp, ol, ad, mask, cfg)
        loss.sum().backward()
        return loss.detach(), metrics, lp.grad

    base = run(logprobs, old, adv)
    noise = lambda: torch.rand(3, 5, generator=gen) * HUGE  # noqa: E731
    again = run(
        torch.where(off, -noise(), logprobs), torch.where(off, noise(), old), torch.where(off, noise(), adv)
    )
    torch.testing.assert_close(again[0], base[0], rtol=0, atol=0)
    assert again[1] == base[1]
    torch.testing.assert_close(again[2], base[2], rtol=0, atol=0)
    assert torch.all(again[0][off] == 0) and torch.all(again[2][off] == 0)


def test_value_loss_hand_example():
    values = T([[1.5, 1.1, 0.5, 7.0]], requires_grad=True)
    old = T([[1.0, 1.0, 1.0, 0.0]])
    returns = T([[2.0, 2.0, 0.0, 0.0]])
    mask = T([[1, 1, 1, 0]])
    # v=1.5, old 1, clip 0.2 → v_clip 1.2: (1.5−2)² = 0.25, (1.2−2)² = 0.64 → ½·0.64 = 0.32 (clipped)
    # v=1.1 → v_clip 1.1: both 0.81 → 0.405 (not clipped)
    # v=0.5 → v_clip 0.8: (0.5)² = 0.25, (0.8)² = 0.64 → 0.32 (clipped); masked → 0
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    torch.testing.assert_close(loss, T([[0.32, 0.405, 0.32, 0.0]]))
    assert metrics["value_clip_fraction"] == pytest.approx(2 / 3)
    assert metrics["value_error"] == pytest.approx((0.25 + 0.81 + 0.25) / 3)
    # unclipped: ½(v − R)² = [0.125, 0.405, 0.125, 0]
    loss, metrics = value_loss(values, old, returns, mask, clip_range=None)
    torch.testing.assert_close(loss, T([[0.125, 0.405, 0.125, 0.0]]))
    # masked-position invariance
    huge = T([[0.0, 0.0, 0.0, HUGE]])
    loss2, _ = value_loss(values.detach() + huge, old - huge, returns + huge, mask, clip_range=None)
    torch.testing.assert_close(loss2, loss.detach(), rtol=0, atol=0)


def test_entropy_bonus_is_negative_entropy_on_policy_tokens():
    # [−0.7, −1.2, masked 0]
    out = entropy_bonus(T([[0.7, 1.2, HUGE]]), T([[1, 1, 0]]))
    torch.testing.assert_close(out, T([[-0.7, -1.2, 0.0]]))


def test_demonstration_nll_hand_example():
    logprobs = T([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])
    mask = T([[1, 1, 0], [1, 0, 0]])
    assert float(demonstration_nll(logprobs, mask, 3.0)) == pytest.approx((1 + 2 + 0.5) / 3)


def test_demonstration_nll_micro_batches_add_up_and_ignore_masked_tokens():
    logprobs = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)) - 2
    mask = (torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    tokens = float(mask.sum())
    whole = demonstration_nll(logprobs, mask, tokens)
    parts = demonstration_nll(logprobs[:1], mask[:1], tokens) + demonstration_nll(logprobs[1:], mask[1:], tokens)
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)
    noisy = torch.where(mask > 0, logprobs, T(-1e4))
    assert float(demonstration_nll(noisy, mask, tokens)) == pytest.approx(float(whole), rel=1e-6)
