"""Hybrid retrieval: fusing the rankings of several retrievers.

Two fusions, both weighted per retriever:

- reciprocal rank fusion (RRF, Cormack et al., 2009) uses only ranks, so it fuses
  retrievers whose scores live on different scales (BM25 sums, cosine similarities)
  without any calibration;
- a convex combination of min-max normalised scores (Bruch et al., 2023, "An Analysis
  of Fusion Functions for Hybrid Retrieval") also keeps how far apart the scores are,
  which RRF throws away: a dense retriever sure of its first hit keeps it first.
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
    weights = _checked_weights(weights, len(rankings))
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


def convex_combination(
    rankings: list[list[Hit]], topk: int | None = None, weights: list[float] | None = None,
) -> list[Hit]:
    """Fuse scored lists: score(d) = sum over lists i of w_i * (s_i(d) - lo_i) / (hi_i - lo_i).

    lo_i and hi_i are the lowest and highest score list i holds (its retriever's top
    `depth`), so each list's scores map onto [0, 1]; a document list i does not hold
    gets 0 from it, as its last entry does. When every score of a list is equal, each
    of its documents gets 1. `weights`: as in `reciprocal_rank_fusion`. A document
    listed twice in one ranking counts once, at its higher score (the lower one is
    dropped before lo_i is taken). Equal fused scores go by ascending doc id. The output does not
    change when a list's scores go through any increasing affine map (a*s + b, a > 0)
    nor with the order of the (ranking, weight) pairs.
    """
    weights = _checked_weights(weights, len(rankings))
    terms: dict[str, list[float]] = {}
    best: dict[str, tuple[float, str]] = {}
    for ranking, weight in zip(rankings, weights):
        scores: dict[str, float] = {}
        for hit in ranking:
            scores[hit.doc_id] = max(scores.get(hit.doc_id, -math.inf), hit.score)
        if not scores:
            continue
        low, high = min(scores.values()), max(scores.values())
        for hit in ranking:
            score = scores.pop(hit.doc_id, None)
            if score is None:
                continue  # a repeat, already counted at its higher score
            unit = 1.0 if high == low else (score - low) / (high - low)
            terms.setdefault(hit.doc_id, []).append(weight * unit)
            best[hit.doc_id] = min(best.get(hit.doc_id, (-unit, hit.contents)), (-unit, hit.contents))
    fused = [Hit(doc_id, best[doc_id][1], math.fsum(parts)) for doc_id, parts in terms.items()]
    fused.sort(key=lambda hit: (-hit.score, hit.doc_id))
    return fused if topk is None else fused[: max(topk, 0)]


def _checked_weights(weights: list[float] | None, rankings: int) -> list[float]:
    weights = [1.0] * rankings if weights is None else list(weights)
    if len(weights) != rankings:
        raise ValueError(f"{len(weights)} weights for {rankings} rankings")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and non-negative, got {weights}")
    return weights


FUSIONS = ("rrf", "convex")


class HybridRetriever:
    """Fusion of several retrievers' rankings: "rrf" (reciprocal rank fusion) or
    "convex" (a weighted sum of min-max normalised scores).

    Each retriever is asked for `depth` hits per query (at least `topk`); the fused
    hits carry the fused score, not any retriever's own score. `weights`: one vote
    weight per retriever, in the same order (None: equal votes). `k` is RRF's constant.
    """

    def __init__(self, retrievers: list[Retriever], k: int = 60, depth: int = 20,
                 weights: list[float] | None = None, fusion: str = "rrf") -> None:
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        if weights is not None and len(weights) != len(retrievers):
            raise ValueError(f"{len(weights)} weights for {len(retrievers)} retrievers")
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; valid: {', '.join(FUSIONS)}")
        self.retrievers = list(retrievers)
        self.k = k
        self.depth = depth
        self.weights = None if weights is None else list(weights)
        self.fusion = fusion

    @property
    def thread_safe(self) -> bool:
        """Concurrent searches are safe when they are safe in every fused retriever."""
        return all(getattr(retriever, "thread_safe", False) for retriever in self.retrievers)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top `topk` fused passages per query, best first."""
        depth = max(self.depth, topk)
        per_retriever = [retriever.search(queries, depth) for retriever in self.retrievers]
        return [
            fuse(self.fusion, [rankings[q] for rankings in per_retriever], topk, self.weights, self.k)
            for q in range(len(queries))
        ]


def fuse(method: str, rankings: list[list[Hit]], topk: int | None = None, weights: list[float] | None = None,
         k: int = 60) -> list[Hit]:
    """One query's rankings fused by `method` (one of FUSIONS); `k` is RRF's constant."""
    if method == "convex":
        return convex_combination(rankings, topk=topk, weights=weights)
    if method == "rrf":
        return reciprocal_rank_fusion(rankings, k=k, topk=topk, weights=weights)
    raise ValueError(f"unknown fusion {method!r}; valid: {', '.join(FUSIONS)}")
