"""Coreset selection of training examples: `random`, `loss_topk`, `diversity`
(k-center greedy on embeddings) and `hybrid` (the highest-loss share, then
k-center from those as the first centres).

Per-example metrics come from the current model (token-mean loss on the
assistant tokens), the token length and the lexical diversity (distinct / total
assistant tokens).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ponder.data.format import TokenizedExample
from ponder.data.records import Conversation
from ponder.models.forward import forward_policy
from ponder.registry import Registry
from ponder.train.batch import collate

#: selection.strategy -> choose(k, losses, embeddings, seed, loss_share) -> indices; traits:
#: what it reads (per-example losses, embeddings) and whether it selects at all (`none` keeps all)
STRATEGIES: Registry[Callable[..., list[int]]] = Registry(
    "selection strategy", {"needs_losses": False, "needs_embeddings": False, "selects": True}
)


def k_center_greedy(embeddings: np.ndarray, k: int, initial: list[int] | None = None) -> list[int]:
    """Farthest-point (k-center greedy, Gonzalez 1985) selection of k row indices.

    embeddings [N, D]. Starts from `initial` (or row 0), then repeatedly adds the row
    farthest (Euclidean) from every centre chosen so far; returns indices in the
    order chosen (the initial ones first). Ties go to the lowest index.
    """
    n = len(embeddings)
    k = min(k, n)
    chosen = list(dict.fromkeys(initial or [0]))[:k] if k > 0 else []
    if not chosen:
        return []
    points = np.asarray(embeddings, dtype=np.float64)
    distance = np.min(np.linalg.norm(points[:, None, :] - points[None, chosen, :], axis=-1), axis=1)
    while len(chosen) < k:
        best = int(np.argmax(distance))
        chosen.append(best)
        distance = np.minimum(distance, np.linalg.norm(points - points[best], axis=-1))
    return chosen


def select_indices(
    strategy: str, k: int, losses: list[float] | None = None, embeddings: np.ndarray | None = None,
    seed: int = 0, loss_share: float = 0.5,
) -> list[int]:  # fmt: skip
    """Indices of the k examples a strategy keeps (k ≥ N keeps all, in order)."""
    choose = STRATEGIES.get(strategy)
    n = len(losses) if losses is not None else len(embeddings) if embeddings is not None else 0
    if not STRATEGIES.trait(strategy, "selects") or k <= 0 or k >= n:
        return list(range(n))
    return choose(k, losses, embeddings, seed, loss_share)


@STRATEGIES.register("none", selects=False)
def keep_all(k: int, losses: Any, embeddings: Any, seed: int, loss_share: float) -> list[int]:
    return list(range(len(losses) if losses is not None else len(embeddings)))


@STRATEGIES.register("random")
def random_subset(k: int, losses: Any, embeddings: Any, seed: int, loss_share: float) -> list[int]:
    return sorted(random.Random(seed).sample(range(len(losses) if losses is not None else len(embeddings)), k))


@STRATEGIES.register("loss_topk", needs_losses=True)
def highest_loss(k: int, losses: Any, embeddings: Any, seed: int, loss_share: float) -> list[int]:
    return _by_loss(losses)[:k]


@STRATEGIES.register("diversity", needs_embeddings=True)
def most_diverse(k: int, losses: Any, embeddings: Any, seed: int, loss_share: float) -> list[int]:
    return k_center_greedy(embeddings, k, [int(np.argmax(np.linalg.norm(embeddings, axis=1)))])


@STRATEGIES.register("hybrid", needs_losses=True, needs_embeddings=True)
def loss_then_diverse(k: int, losses: Any, embeddings: Any, seed: int, loss_share: float) -> list[int]:
    return k_center_greedy(embeddings, k, _by_loss(losses)[: max(1, round(loss_share * k))])


def _by_loss(losses: list[float]) -> list[int]:
    return sorted(range(len(losses)), key=lambda i: (-losses[i], i))


@torch.no_grad()
def example_losses(policy: Any, examples: list[TokenizedExample], micro_batch_size: int = 4) -> list[float]:
    """Token-mean NLL of each example's assistant tokens under the current model."""
    losses: list[float] = []
    policy.model.eval()
    for start in range(0, len(examples), micro_batch_size):
        chunk = [e.to_trajectory() for e in examples[start : start + micro_batch_size]]
        batch = collate(chunk, policy.tokenizer.pad_token_id)
        ids, attention = batch.input_ids.to(policy.device), batch.attention_mask.to(policy.device)
        mask = batch.loss_mask.to(policy.device)
        logprobs, _, _ = forward_policy(policy.model, ids, attention, loss_mask=mask)
        losses += (-(logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    return losses


def lexical_diversity(example: TokenizedExample) -> float:
    """Distinct assistant tokens / assistant tokens (0 when there are none)."""
    tokens = [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    return len(set(tokens)) / len(tokens) if tokens else 0.0


def conversation_text(conversation: Conversation) -> str:
    return "\n".join(str(m.get("content") or "") for m in conversation.messages)


def embed_texts(texts: list[str], embedder: str = "minilm", dims: int = 256) -> np.ndarray:
    """[N, D] unit vectors: all-MiniLM-L6-v2 (`minilm`) or hashed bags of words (`hashing`)."""
    if embedder == "minilm":
        from ponder.tools.retrieval.dense import load_encoder

        return np.asarray(load_encoder("cpu").encode(texts, normalize_embeddings=True, batch_size=32))
    if embedder != "hashing":
        raise ValueError(f"unknown embedder '{embedder}'; valid: minilm, hashing")
    vectors = np.zeros((len(texts), dims))
    for row, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            vectors[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % dims] += 1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def select_coreset(
    policy: Any, conversations: list[Conversation], examples: list[TokenizedExample], cfg: Any, seed: int = 0
) -> tuple[list[int], dict[str, Any]]:
    """Indices kept by cfg (a SelectionConfig) and a report of the per-example metrics."""
    n = len(examples)
    if not STRATEGIES.trait(cfg.strategy, "selects") or cfg.target_size <= 0 or cfg.target_size >= n:
        return list(range(n)), {"strategy": cfg.strategy, "kept": n, "of": n}
    losses = example_losses(policy, examples) if STRATEGIES.trait(cfg.strategy, "needs_losses") else None
    embeddings = None
    if STRATEGIES.trait(cfg.strategy, "needs_embeddings"):
        embeddings = embed_texts([conversation_text(c) for c in conversations], cfg.embedder)
    if losses is None and embeddings is None:
        losses = [0.0] * n
    kept = select_indices(cfg.strategy, cfg.target_size, losses, embeddings, seed, cfg.hybrid_loss_share)
    if not kept:
        raise ValueError(f"selection '{cfg.strategy}' kept no example of {n}")
    report = {
        "strategy": cfg.strategy, "kept": len(kept), "of": n,
        "mean_tokens_kept": float(np.mean([len(examples[i].input_ids) for i in kept])),
        "mean_lexical_diversity_kept": float(np.mean([lexical_diversity(examples[i]) for i in kept])),
    }  # fmt: skip
    if losses is not None:
        report["mean_loss_kept"] = float(np.mean([losses[i] for i in kept]))
        report["mean_loss_all"] = float(np.mean(losses))
    return kept, report
