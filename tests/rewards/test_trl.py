"""TRL-signature reward functions as ponder reward components (ponder.rewards.trl):
called the way TRL's GRPOTrainer calls them — prompts as the dataset holds them,
completions as text (prompt-only) or one-message lists (conversational), the
completion's token ids, every other column as a keyword list."""

from __future__ import annotations

import pytest

from ponder.rewards.trl import TRLReward, trl_columns, trl_prompt
from ponder.types import Task, Trajectory, Turn

CALLS: list[dict] = []


def accuracy(prompts, completions, solution, **kwargs):
    """A reward as TRL's docs write them: one float per completion, keyed on a column."""
    CALLS.append({"prompts": prompts, "completions": completions, "solution": solution, **kwargs})
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if text.strip().endswith(gold) else 0.0 for text, gold in zip(texts, solution, strict=True)]


def unscorable(prompts, completions, **kwargs):
    return [None for _ in completions]


def two_scores(prompts, completions, **kwargs):
    return [1.0, 2.0]


def _episode(text: str) -> Trajectory:
    # two policy tokens, one environment token (loss_mask 0) that TRL never sees
    return Trajectory("t", [1], [5, 6, 7], [1, 1, 0], [0.0] * 3, turns=[Turn(0, text)])


def test_a_prompt_only_dataset_passes_text():
    CALLS.clear()
    task = Task("row-1", "What is 6 * 7?", ["42"],
                metadata={"prompt": "What is 6 * 7?", "columns": {"solution": "42", "source": "mine"}})  # fmt: skip
    reward = TRLReward(f"{__name__}:accuracy")
    assert reward.name == "accuracy"
    assert reward(_episode("It is 42"), task) == 1.0 and reward(_episode("It is 41"), task) == 0.0
    assert CALLS[0] == {"prompts": ["What is 6 * 7?"], "completions": ["It is 42"], "solution": ["42"],
                        "source": ["mine"], "completion_ids": [[5, 6]]}  # fmt: skip


def test_a_conversational_dataset_passes_message_lists():
    CALLS.clear()
    prompt = [{"role": "user", "content": "What is 6 * 7?"}]
    task = Task("row-1", "What is 6 * 7?", ["42"], metadata={"prompt": prompt, "messages": prompt,
                                                            "columns": {"solution": "42"}})  # fmt: skip
    assert TRLReward(f"{__name__}:accuracy")(_episode("#### 42"), task) == 1.0
    assert CALLS[0]["prompts"] == [prompt]
    assert CALLS[0]["completions"] == [[{"role": "assistant", "content": "#### 42"}]]


def test_tasks_of_other_layouts_pass_their_fields_as_columns():
    task = Task("q1", "What is 6 * 7?", ["42"], kind="level1", metadata={"level": 1})
    assert trl_prompt(task) == "What is 6 * 7?"
    assert trl_columns(task) == {"id": "q1", "question": "What is 6 * 7?", "answers": ["42"], "kind": "level1",
                                 "level": 1}  # fmt: skip
    verl = Task("0", "q?", ["42"], metadata={"messages": [{"role": "user", "content": "q?"}],
                                            "columns": {"reward_model": {"ground_truth": "42"}}})  # fmt: skip
    assert trl_prompt(verl) == [{"role": "user", "content": "q?"}]
    assert trl_columns(verl) == {"reward_model": {"ground_truth": "42"}}


def test_none_is_unscorable_and_a_wrong_shape_is_refused():
    task = Task("t", "q?", [], metadata={"prompt": "q?", "columns": {}})
    assert TRLReward(f"{__name__}:unscorable")(_episode("x"), task) is None
    with pytest.raises(ValueError, match="returned list for one completion; want a list of one float"):
        TRLReward(f"{__name__}:two_scores")(_episode("x"), task)
    with pytest.raises(ValueError, match="has no attribute 'absent'"):
        TRLReward(f"{__name__}:absent").name
