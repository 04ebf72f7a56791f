"""Retrieval for search environments: corpora, BM25 / dense / hybrid retrievers, HTTP.

Heavy libraries (bm25s, sentence-transformers, faiss, httpx) are imported when a
retriever is built, so importing this package stays fast. The HTTP server lives in
`ponder.tools.retrieval.server` (it imports FastAPI and uvicorn at import time).
"""

from __future__ import annotations

from ponder.tools.retrieval.bm25 import BM25Retriever
from ponder.tools.retrieval.client import HttpRetriever, RetrievalError
from ponder.tools.retrieval.corpus import CorpusError, Document, Hit, Retriever, format_hits, load_corpus
from ponder.tools.retrieval.dense import DenseRetriever, load_encoder
from ponder.tools.retrieval.hybrid import FUSIONS, HybridRetriever, convex_combination, reciprocal_rank_fusion

RETRIEVER_KINDS = ("bm25", "dense", "hybrid", "http")


def build_retriever(
    kind: str,
    docs: list[Document] | None,
    url: str | None = None,
    timeout_s: float = 5.0,
    retries: int = 2,
) -> Retriever:
    """A retriever by name: "bm25", "dense", "hybrid" (BM25 + dense, fused by RRF) over
    `docs`, or "http" (a retrieval server at `url`; `timeout_s` and `retries` apply to it).
    """
    if kind not in RETRIEVER_KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; valid kinds: {', '.join(RETRIEVER_KINDS)}")
    if kind == "http":
        if not url:
            raise ValueError("retriever kind 'http' needs a url (e.g. http://127.0.0.1:8000)")
        return HttpRetriever(url, timeout_s=timeout_s, retries=retries)
    if not docs:
        raise ValueError(f"retriever kind {kind!r} needs a non-empty list of documents")
    if kind == "bm25":
        return BM25Retriever(docs)
    if kind == "dense":
        return DenseRetriever(docs)
    return HybridRetriever([BM25Retriever(docs), DenseRetriever(docs)])


__all__ = [
    "RETRIEVER_KINDS",
    "BM25Retriever",
    "CorpusError",
    "DenseRetriever",
    "Document",
    "Hit",
    "HttpRetriever",
    "FUSIONS",
    "HybridRetriever",
    "RetrievalError",
    "Retriever",
    "build_retriever",
    "format_hits",
    "load_corpus",
    "load_encoder",
    "convex_combination",
    "reciprocal_rank_fusion",
]
