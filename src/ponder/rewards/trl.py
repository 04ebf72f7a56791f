"""Reward functions written for TRL's GRPOTrainer, as ponder reward components.

TRL calls each of its `reward_funcs` on a batch as

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        -> list[float | None]

`prompts` are the dataset's `prompt` values as given (text, or a list of chat
messages); `completions` are the generated texts for a prompt-only (text) dataset and
one-message lists `[{"role": "assistant", "content": text}]` for a conversational
one; `completion_ids` the generated token ids; `columns` every other column of the
dataset, one list entry per completion. None means "not scorable here" (TRL: NaN).

`TRLReward(path)` is such a function named by import path, scoring one episode at a
time (a batch of one): the prompt and columns come from the task (what the TRL
reader, ponder.envs.formats, kept: metadata `prompt` and `columns`; for tasks of
another layout, the question, answers, kind and metadata), the completion from the
policy's actions. TRL's `trainer_state` is not passed (ponder has no TRL trainer): a
function must take `**kwargs`, as TRL requires anyway.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from ponder.plugins import import_object
from ponder.types import Task, Trajectory

SKIPPED_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL passes these as its own arguments


def trl_columns(task: Task) -> dict[str, Any]:
    """The dataset columns of `task` (other than prompt / completion), as TRL passes them."""
    if isinstance(task.metadata.get("columns"), dict):
        columns = dict(task.metadata["columns"])
    else:
        columns = {"id": task.id, "question": task.question, "answers": list(task.answers), "kind": task.kind,
                   **task.metadata}  # fmt: skip
    return {key: value for key, value in columns.items() if key not in SKIPPED_COLUMNS}


def trl_prompt(task: Task) -> Any:
    """The prompt as the dataset holds it: TRL's `prompt`, else the opening messages, else the question."""
    if "prompt" in task.metadata:
        return task.metadata["prompt"]
    return task.metadata.get("messages") or task.question


@dataclass(frozen=True)
class TRLReward:
    """A TRL-signature reward function (`module:function`) as a ponder reward component."""

    path: str

    @property
    def name(self) -> str:
        """The function's name: TRL logs each reward under it."""
        return getattr(self.function(), "__name__", self.path.rpartition(":")[2])

    def function(self) -> Any:
        found = import_object(self.path, "env.options.reward_funcs")
        if not callable(found):
            raise ValueError(f"env.options.reward_funcs '{self.path}': not callable")
        return found

    def __call__(self, trajectory: Trajectory, task: Task) -> float | None:
        prompt = trl_prompt(task)
        text = "".join(turn.action for turn in trajectory.turns)
        completion: Any = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        ids = [token for token, mask in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if mask]
        columns = {key: [value] for key, value in trl_columns(task).items()}
        scores = self.function()(prompts=[prompt], completions=[completion], completion_ids=[ids], **columns)
        if not isinstance(scores, (list, tuple)) or len(scores) != 1:
            raise ValueError(f"reward function {self.path} returned {type(scores).__name__} for one completion; "
                             "want a list of one float (TRL's signature)")  # fmt: skip
        score = scores[0]
        if score is None or (isinstance(score, float) and math.isnan(score)):
            return None
        if isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise ValueError(f"reward function {self.path} returned [{score!r}]; want a float or None")
        return float(score)
