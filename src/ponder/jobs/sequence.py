"""Training on a sequence of task families with a continual-learning method
(`continual.method`, ponder.train.continual_methods), and the accuracy matrix that
AA / BWT / FWT are computed from (ponder.eval.agent_metrics.forgetting_metrics).

Accuracy is teacher-forced, so one forward pass scores a family: an assistant turn
counts as right when the model's greedy (argmax) token equals the demonstration's
at every position of that turn, i.e. greedy decoding from that context would write
the turn exactly. Token accuracy (the share of assistant tokens predicted) is
reported beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ponder.config import ContinualConfig, SFTTrainerConfig
from ponder.data.format import TokenizedExample
from ponder.models.logprobs import position_ids_from_mask
from ponder.train.batch import collate
from ponder.train.continual_methods import ContinualMethod, build_method, resolve_method
from ponder.train.sft import SFTInputs, SFTTrainer


def turn_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of 1s in loss_mask (one run = one assistant turn)."""
    spans, start = [], None
    for index, value in enumerate(list(loss_mask) + [0]):
        if value and start is None:
            start = index
        elif not value and start is not None:
            spans.append((start, index))
            start = None
    return spans


@torch.no_grad()
def teacher_forced_counts(
    policy: Any, examples: list[TokenizedExample], micro_batch_size: int = 4
) -> dict[str, int]:
    """{"turns_right", "turns", "tokens_right", "tokens"} over the examples' assistant
    turns (see module doc): tallies, so groups scored apart (routed to different
    adapters) add up."""
    policy.model.eval()
    turns_right = turns = tokens_right = tokens = 0
    for start in range(0, len(examples), micro_batch_size):
        chunk = examples[start : start + micro_batch_size]
        batch = collate([e.to_trajectory() for e in chunk], policy.tokenizer.pad_token_id)
        ids, attention = batch.input_ids.to(policy.device), batch.attention_mask.to(policy.device)
        positions = position_ids_from_mask(attention)
        logits = policy.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False
        ).logits
        right = (logits[:, :-1].argmax(-1) == ids[:, 1:]).cpu()
        for row, example in enumerate(chunk):
            for begin, end in turn_spans(example.loss_mask):
                hits = right[row, begin - 1 : end - 1]  # position t predicts token t+1
                turns += 1
                turns_right += int(bool(hits.all()))
                tokens += len(hits)
                tokens_right += int(hits.sum())
    return {"turns_right": turns_right, "turns": turns, "tokens_right": tokens_right, "tokens": tokens}


def accuracies(counts: dict[str, int]) -> dict[str, float]:
    """{"turn_accuracy", "token_accuracy"} from teacher_forced_counts' tallies."""
    return {
        "turn_accuracy": counts.get("turns_right", 0) / max(1, counts.get("turns", 0)),
        "token_accuracy": counts.get("tokens_right", 0) / max(1, counts.get("tokens", 0)),
    }


def teacher_forced_accuracy(
    policy: Any, examples: list[TokenizedExample], micro_batch_size: int = 4
) -> dict[str, float]:
    """{"turn_accuracy", "token_accuracy"} over the examples' assistant turns (see module doc)."""
    return accuracies(teacher_forced_counts(policy, examples, micro_batch_size))


@dataclass
class Family:
    """One task family: its name, training examples and held-out examples."""

    name: str
    train: list[TokenizedExample]
    eval: list[TokenizedExample]


@dataclass
class SequenceResult:
    """accuracy[i][j]: family j after training on families 0..i; baseline[j]: before any;
    merged[j]: family j scored by the method's merged model (lora_per_task with
    continual.lora_merge), else empty."""

    families: list[str]
    accuracy: list[list[float]] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    token_accuracy: list[list[float]] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    method: str = ""
    merged: list[float] = field(default_factory=list)


def score_families(policy: Any, families: list[Family], method: ContinualMethod) -> list[dict[str, float]]:
    """Each family's held-out accuracies, as the method scores it (its adapter routing)."""
    counts = [method.score(policy, j, f.eval, teacher_forced_counts) for j, f in enumerate(families)]
    return [accuracies(c) for c in counts]


def train_sequence(
    policy: Any,
    families: list[Family],
    sft: SFTTrainerConfig,
    continual: ContinualConfig,
    run_dir: str | Path,
    seed: int = 0,
    say: Callable[[str], None] = print,
    method: ContinualMethod | None = None,
) -> SequenceResult:
    """Fine-tune on each family in turn (fresh optimizer each) with the method
    `continual` names (or `method`, built by the caller with build_method to read its
    state afterwards), scoring every family after each one."""
    run_dir = Path(run_dir)
    method = method or build_method(continual, seed, sft.micro_batch_size, run_dir)
    method.begin(policy)
    result = SequenceResult([f.name for f in families], method=resolve_method(continual))
    result.baseline = [s["turn_accuracy"] for s in score_families(policy, families, method)]
    for index, family in enumerate(families):
        method.start_family(policy, index)
        inputs = SFTInputs(family.train, **method.sft_inputs())
        trainer = SFTTrainer(
            policy,
            inputs,
            replace(sft, save_every=max(1, sft.steps)),
            run_dir / f"{index}-{family.name}",
            seed,
        )
        result.history += trainer.train()
        method.end_family(policy, index, family.train)
        scores = score_families(policy, families, method)
        result.accuracy.append([s["turn_accuracy"] for s in scores])
        result.token_accuracy.append([s["token_accuracy"] for s in scores])
        say(
            f"after {family.name}: "
            + ", ".join(f"{f.name}={s['turn_accuracy']:.3f}" for f, s in zip(families, scores))
        )
    merged = method.merged_policy(policy)
    if merged is not None:
        result.merged = [teacher_forced_accuracy(merged, f.eval)["turn_accuracy"] for f in families]
        say("merged: " + ", ".join(f"{f.name}={a:.3f}" for f, a in zip(families, result.merged)))
    return result
