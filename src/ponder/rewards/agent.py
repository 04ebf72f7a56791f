"""The composite agent reward: task completion, tool-selection F1, step efficiency,
timing quality and format, a weighted total with named penalties, the breakdown,
and a one-line textual feedback.

What a task asks for comes from the task itself: `metadata["target_tools"]`
(default: ["search"] when `metadata["needs_search"]`, true unless it says false;
else none), `metadata["optimal_steps"]`
(default: the number of oracle actions) and `metadata["optimal_calls"]` (default:
the oracle actions that call a tool). Usable as an RL reward (same call shape as
CompositeReward) and for ranking sampled responses (DPO preference pairs).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from ponder.rewards.qa import exact_match
from ponder.rewards.search import needs_search
from ponder.types import Task, Trajectory

COMPONENTS = ("completion", "tool_f1", "efficiency", "timing", "format")
PENALTIES = ("wrong_tool", "redundant_call", "format_error", "timeout")


def target_tools(task: Task) -> set[str]:
    if "target_tools" in task.metadata:
        return set(task.metadata["target_tools"])
    return {"search"} if needs_search(task) else set()


def optimal_steps(task: Task) -> int:
    return int(task.metadata.get("optimal_steps") or max(1, len(task.oracle_actions)))


def optimal_calls(task: Task) -> int:
    if "optimal_calls" in task.metadata:
        return int(task.metadata["optimal_calls"])
    return sum(("<search>" in a) or ("<tool_call>" in a) for a in task.oracle_actions)


def tool_selection_f1(called: set[str], targets: set[str]) -> float:
    """F1 of the called tool names against the target names; 1.0 when both are empty."""
    if not called and not targets:
        return 1.0
    hits = len(called & targets)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(called), hits / len(targets)
    return 2 * precision * recall / (precision + recall)


def generic_format(trajectory: Trajectory, task: Task) -> float:
    """1.0 when the episode answered and no turn failed to parse."""
    answered = trajectory.final_answer is not None
    return 1.0 if answered and not any(turn.error for turn in trajectory.turns) else 0.0


def components(
    trajectory: Trajectory, task: Task, format_fn: Callable[[Trajectory, Task], float]
) -> dict[str, float]:
    """The five components and the four penalty counts of one episode."""
    calls = [c for turn in trajectory.turns for c in turn.tool_calls]
    targets = target_tools(task)
    called = {c.name for c in calls}
    answered = trajectory.final_answer is not None
    steps = max(1, len(trajectory.turns))
    keys = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in calls]
    duplicates = len(keys) - len(set(keys))
    right_calls = len({k for k in keys if k[0] in targets})
    return {
        "completion": float(exact_match(trajectory, task) or 0.0),
        "tool_f1": tool_selection_f1(called, targets),
        "efficiency": min(1.0, optimal_steps(task) / steps) if answered else 0.0,
        "timing": float(bool(calls) == bool(targets)),
        "format": float(format_fn(trajectory, task)),
        "wrong_tool": float(sum(c.name not in targets for c in calls)),
        "redundant_call": float(duplicates + max(0, right_calls - optimal_calls(task))),
        "format_error": float(sum(turn.error is not None for turn in trajectory.turns)),
        "timeout": float(not answered),
    }


class AgentReward:
    """total = Σ weight·component + Σ penalty weight·count (weights from AgentRewardConfig).

    `format_fn` scores format compliance (default: answered with no parse error;
    the pipeline passes the Search-R1 protocol check for search-QA).
    """

    def __init__(
        self, weights: dict[str, float], format_fn: Callable[[Trajectory, Task], float] = generic_format
    ):
        unknown = sorted(set(weights) - set(COMPONENTS) - set(PENALTIES))
        if unknown:
            raise ValueError(
                f"unknown agent reward term(s) {unknown}; valid: {', '.join(COMPONENTS + PENALTIES)}"
            )
        self.weights = {name: float(weights.get(name, 0.0)) for name in COMPONENTS + PENALTIES}
        self.format_fn = format_fn

    @classmethod
    def from_config(
        cls, cfg: Any, format_fn: Callable[[Trajectory, Task], float] = generic_format
    ) -> AgentReward:
        return cls({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, format_fn)

    def __call__(self, trajectory: Trajectory, task: Task) -> tuple[float, dict[str, float]]:
        """(total, breakdown): components by name, penalty counts as `penalty/<name>`."""
        values = components(trajectory, task, self.format_fn)
        total = sum(self.weights[name] * values[name] for name in COMPONENTS + PENALTIES)
        breakdown = {name: values[name] for name in COMPONENTS}
        breakdown.update({f"penalty/{name}": values[name] for name in PENALTIES})
        return float(total), breakdown

    def feedback(self, trajectory: Trajectory, task: Task) -> str:
        """One line on what went right and wrong, e.g. for reflection or a report."""
        values = components(trajectory, task, self.format_fn)
        parts = ["answer correct" if values["completion"] else "answer wrong or missing"]
        targets = sorted(target_tools(task))
        if values["timing"] == 0.0:
            parts.append(f"should have called {', '.join(targets)}" if targets else "no tool was needed")
        notes = {
            "wrong_tool": "call(s) to a tool outside " + (", ".join(targets) or "the (empty) target set"),
            "redundant_call": "redundant call(s)",
            "format_error": "malformed turn(s)",
        }
        parts += [f"{int(values[name])} {text}" for name, text in notes.items() if values[name]]
        if values["timeout"]:
            parts.append("ran out of turns without answering")
        if values["efficiency"] and values["efficiency"] < 1.0:
            parts.append(f"{len(trajectory.turns)} steps where {optimal_steps(task)} suffice")
        return "; ".join(parts)
