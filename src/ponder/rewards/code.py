"""The code environment's reward components.

The environment runs the hidden tests when the model answers and gives the share
that passed as that turn's reward (`Turn.reward`); these components read it back
from the trajectory, so a saved episode is rescored without running code again.

- tests_passed: share of the hidden tests the final answer passed (0 without an
  answer; None when the environment itself failed, so the episode is left out
  rather than scored as the model's failure).
- all_pass: 1 when every hidden test passed, else 0: the headline number.
- code_format: 1 when every action is `[<think>…</think>] <run|answer> + one
  ```python block + close tag`, with only whitespace around, every action but the
  last runs and the last answers, and no turn had an error.
"""

from __future__ import annotations

import re

from ponder.types import Task, Trajectory

_PLAIN = r"(?:(?!</?(?:think|run|answer)>).)*?"  # text holding no protocol tag
_ACTION = re.compile(
    rf"\s*(?:<think>{_PLAIN}</think>\s*)?<(?P<tag>run|answer)>\s*```python[ \t]*\n(?P<code>{_PLAIN})\n?```\s*"
    r"</(?P=tag)>\s*",
    re.DOTALL,
)


def hidden_tests_passed(trajectory: Trajectory, task: Task) -> float | None:
    """The reward the environment gave the last answer (the share of hidden tests passed)."""
    if trajectory.stop_reason == "env_error":
        return None
    for turn in reversed(trajectory.turns):
        if turn.answer is not None:
            return float(turn.reward) if turn.reward is not None else 0.0
    return 0.0


def all_pass(trajectory: Trajectory, task: Task) -> float | None:
    """1.0 when the final answer passed every hidden test, else 0.0 (None as hidden_tests_passed)."""
    share = hidden_tests_passed(trajectory, task)
    return None if share is None else float(share == 1.0)


def action_tag(action: str) -> str | None:
    """ "run" or "answer" when the action is one well-formed block, else None."""
    match = _ACTION.fullmatch(action)
    if match is None or "```" in match.group("code") or not match.group("code").strip():
        return None
    return match.group("tag")


def code_format(trajectory: Trajectory, task: Task) -> float:
    """1.0 when every action is well formed, all but the last run code, the last
    answers, and no turn has an error; else 0.0."""
    turns = trajectory.turns
    if not turns or any(turn.error for turn in turns):
        return 0.0
    tags = [action_tag(turn.action) for turn in turns]
    return 1.0 if all(tag == "run" for tag in tags[:-1]) and tags[-1] == "answer" else 0.0
