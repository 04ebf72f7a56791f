"""Sparse retrieval: BM25 over the corpus with bm25s."""

from __future__ import annotations

import numpy as np

from ponder.tools.retrieval.corpus import Document, Hit


def _tokenize(texts: list[str]) -> list[list[str]]:
    """Lower-cased word tokens with English stopwords removed and no stemming.

    Stemming is off so that results do not depend on an optional stemmer package
    being installed; corpus and queries must go through this same function.
    """
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=None, return_ids=False, show_progress=False)


def top_indices(scores: np.ndarray, topk: int) -> np.ndarray:
    """Indices of the `topk` highest positive scores, best first, ties by lower index.

    Selection is O(n) (partition) and only the candidates are sorted, so this stays
    cheap on large corpora while the order never depends on a sort's tie handling.
    """
    n = scores.shape[0]
    k = min(topk, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth_best = np.partition(scores, n - k)[n - k]
        candidates = np.flatnonzero(scores >= kth_best)
    else:
        candidates = np.arange(n)
    # BM25 (Lucene idf) is positive exactly when a query term occurs in the passage;
    # zero-score passages share no term with the query, so they are not results.
    candidates = candidates[scores[candidates] > 0]
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order][:k]


class BM25Retriever:
    """BM25 (bm25s, Lucene variant) over an in-memory corpus.

    Passages that share no term with the query are not returned, as in Lucene, so a
    query may get fewer than `topk` hits.
    """

    # A search only reads the index (bm25s score arrays, its vocabulary dict) and builds
    # its own token lists, so the retrieval server may run searches concurrently.
    thread_safe = True

    def __init__(self, docs: list[Document], k1: float = 1.5, b: float = 0.75) -> None:
        import bm25s

        if not docs:
            raise ValueError("BM25Retriever needs at least one document")
        self.docs = list(docs)
        self._index = bm25s.BM25(k1=k1, b=b)
        self._index.index(_tokenize([d.contents for d in self.docs]), show_progress=False)

    def _scores(self, query: str) -> np.ndarray:
        # Unknown words are dropped; bm25s marks an all-stopword text with an empty
        # token, which carries no evidence either.
        tokens = [token for token in _tokenize([query])[0] if token]
        token_ids = self._index.get_tokens_ids(tokens)
        if not token_ids:
            return np.zeros(len(self.docs), dtype=np.float32)
        return self._index.get_scores_from_ids(token_ids)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top `topk` passages per query by BM25 score, best first."""
        results = []
        for query in queries:
            scores = self._scores(query)
            best = top_indices(scores, topk)
            results.append([Hit(self.docs[i].id, self.docs[i].contents, float(scores[i])) for i in best])
        return results
