"""Preference losses against hand-computed values, and the EWC penalty."""

import math

import pytest
import torch

from ponder.algos.dpo import (
    PREFERENCE_LOSSES,
    PreferenceLossConfig,
    dpo_loss,
    ewc_penalty,
    sequence_logprobs,
)

# policy chosen/rejected −1, −3; reference −2, −2: margin = (−1+2) − (−3+2) = 2.
CHOSEN, REJECTED = torch.tensor([-1.0]), torch.tensor([-3.0])
REF_CHOSEN, REF_REJECTED = torch.tensor([-2.0]), torch.tensor([-2.0])


def _loss(**cfg):
    losses, stats = dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, PreferenceLossConfig(**cfg))
    return float(losses[0]), stats


def test_sigmoid_is_minus_log_sigmoid_of_beta_margin():
    value, stats = _loss(loss="sigmoid", beta=0.5)
    assert value == pytest.approx(math.log(1 + math.exp(-1.0)))  # −log σ(0.5·2)
    assert float(stats["chosen_reward"][0]) == pytest.approx(0.5)
    assert float(stats["rejected_reward"][0]) == pytest.approx(-0.5)
    assert float(stats["accuracy"][0]) == 1.0


def test_label_smoothing_mixes_in_the_flipped_label():
    value, _ = _loss(loss="sigmoid", beta=0.5, label_smoothing=0.1)
    assert value == pytest.approx(0.9 * math.log(1 + math.exp(-1.0)) + 0.1 * math.log(1 + math.exp(1.0)))


def test_hinge_and_ipo():
    assert _loss(loss="hinge", beta=0.25)[0] == pytest.approx(0.5)  # max(0, 1 − 0.25·2)
    assert _loss(loss="hinge", beta=1.0)[0] == 0.0
    assert _loss(loss="ipo", beta=0.5)[0] == pytest.approx(1.0)  # (2 − 1/(2·0.5))²


def test_reference_free_drops_the_reference_terms():
    value, _ = _loss(loss="sigmoid", beta=0.5, reference_free=True)  # margin = −1 − (−3) = 2 as well
    assert value == pytest.approx(math.log(1 + math.exp(-1.0)))
    losses, _ = dpo_loss(
        CHOSEN, REJECTED, torch.tensor([5.0]), REF_REJECTED, PreferenceLossConfig(reference_free=True)
    )
    assert float(losses[0]) == pytest.approx(
        math.log(1 + math.exp(-0.2))
    )  # the reference is ignored; β = 0.1


def test_sequence_logprobs_ignore_masked_positions():
    logprobs = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, 7.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert sequence_logprobs(logprobs, mask).tolist() == [-3.0, -1.0]
    assert sequence_logprobs(logprobs, mask, average=True).tolist() == [-1.5, -0.5]


def test_losses_are_per_pair_so_batching_does_not_change_them():
    margin = torch.tensor([0.3, -1.2, 2.0])
    for name in PREFERENCE_LOSSES:
        loss = PREFERENCE_LOSSES.get(name)
        together = loss(margin, 0.2, 0.05)
        apart = torch.cat([loss(margin[i : i + 1], 0.2, 0.05) for i in range(3)])
        assert torch.allclose(together, apart)


def test_unknown_loss_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown preference loss 'kto'; valid: hinge, ipo, sigmoid"):
        _loss(loss="kto")


def test_ewc_penalty_by_hand_and_its_gradient():
    theta = torch.tensor([1.0, 2.0], requires_grad=True)
    penalty = ewc_penalty({"w": theta}, {"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([2.0, 4.0])}, 3.0)
    assert float(penalty.detach()) == pytest.approx(0.5 * 3.0 * (2.0 * 1.0 + 4.0 * 1.0))  # 9
    penalty.backward()
    assert theta.grad.tolist() == pytest.approx([3.0 * 2.0 * 1.0, 3.0 * 4.0 * 1.0])  # λ·F·(θ−θ*)
    at_anchor = ewc_penalty({"w": torch.zeros(2)}, {"w": torch.zeros(2)}, {"w": torch.ones(2)}, 5.0)
    assert float(at_anchor) == 0.0


def test_chosen_nll_adds_alpha_times_the_per_token_nll():
    from ponder.algos.dpo import with_chosen_nll

    losses = torch.tensor([0.5, 0.25])
    # mean log-probs −2 and −0.5 per chosen token: + 0.5·2 and + 0.5·0.5
    assert with_chosen_nll(losses, torch.tensor([-2.0, -0.5]), 0.5).tolist() == pytest.approx([1.5, 0.5])
    assert with_chosen_nll(losses, torch.tensor([-2.0, -0.5]), 0.0).tolist() == losses.tolist()


def test_only_ipo_averages_log_probs():
    # DPOTrainer reads this trait (never the name): IPO is defined on token-mean log-probs
    assert {name: PREFERENCE_LOSSES.trait(name, "average_logprobs") for name in PREFERENCE_LOSSES} == {
        "hinge": False, "ipo": True, "sigmoid": False,
    }  # fmt: skip
