"""Training on a sequence of task families, and the accuracy matrix that AA / BWT /
FWT are computed from (ponder.eval.agent_metrics.forgetting_metrics).

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
from ponder.train.continual import EWCState, ReservoirBuffer
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
def teacher_forced_accuracy(
    policy: Any, examples: list[TokenizedExample], micro_batch_size: int = 4
) -> dict[str, float]:
    """{"turn_accuracy", "token_accuracy"} over the examples' assistant turns (see module doc)."""
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
    return {"turn_accuracy": turns_right / max(1, turns), "token_accuracy": tokens_right / max(1, tokens)}


@dataclass
class Family:
    """One task family: its name, training examples and held-out examples."""

    name: str
    train: list[TokenizedExample]
    eval: list[TokenizedExample]


@dataclass
class SequenceResult:
    """accuracy[i][j]: family j after training on families 0..i; baseline[j]: before any."""

    families: list[str]
    accuracy: list[list[float]] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    token_accuracy: list[list[float]] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)


def train_sequence(
    policy: Any,
    families: list[Family],
    sft: SFTTrainerConfig,
    continual: ContinualConfig,
    run_dir: str | Path,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> SequenceResult:
    """Fine-tune on each family in turn (fresh optimizer each), with replay and/or EWC
    as `continual` says, scoring every family after each one."""
    run_dir = Path(run_dir)
    replay = ReservoirBuffer(continual.replay_capacity, seed) if continual.replay_capacity > 0 else None
    ewc = EWCState(continual.ewc_lambda) if continual.ewc_lambda > 0 else None
    result = SequenceResult([f.name for f in families])
    scores = [teacher_forced_accuracy(policy, f.eval) for f in families]
    result.baseline = [s["turn_accuracy"] for s in scores]
    for index, family in enumerate(families):
        inputs = SFTInputs(family.train, replay=replay, replay_ratio=continual.replay_ratio, ewc=ewc)
        trainer = SFTTrainer(
            policy,
            inputs,
            replace(sft, save_every=max(1, sft.steps)),
            run_dir / f"{index}-{family.name}",
            seed,
        )
        result.history += trainer.train()
        scores = [teacher_forced_accuracy(policy, f.eval) for f in families]
        result.accuracy.append([s["turn_accuracy"] for s in scores])
        result.token_accuracy.append([s["token_accuracy"] for s in scores])
        say(
            f"after {family.name}: "
            + ", ".join(f"{f.name}={s['turn_accuracy']:.3f}" for f, s in zip(families, scores))
        )
        if replay is not None:
            replay.extend(family.train)
        if ewc is not None:
            ewc.consolidate(policy, family.train[: continual.fisher_examples])
    return result
