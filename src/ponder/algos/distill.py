"""Distillation from a teacher: registered pure functions over the student's and the
teacher's log-probabilities, masked like every RL term (loss_mask 1 on the student's
own sampled tokens; tool output, retrieved text and other environment text are never
distilled).

- `opd_advantage`: on-policy distillation (OPD). The student samples its episodes;
  the teacher scores each sampled token; the per-token advantage is the negative
  reverse-KL estimate log π_teacher(a_t) − log π_student(a_t), trained with the same
  policy-gradient loss as RL (undiscounted: each token is credited with its own
  term). Its expectation over the student's samples is −KL(student ‖ teacher).
- `generalized_jsd`: GKD's generalised Jensen-Shannon divergence between the full
  next-token distributions, β interpolating between forward KL (β = 0:
  KL(teacher ‖ student)) and reverse KL (β = 1: KL(student ‖ teacher)), as TRL's
  GKD trainer defines it.
- `topk_forward_kl`: the forward KL on the teacher's top-k tokens only (the teacher's
  top-k log-probabilities renormalised over those k), for a teacher that returns
  only its top-k (an OpenAI-compatible server's `top_logprobs`).

The full-distribution losses share one signature and are registered (their trait
`teacher` says what of the teacher they read: `logits` or `topk`); each returns
per-token values [B, T] (0 where loss_mask is 0), so the caller aggregates them as
it aggregates policy losses. Add one with::

    @DISTILL_LOSSES.register("mine", teacher="logits")
    def mine(student_logits, teacher: TeacherScores, loss_mask, cfg): ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ponder.registry import Registry



@dataclass
class TeacherScores:
    """What a teacher gave for a batch's positions: its logits [B, T, V] (an in-process
    teacher), or its top-k token ids [B, T, K] and their log-probabilities [B, T, K]
    (a server's `top_logprobs`)."""

    logits: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None


DISTILL_LOSSES: Registry = Registry("distillation loss", {"teacher": "logits"})


@dataclass
class DistillConfig:
    """beta: GKD's interpolation (0 forward KL, 1 reverse KL, between: the JSD of the
    mixture (1 − β)·student + β·teacher). temperature: both distributions' logits
    are divided by it first (full-distribution losses)."""

    beta: float = 0.5
    temperature: float = 1.0


@torch.no_grad()
def opd_advantage(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                  loss_mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """[B, T] sampled-token log-probabilities of the student (as sampled) and of the
    teacher, loss_mask [B, T] -> per-token advantages [B, T]: log π_t − log π_s on
    policy tokens, 0 elsewhere. A teacher equal to the student gives 0 everywhere."""
    return torch.where(loss_mask.bool(), teacher_logprobs - student_logprobs, torch.zeros_like(student_logprobs))


@DISTILL_LOSSES.register("gkd", teacher="logits")
def generalized_jsd(student_logits: torch.Tensor, scores: TeacherScores, loss_mask: torch.Tensor,
                    cfg: DistillConfig) -> torch.Tensor:  # fmt: skip
    """student_logits [B, T, V], the teacher's logits [B, T, V] (detached), loss_mask
    [B, T] -> per-token JSD_β [B, T] (see module docstring), 0 where masked."""
    student = torch.log_softmax(student_logits.float() / cfg.temperature, dim=-1)
    teacher = torch.log_softmax(scores.logits.float().detach() / cfg.temperature, dim=-1)
    if cfg.beta <= 0:
        per_token = _kl(teacher, student)
    elif cfg.beta >= 1:
        per_token = _kl(student, teacher)
    else:
        mixture = torch.logsumexp(torch.stack([student + math.log(1 - cfg.beta), teacher + math.log(cfg.beta)]), dim=0)
        per_token = cfg.beta * _kl(teacher, mixture) + (1 - cfg.beta) * _kl(student, mixture)
    return torch.where(loss_mask.bool(), per_token, torch.zeros_like(per_token))


@DISTILL_LOSSES.register("topk", teacher="topk")
def topk_forward_kl(student_logits: torch.Tensor, scores: TeacherScores, loss_mask: torch.Tensor,
                    cfg: DistillConfig) -> torch.Tensor:  # fmt: skip
    """student_logits [B, T, V]; the teacher's top-k token ids [B, T, K] (long) and
    their log-probabilities [B, T, K]; loss_mask [B, T] -> per-token
    Σ_k p̂_t(k) (log p̂_t(k) − log π_s(k)) [B, T], p̂_t the teacher's top-k renormalised."""
    student = torch.log_softmax(student_logits.float() / cfg.temperature, dim=-1).gather(-1, scores.topk_ids)
    teacher = torch.log_softmax(scores.topk_logprobs.float().detach(), dim=-1)  # renormalised over the k
    per_token = (teacher.exp() * (teacher - student)).sum(-1)
    return torch.where(loss_mask.bool(), per_token, torch.zeros_like(per_token))


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the last dimension from log-probabilities [..., V] -> [...]."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)
