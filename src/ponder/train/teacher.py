"""Teachers for on-policy distillation (algo.distill_coef, the recipe's `teacher`):
logprob sources for the tokens the student sampled.

A teacher is any model ponder loads (a run, stage or checkpoint directory, a Hugging
Face directory, the embedded model), one for every task or one per task kind, run
in this process under no_grad on the batch the update trains on. Teachers must share
the student's tokenizer: the student's token ids are scored as they are, so a
different vocabulary is refused with one line rather than scored into nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ponder.config.sections import TeacherConfig
from ponder.models.loading import Policy, load_policy
from ponder.train.batch import TokenBatch
from ponder.train.update import forward_pass_no_grad

EVERY_KIND = ""  # the teacher of every task (teacher.model given as one path)


@dataclass
class Teacher:
    """policies: task kind -> the teacher of that kind's tasks (EVERY_KIND: of all)."""

    policies: dict[str, Policy]

    def token_logprobs(self, batch: TokenBatch, kinds: list[str], micro_batch_size: int,
                       temperature: float) -> torch.Tensor:  # fmt: skip
        """[B, L-1] each row's teacher log-probabilities of its tokens (aligned as
        batch.old_logprobs); a row whose kind has no teacher keeps the student's own
        (its distillation advantage is then 0)."""
        out = batch.old_logprobs.clone()
        for kind, policy in self.policies.items():
            rows = [i for i, k in enumerate(kinds) if k == kind or (kind == EVERY_KIND and k not in self.policies)]
            if not rows:
                continue
            part = batch.select(rows)
            scores = forward_pass_no_grad(policy, part, micro_batch_size, temperature)
            width = scores.shape[1]
            out[rows, :width] = torch.where(part.loss_mask.bool(), scores, out[rows, :width])
        return out


def load_teacher(config: TeacherConfig, student: Policy) -> Teacher | None:
    """The recipe's teacher(s), or None without one; ValueError naming the model for a
    tokenizer that is not the student's."""
    if not config.model:
        return None
    sources = dict(config.model) if isinstance(config.model, dict) else {EVERY_KIND: config.model}
    dtype = config.dtype if config.dtype != "auto" else str(student.dtype).removeprefix("torch.")
    policies = {}
    for kind, source in sources.items():
        policy = load_policy(str(source), dtype, str(student.device))
        check_same_tokenizer(policy, student, str(source))
        policy.model.eval()
        policies[kind] = policy
    return Teacher(policies)


def check_same_tokenizer(teacher: Policy, student: Policy, name: str) -> None:
    """The teacher reads the student's token ids as they are: same vocabulary needed."""
    if teacher.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise ValueError(f"teacher.model {name!r}: its tokenizer is not the student's ({len(teacher.tokenizer)} vs "
                         f"{len(student.tokenizer)} tokens); distillation scores the student's token ids, so both "
                         "must share one vocabulary")  # fmt: skip
