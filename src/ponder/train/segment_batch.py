"""Compacted episodes (rollout.context) as training rows: one row per segment.

An episode that compacted its context has one response stream but several contexts
(Trajectory.segments): segment k's tokens were sampled after its own prompt ids, not
after everything before them. Scoring them in the whole-episode row would compute
their log-probabilities under a context the policy never read, so every pass that runs
the model (the trainer's old log-probs, the reference, the teacher, the update) runs on
segment rows: the segment's prompt ids + its slice of the response, with the slice's
loss_mask and recorded old_logprobs. What is a property of the episode stays the
episode's: advantages are computed on the whole-episode rows (rewards, groups and turn
ids are the episode's, each episode counted once in its group) and their per-token
values are then moved onto the segment rows (`spread`).

Alignment as in train/batch.py: response token j of episode row e sits at entry
P_e + j - 1 (P_e its prompt length); in segment row r holding response tokens
[start, end) after a prompt of P_r tokens, token j sits at entry P_r + (j - start) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ponder.train.batch import TokenBatch, collate
from ponder.train.update import forward_pass_no_grad
from ponder.types import Trajectory


@dataclass
class SegmentLayout:
    """Where segment row r comes from: response tokens [start[r], end[r]) of episode
    episode[r], after prompt[r] prompt tokens; that episode's own row has a prompt of
    episode_prompt[r] tokens."""

    episode: list[int]
    start: list[int]
    end: list[int]
    prompt: list[int]
    episode_prompt: list[int]


def segment_bounds(trajectory: Trajectory) -> list[tuple[list[int], int, int]]:
    """(prompt ids, start, end) of each segment of the response, in order; one
    (prompt_ids, 0, len(response)) for an episode that never compacted."""
    starts = [(trajectory.prompt_ids, 0)] + [(ids, offset) for offset, ids in trajectory.segments]
    ends = [offset for _, offset in starts[1:]] + [len(trajectory.response_ids)]
    return [(ids, start, end) for (ids, start), end in zip(starts, ends)]


def segment_trajectories(trajectory: Trajectory) -> list[Trajectory]:
    """Each segment as a Trajectory (its prompt, its slice of the response, mask and old
    log-probs; the episode's reward, group and grammar); no turns: its turn ids come
    from the episode (`collate_segments`)."""
    rows = []
    for prompt_ids, start, end in segment_bounds(trajectory):
        rows.append(Trajectory(
            task_id=trajectory.task_id, prompt_ids=list(prompt_ids), response_ids=trajectory.response_ids[start:end],
            loss_mask=trajectory.loss_mask[start:end], old_logprobs=trajectory.old_logprobs[start:end],
            reward=trajectory.reward, group_id=trajectory.group_id, constraint=trajectory.constraint,
        ))  # fmt: skip
    return rows


def spread(values: torch.Tensor, layout: SegmentLayout, width: int, fill: float = 0.0) -> torch.Tensor:
    """Per-token values of episode rows [B, L-1] moved onto segment rows [R, width-1]
    (see module doc for the alignment); `fill` where a segment row holds no response
    token (its prompt, padding). Each response token's value appears once, in the row
    of the segment it was sampled in."""
    out = values.new_full((len(layout.episode), width - 1), fill)
    for row, episode in enumerate(layout.episode):
        start, n = layout.start[row], layout.end[row] - layout.start[row]
        source = layout.episode_prompt[row] - 1 + start
        target = layout.prompt[row] - 1
        out[row, target : target + n] = values[episode, source : source + n]
    return out


@dataclass
class SegmentBatch:
    """The step's episodes twice: `episodes` (one row each, for the advantages) and
    `rows` (one row per segment, for every pass that runs the model), and the layout
    between them."""

    episodes: TokenBatch
    rows: TokenBatch
    layout: SegmentLayout

    def spread(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Per-token values of the episode rows on the segment rows (`spread`)."""
        return spread(values, self.layout, self.rows.input_ids.shape[1], fill)


def collate_segments(trajectories: list[Trajectory], pad_id: int, episodes: TokenBatch | None = None) -> SegmentBatch:
    """The segment rows of `trajectories` (`episodes`: their collate, made here when not
    given): tokens, masks and old log-probs sliced per segment; turn ids spread from
    the episode rows; rewards, per-turn rewards, groups and grammars the episode's."""
    episodes = episodes if episodes is not None else collate(trajectories, pad_id)
    parts, index = [], []
    layout = SegmentLayout([], [], [], [], [])
    for e, trajectory in enumerate(trajectories):
        for (prompt_ids, start, end), part in zip(segment_bounds(trajectory), segment_trajectories(trajectory)):
            parts.append(part)
            index.append(e)
            layout.episode.append(e)
            layout.start.append(start)
            layout.end.append(end)
            layout.prompt.append(len(prompt_ids))
            layout.episode_prompt.append(len(trajectory.prompt_ids))
    rows = collate(parts, pad_id)
    rows.turn_ids = spread(episodes.turn_ids, layout, rows.input_ids.shape[1], fill=-1)
    rows.turn_rewards, rows.turn_mask = episodes.turn_rewards[index], episodes.turn_mask[index]
    return SegmentBatch(episodes, rows, layout)


def logprob_gap(policy: Any, batch: TokenBatch, temperature: float, micro_batch_size: int = 4) -> dict[str, float]:
    """|recomputed - recorded| log-probability over the batch's policy tokens (loss_mask
    1), the policy scoring each row as it is now: `mean`, `max` and `tokens` (0s
    without such tokens)."""
    recomputed = forward_pass_no_grad(policy, batch, micro_batch_size, temperature)
    gap = (recomputed - batch.old_logprobs).abs()[batch.loss_mask.bool()]
    if not gap.numel():
        return {"mean": 0.0, "max": 0.0, "tokens": 0.0}
    return {"mean": float(gap.mean()), "max": float(gap.max()), "tokens": float(gap.numel())}


def segment_logprob_gap(policy: Any, trajectories: list[Trajectory], temperature: float,
                        micro_batch_size: int = 4) -> dict[str, float]:  # fmt: skip
    """Token-exactness of (compacted) episodes: `logprob_gap` over their segment rows,
    each token scored under the context it was sampled in; at the sampling weights it is
    the kernels' difference only (~1e-6 in float32)."""
    rows = collate_segments(trajectories, policy.tokenizer.pad_token_id).rows
    return logprob_gap(policy, rows, temperature, micro_batch_size)
