"""Trajectories → right-padded training tensors, aligned for next-token logprobs.

Alignment: a sequence is prompt_ids + response_ids (length L). Every per-token
tensor has length L-1: entry t concerns predicting token t+1. Response token j sits
at full position P+j, so its entries are at t = P+j-1. Padding positions hold 0
in `loss_mask` (and -1 in `turn_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ponder.types import Trajectory


@dataclass
class TokenBatch:
    """A batch of episodes as tensors (see module docstring for the alignment).

    input_ids, attention_mask: [B, L]. loss_mask, old_logprobs, turn_ids: [B, L-1].
    rewards: [B] (NaN = unscorable). turn_rewards, turn_mask: [B, K] per-turn rewards.
    ref_logprobs, old_values, advantages, returns: [B, L-1], filled by the trainer.
    sampler_logprobs: [B, L-1], the generation backend's log-probs when the trainer
    recomputed old_logprobs itself (a sampler with other kernels: vLLM, a bf16
    decoder), else None.
    old_from_forward: the update is one pass over the batch at the current weights, so
    the trainer's old log-probs are its own forward's, detached (train/update.py), and
    old_logprobs holds the sampler's until then.
    constraints: per row, the grammar its actions were sampled under
    (Trajectory.constraint, rollout.constrain), or None when no row had one.
    teacher_logprobs: [B, L-1], a teacher's log-probabilities of the tokens
    (algo.distill_coef, train/teacher.py), else None. teacher_topk_ids,
    teacher_topk_logprobs: [B, L-1, K], the teacher's k likeliest tokens at each
    position and their log-probabilities (algo.distill_loss topk), else None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    turn_ids: torch.Tensor
    rewards: torch.Tensor
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor
    group_ids: list[str]
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    sampler_logprobs: torch.Tensor | None = None
    old_from_forward: bool = False
    constraints: list | None = None
    teacher_logprobs: torch.Tensor | None = None
    teacher_topk_ids: torch.Tensor | None = None
    teacher_topk_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> TokenBatch:
        """The same batch with every tensor on `device` (the model's: a GPU); itself
        when they are there already."""
        if self.input_ids.device == torch.device(device):
            return self
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return TokenBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})

    def select(self, indices: list[int]) -> TokenBatch:
        """Rows `indices`, trimmed to their longest sequence (less padding to compute)."""
        index = torch.tensor(indices, dtype=torch.long)
        length = int(self.attention_mask[index].sum(-1).max())
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, torch.Tensor):  # None, group_ids (below), a flag
                picked[f.name] = value
                continue
            value = value[index]
            if f.name in ("input_ids", "attention_mask"):
                value = value[:, :length]
            elif value.dim() >= 2 and f.name not in ("turn_rewards", "turn_mask"):
                value = value[:, : length - 1]
            picked[f.name] = value
        picked["group_ids"] = [self.group_ids[i] for i in indices]
        if self.constraints is not None:
            picked["constraints"] = [self.constraints[i] for i in indices]
        return TokenBatch(**picked)


def turn_rewards(trajectory: Trajectory) -> list[float]:
    """Split the episode reward over turns: the per-turn rewards the environment gave
    (Turn.reward: a search's cost, a test run's score; none = 0) at their own turns, the
    rest (outcome, format) at the last turn. The turn rewards sum to the reward."""
    costs = [t.reward or 0.0 for t in trajectory.turns]
    if not costs:
        return []
    total = trajectory.reward if trajectory.reward is not None else float("nan")
    costs[-1] += total - sum(costs)
    return costs


def collate(trajectories: list[Trajectory], pad_id: int) -> TokenBatch:
    """Right-pad trajectories into a TokenBatch."""
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    width = max(lengths)
    max_turns = max(1, max(len(t.turns) for t in trajectories))
    batch = len(trajectories)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1))
    old_logprobs = torch.zeros((batch, width - 1))
    turn_ids = torch.full((batch, width - 1), -1, dtype=torch.long)
    per_turn = torch.zeros((batch, max_turns))
    turn_mask = torch.zeros((batch, max_turns))
    for row, trajectory in enumerate(trajectories):
        prompt, response = len(trajectory.prompt_ids), len(trajectory.response_ids)
        input_ids[row, : prompt + response] = torch.tensor(trajectory.prompt_ids + trajectory.response_ids)
        attention_mask[row, : prompt + response] = 1
        span = slice(prompt - 1, prompt + response - 1)
        loss_mask[row, span] = torch.tensor(trajectory.loss_mask, dtype=torch.float)
        old_logprobs[row, span] = torch.tensor(trajectory.old_logprobs, dtype=torch.float)
        turn_ids[row, span] = torch.tensor(_turn_index(trajectory), dtype=torch.long)
        rewards = turn_rewards(trajectory)
        per_turn[row, : len(rewards)] = torch.tensor(rewards)
        turn_mask[row, : len(rewards)] = 1
    rewards = torch.tensor([t.reward if t.reward is not None else float("nan") for t in trajectories])
    constraints = [t.constraint for t in trajectories]
    return TokenBatch(
        input_ids, attention_mask, loss_mask, old_logprobs, turn_ids, rewards, per_turn, turn_mask,
        [t.group_id for t in trajectories], constraints=constraints if any(constraints) else None,
    )  # fmt: skip


def _turn_index(trajectory: Trajectory) -> list[int]:
    """Turn number of every response token (action and observation tokens alike)."""
    index: list[int] = []
    for turn in trajectory.turns:
        index += [turn.index] * turn.n_tokens
    missing = len(trajectory.response_ids) - len(index)
    return index + [max(len(trajectory.turns) - 1, 0)] * missing if missing > 0 else index[: len(trajectory.response_ids)]
