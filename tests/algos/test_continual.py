"""Continual-learning math (ponder.algos.continual) against hand-computed values, and
the invariances each must keep."""

import pytest
import torch

from ponder.algos.continual import (
    agem_project,
    derpp_logit_term,
    ewc_penalty,
    nearest_centroid,
    output_sensitivity,
    quadratic_penalty,
    si_importance,
    si_path_step,
)
from ponder.algos.dpo import ewc_penalty as ewc_penalty_from_dpo


def test_quadratic_penalty_by_hand_and_its_gradient():
    theta = torch.tensor([1.0, 2.0], requires_grad=True)
    anchors, importance = {"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([2.0, 4.0])}
    penalty = quadratic_penalty({"w": theta}, anchors, importance, 3.0)
    assert float(penalty.detach()) == pytest.approx(3.0 * (2.0 * 1.0 + 4.0 * 1.0))  # 18
    penalty.backward()
    assert theta.grad.tolist() == pytest.approx([2 * 3.0 * 2.0 * 1.0, 2 * 3.0 * 4.0 * 1.0])  # 2·c·Ω·(θ−θ*)
    # EWC is the same quadratic at half the weight; its old import path still works
    assert float(ewc_penalty({"w": theta.detach()}, anchors, importance, 3.0)) == pytest.approx(9.0)
    assert ewc_penalty_from_dpo is ewc_penalty


def test_quadratic_penalty_is_zero_at_the_anchor_and_ignores_unanchored_weights():
    anchors, importance = {"w": torch.tensor([0.5, -1.0])}, {"w": torch.tensor([7.0, 3.0])}
    assert float(quadratic_penalty({"w": anchors["w"].clone()}, anchors, importance, 5.0)) == 0.0
    moved = {"w": torch.tensor([1.5, -1.0]), "other": torch.tensor([100.0])}
    # a weight with importance 0 may move freely; a weight with no anchor is not penalised
    free = {"w": torch.tensor([1.5, 4.0]), "other": torch.tensor([-3.0])}
    half = {"w": torch.tensor([7.0, 0.0])}
    assert float(quadratic_penalty(moved, anchors, half, 1.0)) == pytest.approx(7.0)
    assert float(quadratic_penalty(free, anchors, half, 1.0)) == pytest.approx(7.0)
    assert float(quadratic_penalty({}, {}, {}, 1.0)) == 0.0


def test_si_path_integral_and_importance_by_hand():
    step = si_path_step(torch.tensor([1.0, -2.0]), torch.zeros(2), torch.tensor([-0.1, 0.3]))
    assert step.tolist() == pytest.approx([0.1, 0.6])  # −g·Δθ: both steps went downhill
    omega, delta = torch.tensor([0.1, -0.2, 0.5]), torch.tensor([0.1, 0.5, 0.0])
    # 0.1 / (0.01 + 0.01) = 5; negative ω clipped to 0; 0.5 / (0 + 0.01) = 50
    assert si_importance(omega, delta, 0.01).tolist() == pytest.approx([5.0, 0.0, 50.0])


def test_si_importance_depends_on_the_size_of_the_move_not_its_sign():
    omega, delta = torch.tensor([0.3, 0.2]), torch.tensor([0.2, -0.7])
    assert torch.equal(si_importance(omega, delta, 1e-3), si_importance(omega, -delta, 1e-3))
    # an uphill step (g and Δθ of the same sign) lowers the path integral
    assert float(si_path_step(torch.tensor([1.0]), torch.zeros(1), torch.tensor([0.5]))) == -0.5


def test_output_sensitivity_by_hand():
    logits = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [5.0, 5.0]], [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # row 0: ‖z‖² = 5, 9 at its assistant positions → mean 7; row 1 has none → 0
    assert output_sensitivity(logits, mask).tolist() == pytest.approx([7.0, 0.0])


def test_output_sensitivity_ignores_masked_positions():
    logits = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]])
    changed = logits.clone()
    changed[mask == 0] = 1e3
    assert torch.allclose(output_sensitivity(logits, mask), output_sensitivity(changed, mask))


def test_agem_projection_by_hand():
    grad, ref = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])
    # g·g_ref = −1, g_ref·g_ref = 2: g̃ = g − (−1/2)·g_ref = [0.5, 0.5], orthogonal to g_ref
    projected = agem_project(grad, ref)
    assert projected.tolist() == pytest.approx([0.5, 0.5])
    assert float(torch.dot(projected, ref)) == pytest.approx(0.0)


def test_agem_leaves_a_gradient_that_agrees_with_the_memory_unchanged():
    grad = torch.tensor([1.0, 1.0, -2.0])
    # g·g_ref = 0.5, 0 and 0
    agreeing = (torch.tensor([1.0, -0.5, 0.0]), torch.tensor([0.0, 2.0, 1.0]), torch.zeros(3))
    for ref in agreeing:
        assert agem_project(grad, ref) is grad
    # the projection does not depend on g_ref's scale
    ref = torch.tensor([-2.0, 0.5, 1.0])
    assert torch.allclose(agem_project(grad, ref), agem_project(grad, 10 * ref))


def test_derpp_logit_term_by_hand_full_and_topk():
    logits = torch.tensor([[[1.0, 2.0], [0.0, 0.0]]])
    stored = torch.tensor([[[0.0, 2.0], [9.0, 9.0]]])
    # position 0: ((1 − 0)² + (2 − 2)²) / 2 = 0.5; position 1 is not an assistant position
    assert float(derpp_logit_term(logits, stored, torch.tensor([[1, 0]]))) == pytest.approx(0.5)
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    values, index = torch.tensor([[[3.5, 1.0]]]), torch.tensor([[[2, 0]]], dtype=torch.int32)
    # the current logits at the stored ids 2 and 0 are 3 and 1: ((3 − 3.5)² + 0²) / 2
    assert float(derpp_logit_term(logits, values, torch.tensor([[1]]), index)) == pytest.approx(0.125)


def test_derpp_logit_term_ignores_masked_positions_and_sends_them_no_gradient():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 4, generator=generator, requires_grad=True)
    stored = torch.randn(2, 3, 4, generator=generator)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    term = derpp_logit_term(logits, stored, mask)
    noisy = stored.clone()
    noisy[mask == 0] = 50.0
    assert float(derpp_logit_term(logits, noisy, mask)) == pytest.approx(float(term))
    term.backward()
    assert torch.all(logits.grad[mask == 0] == 0) and torch.any(logits.grad[mask == 1] != 0)
    assert float(derpp_logit_term(stored, stored, mask)) == 0.0  # unchanged logits: no term
    assert float(derpp_logit_term(logits, stored, torch.zeros(2, 3))) == 0.0


def test_nearest_centroid_by_hand_and_scale_invariant():
    states = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    centroids = torch.tensor([[1.0, 0.1], [0.0, 1.0]])
    # [1, 1]: cos 1.1 / (√2·√1.01) ≈ 0.774 with the first, 1/√2 ≈ 0.707 with the second
    assert nearest_centroid(states, centroids).tolist() == [0, 1, 0]
    assert torch.equal(nearest_centroid(3.0 * states, centroids), nearest_centroid(states, 0.5 * centroids))
