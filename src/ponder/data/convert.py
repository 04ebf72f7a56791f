"""Trajectory records → conversations: successful rollouts become SFT data.

An episode's turns become assistant messages (the action text verbatim, its
parsed calls as `tool_calls`) each followed by a `tool` message holding the
observation the environment appended. Rendered in the `inline` style the
conversation gives back the episode's exact token ids and loss mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ponder.data.records import Conversation, PreferencePair
from ponder.types import Task, ToolSpec, Trajectory

# Search-QA task kinds as the pipeline's task types.
KIND_TO_TASK_TYPE = {
    "single_hop": "tool_selection",
    "multi_hop": "multi_step_planning",
    "in_prompt": "timing_decision",
}


def task_type_of(task: Task) -> str:
    return str(task.metadata.get("task_type") or KIND_TO_TASK_TYPE.get(task.kind, task.kind))


def response_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The episode's assistant and tool messages, in order."""
    messages: list[dict[str, Any]] = []
    for turn in trajectory.turns:
        message: dict[str, Any] = {"role": "assistant", "content": turn.action}
        if turn.tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments, "raw": c.raw}}
                for c in turn.tool_calls
            ]
        messages.append(message)
        if turn.observation is not None:
            messages.append({"role": "tool", "content": turn.observation})
    return messages


def trajectory_to_conversation(
    trajectory: Trajectory, task: Task, prompt: list[dict[str, Any]], tools: list[ToolSpec]
) -> Conversation:
    """`prompt` is what the env showed (e.g. envs.build_messages(task))."""
    return Conversation(
        list(prompt) + response_messages(trajectory),
        [spec.to_openai() for spec in tools],
        task_type_of(task),
        f"{trajectory.task_id}:{trajectory.group_id}",
    )


def successful_conversations(
    trajectories: list[Trajectory],
    tasks_by_id: dict[str, Task],
    prompt_of: Callable[[Task], list[dict[str, Any]]],
    tools: list[ToolSpec],
    min_reward: float | None = None,
) -> list[Conversation]:
    """Conversations of the episodes that answered without a failed turn (and, with
    min_reward, scored at least that)."""
    kept = []
    for trajectory in trajectories:
        if trajectory.final_answer is None or any(turn.error for turn in trajectory.turns):
            continue
        if min_reward is not None and (trajectory.reward is None or trajectory.reward < min_reward):
            continue
        task = tasks_by_id[trajectory.task_id]
        kept.append(trajectory_to_conversation(trajectory, task, prompt_of(task), tools))
    return kept


def preference_from_trajectories(
    chosen: Trajectory, rejected: Trajectory, task: Task, prompt: list[dict[str, Any]], tools: list[ToolSpec]
) -> PreferencePair:
    """A conversational preference row from two episodes of the same task."""
    return PreferencePair(
        list(prompt), response_messages(chosen), response_messages(rejected),
        [spec.to_openai() for spec in tools], task_type_of(task), task.id,
    )  # fmt: skip
