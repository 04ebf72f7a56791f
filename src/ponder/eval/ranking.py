"""Ranking metrics for retrieval: recall@k, reciprocal rank, nDCG@k, averaged over queries.

Each query has a ranked list of ids (best first) and a set of relevant ids; relevance
is binary. A ranked list may repeat an id: only its first (best) position counts, so
a retriever cannot earn credit twice for one tool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _first_positions(ranked: Sequence[str], k: int | None = None) -> list[str]:
    """The ranked ids with later repeats removed, cut to the first `k` (all when None)."""
    seen: set[str] = set()
    unique = []
    for doc_id in ranked:
        if doc_id not in seen:
            seen.add(doc_id)
            unique.append(doc_id)
    return unique if k is None else unique[:k]


def recall_at_k(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """|relevant ∩ top-k| / |relevant|; nan when nothing is relevant (unscorable)."""
    if not relevant:
        return float("nan")
    return sum(doc_id in relevant for doc_id in _first_positions(ranked, k)) / len(relevant)


def reciprocal_rank(ranked: Sequence[str], relevant: set[str]) -> float:
    """1 / rank of the first relevant id (ranks count from 1); 0 when none is ranked."""
    if not relevant:
        return float("nan")
    for rank, doc_id in enumerate(_first_positions(ranked), start=1):
        if doc_id in relevant:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    """Binary-gain nDCG@k: sum of 1/log2(rank+1) over relevant hits in the top k, divided
    by the same sum for an ideal ranking (all relevant ids first)."""
    if not relevant:
        return float("nan")
    dcg = sum(
        1.0 / math.log2(rank + 1)
        for rank, doc_id in enumerate(_first_positions(ranked, k), start=1)
        if doc_id in relevant
    )
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(relevant), k) + 1))
    return dcg / ideal


def ranking_report(
    rankings: Sequence[Sequence[str]], relevant: Sequence[set[str]], ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """Means over queries of recall@k for each k, MRR and nDCG@10.

    Queries with no relevant id are left out of every mean; `queries` counts the rest.
    """
    if len(rankings) != len(relevant):
        raise ValueError(f"{len(rankings)} rankings but {len(relevant)} relevance sets")
    scored = [(r, rel) for r, rel in zip(rankings, relevant) if rel]
    report: dict[str, float] = {"queries": float(len(scored))}
    for k in ks:
        report[f"recall@{k}"] = _mean([recall_at_k(r, rel, k) for r, rel in scored])
    report["mrr"] = _mean([reciprocal_rank(r, rel) for r, rel in scored])
    report["ndcg@10"] = _mean([ndcg_at_k(r, rel, 10) for r, rel in scored])
    return report


PAIRED_METRICS = {"recall@5": lambda r, rel: recall_at_k(r, rel, 5), "mrr": reciprocal_rank}


def paired_difference(
    first: Sequence[Sequence[str]], second: Sequence[Sequence[str]], relevant: Sequence[set[str]],
) -> dict[str, dict[str, float]]:
    """Per query, first's metric minus second's, for recall@5 and reciprocal rank (MRR):
    the mean difference, its paired standard error (population sd / sqrt(n)) and how
    many queries went each way. Queries with no relevant id are left out."""
    if not len(first) == len(second) == len(relevant):
        raise ValueError(f"{len(first)} and {len(second)} rankings for {len(relevant)} relevance sets")
    scored = [(a, b, rel) for a, b, rel in zip(first, second, relevant) if rel]
    report = {}
    for name, metric in PAIRED_METRICS.items():
        diffs = [metric(a, rel) - metric(b, rel) for a, b, rel in scored]
        mean = _mean(diffs)
        spread = math.sqrt(_mean([(d - mean) ** 2 for d in diffs])) if diffs else float("nan")
        report[name] = {"mean": mean, "se": spread / math.sqrt(len(diffs)) if diffs else float("nan"),
                        "better": float(sum(d > 0 for d in diffs)), "worse": float(sum(d < 0 for d in diffs))}
    return report


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else float("nan")
