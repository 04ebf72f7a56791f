"""Search usage as a reward component; a negative weight turns it into a cost."""

from __future__ import annotations

from ponder.rewards.qa import exact_match
from ponder.types import Task, Trajectory


def search_calls(trajectory: Trajectory, task: Task) -> float:
    """Number of tool calls named "search" across all turns."""
    return float(sum(call.name == "search" for turn in trajectory.turns for call in turn.tool_calls))


def search_calls_if_correct(trajectory: Trajectory, task: Task) -> float | None:
    """Searches of an episode whose answer is right (exact match), else 0: with a
    negative weight, a cost paid only for efficiency among right answers. A failed
    episode is not cheaper for searching less, so RL is not taught to drop a needed
    second search because most two-search attempts at a hard question fail."""
    correct = exact_match(trajectory, task)
    if correct is None:
        return None
    return search_calls(trajectory, task) * correct
