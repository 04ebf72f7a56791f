"""Agent-level evaluation numbers for the pipeline's per-stage table, and forgetting
metrics (AA, BWT, FWT) of a sequence of task families."""

from __future__ import annotations

import math
from typing import Any

from ponder.eval.metrics import mean
from ponder.rewards.agent import AgentReward, components, generic_format, optimal_steps, target_tools
from ponder.rewards.qa import token_f1
from ponder.types import Task, Trajectory


def agent_metrics(
    trajectories: list[Trajectory], tasks_by_id: dict[str, Task], reward: AgentReward | None = None
) -> dict[str, float]:
    """Means over episodes:

    tool_selection_acc: the set of tools called equals the target set.
    plan_success: completion on tasks whose optimal plan has more than two steps.
    step_efficiency: optimal steps / steps taken (0 when unanswered).
    timing_precision: of the episodes that called a tool, the share that needed one.
    success: end-to-end completion (exact match). em / f1: answer scores.
    agent_reward: the composite agent reward (when `reward` is given).
    """
    rows = []
    for trajectory in trajectories:
        task = tasks_by_id[trajectory.task_id]
        values = components(trajectory, task, reward.format_fn if reward else generic_format)
        called = {c.name for turn in trajectory.turns for c in turn.tool_calls}
        rows.append((task, trajectory, values, called))
    plans = [v["completion"] for task, _, v, _ in rows if optimal_steps(task) > 2]
    callers = [bool(target_tools(task)) for task, _, _, called in rows if called]
    metrics = {
        "tool_selection_acc": mean([float(called == target_tools(task)) for task, _, _, called in rows]),
        "plan_success": mean(plans),
        "step_efficiency": mean([v["efficiency"] for _, _, v, _ in rows]),
        "timing_precision": mean([float(c) for c in callers]),
        "success": mean([v["completion"] for _, _, v, _ in rows]),
        "em": mean([v["completion"] for _, _, v, _ in rows]),
        "f1": mean([float(token_f1(t, task) or 0.0) for task, t, _, _ in rows]),
    }
    if reward is not None:
        metrics["agent_reward"] = mean([reward(t, task)[0] for task, t, _, _ in rows])
    return metrics


def forgetting_metrics(accuracy: list[list[float]], baseline: list[float] | None = None) -> dict[str, float]:
    """AA, BWT and FWT (Lopez-Paz & Ranzato 2017) from accuracy[i][j], the accuracy on
    family j after training on families 0..i (T×T), and baseline[j], family j's
    accuracy before any training (for FWT; omitted = FWT nan).

    AA = mean_j R[T-1][j]; BWT = mean_{j<T-1} (R[T-1][j] − R[j][j]) (negative =
    forgetting); FWT = mean_{j>0} (R[j-1][j] − baseline[j]).
    """
    families = len(accuracy)
    if families < 2 or any(len(row) != families for row in accuracy):
        raise ValueError(
            f"forgetting metrics need a square matrix of at least 2 families, got {len(accuracy)} rows"
        )
    last = accuracy[-1]
    result = {
        "AA": sum(last) / families,
        "BWT": sum(last[j] - accuracy[j][j] for j in range(families - 1)) / (families - 1),
        "FWT": float("nan"),
    }
    if baseline is not None:
        result["FWT"] = sum(accuracy[j - 1][j] - baseline[j] for j in range(1, families)) / (families - 1)
    return result


def paired_difference(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, int]:
    """(mean of after − before, its standard error, n) over the keys (task ids) both hold.

    Pairing by task removes the between-task variance, so two stages evaluated on the
    same held-out tasks are compared by their per-task differences.
    """
    keys = sorted(set(before) & set(after))
    differences = [after[k] - before[k] for k in keys]
    n = len(differences)
    if n == 0:
        return float("nan"), float("nan"), 0
    centre = sum(differences) / n
    se = math.sqrt(sum((d - centre) ** 2 for d in differences) / (n - 1) / n) if n > 1 else float("nan")
    return centre, se, n


def stage_table_rows(stages: list[tuple[str, dict[str, Any]]]) -> list[list[str]]:
    """Rows (stage, metric values formatted) for the per-stage table."""
    return [[name] + [_fmt(metrics.get(key)) for key in STAGE_COLUMNS] for name, metrics in stages]


STAGE_COLUMNS = (
    "tool_selection_acc", "plan_success", "step_efficiency", "timing_precision", "success", "em", "f1",
    "agent_reward",
)  # fmt: skip


def _fmt(value: Any) -> str:
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "-"
    return f"{value:.3f}"
