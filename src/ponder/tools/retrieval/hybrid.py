"""Hybrid retrieval: reciprocal rank fusion (Cormack et al., 2009) of several retrievers.

RRF uses only ranks, so it fuses retrievers whose scores live on different scales
(BM25 sums, cosine similarities) without any calibration.
"""

from __future__ import annotations

import math

from ponder.tools.retrieval.corpus import Hit, Retriever


def reciprocal_rank_fusion(
    rankings: list[list[Hit]], k: int = 60, topk: int | None = None, weights: list[float] | None = None,
) -> list[Hit]:
    """Fuse ranked lists: score(d) = sum over lists i containing d of w_i / (k + rank_i(d)).

    `rankings`: lists of hits, each best first; rank counts from 1. `weights`: one
    non-negative weight per ranking (None: all 1.0, plain RRF); a retriever known to be
    stronger gets a larger vote. A document listed twice in one ranking counts once, at
    its better rank. Returns at most `topk` hits (all when None), highest fused score
    first, equal scores by ascending doc id. The output does not depend on the order of
    the (ranking, weight) pairs: sums are exactly rounded (math.fsum) and the passage
    text kept is the one from the best-ranked mention.
    """
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and non-negative, got {weights}")
    terms: dict[str, list[float]] = {}
    best: dict[str, tuple[int, str]] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[str] = set()
        for rank, hit in enumerate(ranking, start=1):
            if hit.doc_id in seen:
                continue
            seen.add(hit.doc_id)
            terms.setdefault(hit.doc_id, []).append(weight / (k + rank))
            best[hit.doc_id] = min(best.get(hit.doc_id, (rank, hit.contents)), (rank, hit.contents))
    fused = [Hit(doc_id, best[doc_id][1], math.fsum(parts)) for doc_id, parts in terms.items()]
    fused.sort(key=lambda hit: (-hit.score, hit.doc_id))
    return fused if topk is None else fused[: max(topk, 0)]


class HybridRetriever:
    """Reciprocal rank fusion over the rankings of several retrievers.

    Each retriever is asked for `depth` hits per query (at least `topk`); the fused
    hits carry the RRF score, not any retriever's own score. `weights`: one vote weight
    per retriever, in the same order (None: equal votes).
    """

    def __init__(self, retrievers: list[Retriever], k: int = 60, depth: int = 20,
                 weights: list[float] | None = None) -> None:
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        if weights is not None and len(weights) != len(retrievers):
            raise ValueError(f"{len(weights)} weights for {len(retrievers)} retrievers")
        self.retrievers = list(retrievers)
        self.k = k
        self.depth = depth
        self.weights = None if weights is None else list(weights)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top `topk` fused passages per query, best first."""
        depth = max(self.depth, topk)
        per_retriever = [retriever.search(queries, depth) for retriever in self.retrievers]
        return [
            reciprocal_rank_fusion([rankings[q] for rankings in per_retriever], k=self.k, topk=topk,
                                   weights=self.weights)
            for q in range(len(queries))
        ]
