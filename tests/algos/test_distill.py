"""Distillation terms (ponder.algos.distill) on tiny hand-computed distributions, and
their invariances: masked positions change nothing, a teacher equal to the student
gives zero loss and zero gradient, the batch split changes nothing."""

from __future__ import annotations

import math

import pytest
import torch

from ponder.algos.distill import (DISTILL_LOSSES, DistillConfig, TeacherScores, generalized_jsd, opd_advantage,
                                  topk_forward_kl)  # fmt: skip

P, Q = [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]  # student, teacher (one position, three tokens)


def _logits(probs):
    return torch.tensor([[probs]]).log()  # [1, 1, V]: log-probabilities are valid logits


def test_opd_advantage_is_teacher_minus_student_on_policy_tokens_only():
    student, teacher = torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-0.5, -2.5, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert opd_advantage(student, teacher, mask).tolist() == [[0.5, -0.5, 0.0]]
    assert opd_advantage(student, student, torch.ones(1, 3)).abs().sum() == 0


def test_forward_and_reverse_kl_by_hand():
    forward = sum(q * math.log(q / p) for p, q in zip(P, Q))  # KL(teacher || student)
    reverse = sum(p * math.log(p / q) for p, q in zip(P, Q))  # KL(student || teacher)
    mask = torch.ones(1, 1)
    got_forward = generalized_jsd(_logits(P), TeacherScores(logits=_logits(Q)), mask, DistillConfig(beta=0.0))
    got_reverse = generalized_jsd(_logits(P), TeacherScores(logits=_logits(Q)), mask, DistillConfig(beta=1.0))
    assert got_forward.item() == pytest.approx(forward, abs=1e-6)
    assert got_reverse.item() == pytest.approx(reverse, abs=1e-6)
    assert forward == pytest.approx(0.25 * math.log(2), abs=1e-12)  # 0.25 ln 0.5 ... + 0.5 ln 2


def test_jsd_by_hand():
    beta = 0.5
    mixture = [(1 - beta) * p + beta * q for p, q in zip(P, Q)]  # [0.375, 0.25, 0.375]
    expected = beta * sum(q * math.log(q / m) for q, m in zip(Q, mixture)) + (1 - beta) * sum(
        p * math.log(p / m) for p, m in zip(P, mixture))  # fmt: skip
    got = generalized_jsd(_logits(P), TeacherScores(logits=_logits(Q)), torch.ones(1, 1), DistillConfig(beta=beta))
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_topk_forward_kl_renormalises_the_teachers_k_by_hand():
    ids = torch.tensor([[[2, 0]]])  # the teacher's top 2: tokens 2 and 0, p 0.5 and 0.25 -> 2/3, 1/3
    logprobs = torch.tensor([[[math.log(0.5), math.log(0.25)]]])
    got = topk_forward_kl(_logits(P), TeacherScores(topk_ids=ids, topk_logprobs=logprobs), torch.ones(1, 1),
                          DistillConfig())  # fmt: skip
    expected = (2 / 3) * (math.log(2 / 3) - math.log(0.25)) + (1 / 3) * (math.log(1 / 3) - math.log(0.5))
    assert got.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", ["gkd", "topk"])
def test_masked_positions_change_nothing_and_equal_teacher_gives_zero_gradient(name):
    torch.manual_seed(0)
    student = torch.randn(2, 4, 7, requires_grad=True)
    teacher_logits = torch.randn(2, 4, 7)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    loss = DISTILL_LOSSES.get(name)

    def scores(logits):
        top = torch.log_softmax(logits, -1).topk(3, dim=-1)
        return TeacherScores(logits=logits, topk_ids=top.indices, topk_logprobs=top.values)

    base = loss(student, scores(teacher_logits), mask, DistillConfig())
    changed = teacher_logits.clone()
    changed[~mask.bool()] = torch.randn(int((~mask.bool()).sum()), 7)  # noise where nothing is trained
    assert torch.equal(base, loss(student, scores(changed), mask, DistillConfig()))
    assert (base[~mask.bool()] == 0).all() and (base[mask.bool()] > 0).all()
    if name == "gkd":  # a teacher equal to the student: zero loss, zero gradient
        same = loss(student, scores(student.detach()), mask, DistillConfig())
        same.sum().backward()
        assert same.abs().max() < 1e-6 and student.grad.abs().max() < 1e-6
    halves = torch.cat([loss(student[i : i + 1], scores(teacher_logits[i : i + 1]), mask[i : i + 1], DistillConfig())
                        for i in range(2)])  # fmt: skip
    assert torch.allclose(halves, base, atol=1e-6)  # rows are independent: the batch split changes nothing
    assert DISTILL_LOSSES.trait(name, "teacher") == ("logits" if name == "gkd" else "topk")
