"""A reward function in TRL's GRPOTrainer signature, for recipes/verified_qa_trl.yaml:
`reward_funcs(prompts, completions, **columns) -> list[float]`, keyed on the dataset's
`answer` column. The same function runs under TRL unchanged:

    GRPOTrainer(model=..., reward_funcs=gsm8k_accuracy, train_dataset=load_dataset("parquet", ...))

It reads the final answer the way GSM8K's graders do (the number after the last
`####`) and pays 1.0 when it equals the gold number, else 0.0.
"""

from __future__ import annotations

import re

_FINAL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


def _number(text: str) -> float | None:
    found = _FINAL.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_accuracy(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 for a completion whose `#### N` equals its row's `answer`, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[0]["content"] if isinstance(completion, list) else completion  # conversational or not
        value = _number(text)
        rewards.append(1.0 if value is not None and abs(value - float(gold)) < 1e-6 else 0.0)
    return rewards
