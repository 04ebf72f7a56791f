"""Contrastive fine-tuning of the dense tool encoder (sentence-transformers, CPU in minutes).

Each example is (query, the tool that answers it, mined hard negatives). The loss is
sentence-transformers' MultipleNegativesRankingLoss: a softmax over cosine similarities
in which every other tool in the batch (in-batch negatives) and the mined negatives
compete with the positive. Batches never hold one tool twice as a positive, since a
copy of the positive would count as a negative of itself.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ponder.extras import require
from ponder.fileio import write_json_atomic
from ponder.tools.retrieval.toolindex import load_tool_encoder

logger = logging.getLogger(__name__)


@dataclass
class ContrastiveConfig:
    """Settings of `ponder tools train`.

    epochs: passes over the training examples.
    batch_size: examples per step; each brings its positive and hard negatives, and
        every other example's tools are in-batch negatives.
    learning_rate: AdamW peak rate, reached after a linear warm-up, then linear decay.
    warmup_fraction: share of the steps spent warming up.
    hard_negatives: mined negatives per example (0 = in-batch negatives only).
    mine_depth: how many BM25 hits per query are searched for hard negatives.
    max_seq_length: token limit of texts while training (tool texts are cut).
    scale: MultipleNegativesRankingLoss's inverse temperature on cosine similarities.
    max_steps: stop after this many steps (0 = no limit); for smoke tests.
    seed: example order and batching.
    """

    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    hard_negatives: int = 1
    mine_depth: int = 10
    max_seq_length: int = 64
    scale: float = 20.0
    max_steps: int = 0
    seed: int = 0


@dataclass
class ContrastiveExample:
    """One training row: a query, the answering tool's text and hard-negative tool texts."""

    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    positive_id: str = ""


def mine_examples(
    pairs: list[tuple[str, set[str]]],
    texts: dict[str, str],
    rank: Callable[[list[str], int], list[list[str]]],
    config: ContrastiveConfig,
) -> list[ContrastiveExample]:
    """One example per (query, relevant tool); negatives are the best-ranked tools that
    do not answer the query. `rank(queries, k)` gives tool names best first (BM25 over the
    training tools); `texts` maps every tool name that may appear to its indexed text.
    """
    ranked = rank([query for query, _ in pairs], config.mine_depth) if config.hard_negatives else [[]] * len(pairs)
    examples = []
    for (query, relevant), hits in zip(pairs, ranked):
        negatives = [texts[name] for name in hits if name not in relevant and name in texts][: config.hard_negatives]
        if config.hard_negatives and len(negatives) < config.hard_negatives:
            continue  # every row of a batch needs the same number of columns
        for name in sorted(relevant):
            if name in texts:
                examples.append(ContrastiveExample(query, texts[name], negatives, name))
    return examples


def batches_without_duplicates(examples: list[ContrastiveExample], batch_size: int, seed: int) -> list[list[ContrastiveExample]]:
    """Shuffled batches in which no tool is the positive twice (greedy first fit)."""
    order = list(examples)
    random.Random(seed).shuffle(order)
    batches: list[list[ContrastiveExample]] = []
    open_batches: list[tuple[list[ContrastiveExample], set[str]]] = []
    for example in order:
        for batch, names in open_batches:
            if example.positive_id not in names and len(batch) < batch_size:
                batch.append(example)
                names.add(example.positive_id)
                break
        else:
            open_batches.append(([example], {example.positive_id}))
        full = [entry for entry in open_batches if len(entry[0]) >= batch_size]
        batches.extend(batch for batch, _ in full)
        open_batches = [entry for entry in open_batches if len(entry[0]) < batch_size]
    batches.extend(batch for batch, _ in open_batches if len(batch) > 1)
    return batches


def _features(model: Any, texts: list[str]) -> dict[str, Any]:
    features = model.tokenize(texts)
    return {key: value.to(model.device) if hasattr(value, "to") else value for key, value in features.items()}


def contrastive_step(model: Any, loss_fn: Any, batch: list[ContrastiveExample]) -> Any:
    """The MultipleNegativesRankingLoss of one batch (a scalar tensor, graph attached)."""
    columns = [[e.query for e in batch], [e.positive for e in batch]]
    for position in range(len(batch[0].negatives)):
        columns.append([e.negatives[position] for e in batch])
    return loss_fn([_features(model, column) for column in columns], None)


@dataclass
class TrainResult:
    """What training did: loss per step, seconds, examples and steps."""

    losses: list[float]
    seconds: float
    examples: int
    steps: int


def train_encoder(
    examples: list[ContrastiveExample], config: ContrastiveConfig, encoder: Any = None,
    on_step: Callable[[int, int, float], None] | None = None,
) -> tuple[Any, TrainResult]:
    """Fine-tune `encoder` (default: the packaged all-MiniLM-L6-v2, a fresh copy) in place."""
    import torch

    losses = require("sentence_transformers.sentence_transformer.losses", "retrieval", "encoder training")
    MultipleNegativesRankingLoss = losses.MultipleNegativesRankingLoss

    if not examples:
        raise ValueError("contrastive training needs at least one example")
    model = _fresh_copy(load_tool_encoder(encoder))
    limit = model.max_seq_length
    model.max_seq_length = min(limit, config.max_seq_length)
    torch.manual_seed(config.seed)
    loss_fn = MultipleNegativesRankingLoss(model, scale=config.scale)
    plan = [b for epoch in range(config.epochs) for b in batches_without_duplicates(examples, config.batch_size, config.seed + epoch)]
    if config.max_steps:
        plan = plan[: config.max_steps]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    warmup = max(1, int(config.warmup_fraction * len(plan)))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (len(plan) - step) / max(1, len(plan) - warmup)))
    )
    model.train()
    losses, started = [], time.perf_counter()
    for step, batch in enumerate(plan):
        loss = contrastive_step(model, loss_fn, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, len(plan), losses[-1])
    model.eval()
    model.max_seq_length = limit
    return model, TrainResult(losses, time.perf_counter() - started, len(examples), len(plan))


def _fresh_copy(model: Any) -> Any:
    """A deep copy, so training never changes the process-wide cached base encoder."""
    import copy

    clone = copy.deepcopy(model)
    clone.ponder_source = getattr(model, "ponder_source", "")
    return clone


def save_encoder(model: Any, out: str | Path, result: TrainResult, config: ContrastiveConfig, extra: dict[str, Any]) -> Path:
    """The fine-tuned encoder as a sentence-transformers directory, with train_log.json."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    model.save(str(directory))
    log = {"config": asdict(config), **asdict(result), **extra}
    write_json_atomic(directory / "train_log.json", log, sort_keys=False)
    return directory
