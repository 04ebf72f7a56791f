"""Aggregate scored trajectories into the numbers an evaluation reports."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from ponder.envs.base import PART_KEY
from ponder.eval.trajectory_score import EpisodeScore, score_episode, trajectory_summary
from ponder.types import Task, Trajectory


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def standard_error(values: list[float]) -> float:
    """Standard error of the mean (sample std / sqrt(n)); nan below two values."""
    n = len(values)
    if n < 2:
        return float("nan")
    centre = mean(values)
    return math.sqrt(sum((v - centre) ** 2 for v in values) / (n - 1) / n)


def summarise(trajectories: list[Trajectory], tasks_by_id: dict[str, Task]) -> dict[str, Any]:
    """Means over episodes (and per task kind) of the reward breakdown and episode
    counts; for a mixture of environments also per part (`by_part`). Beside the
    outcome (`reward`), every group has the trajectory's `step_score` (the mean share
    of good steps, ponder.eval.trajectory_score) and its se; `trajectory` holds the
    whole trajectory summary of all episodes (outcome against trajectory included)."""
    scores = {id(t): score_episode(t, tasks_by_id.get(t.task_id)) for t in trajectories}
    overall = _summary(trajectories, scores)
    by_kind: dict[str, list[Trajectory]] = defaultdict(list)
    by_part: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        task = tasks_by_id[trajectory.task_id]
        by_kind[task.kind].append(trajectory)
        if isinstance(task.metadata.get(PART_KEY), str):
            by_part[task.metadata[PART_KEY]].append(trajectory)
    overall["by_kind"] = {kind: _summary(group, scores) for kind, group in sorted(by_kind.items())}
    if by_part:
        overall["by_part"] = {part: _summary(group, scores) for part, group in sorted(by_part.items())}
    overall["trajectory"] = trajectory_summary(list(scores.values()))
    return overall


def _summary(trajectories: list[Trajectory], scores: dict[int, EpisodeScore]) -> dict[str, Any]:
    rewards = [t.reward for t in trajectories if t.reward is not None]
    steps = trajectory_summary([scores[id(t)] for t in trajectories])

    def breakdown(name: str) -> float:
        return mean([t.breakdown[name] for t in trajectories if name in t.breakdown])

    def metric(name: str) -> float:
        return mean([t.metrics.get(name, 0.0) for t in trajectories])

    names = sorted({name for t in trajectories for name in t.breakdown})
    return {
        "episodes": len(trajectories),
        "reward": mean(rewards),
        "reward_se": standard_error(rewards),
        "step_score": steps["step_score"],
        "step_score_se": steps["step_score_se"],
        "em": breakdown("em"),
        "f1": breakdown("f1"),
        "format": breakdown("format"),
        # every reward component the environment scored, whatever its name
        "components": {name: breakdown(name) for name in names},
        "searches_per_episode": metric("searches"),
        "tool_calls_per_episode": metric("tool_calls"),
        "turns": metric("turns"),
        "generated_tokens": metric("generated_tokens"),
        "answered": metric("answered"),
        "parse_errors": metric("parse_errors"),
        "tool_errors": metric("tool_errors"),
    }
