"""Retrieval for search environments: corpora, BM25 / dense / hybrid retrievers, HTTP.

Heavy libraries (bm25s, sentence-transformers, faiss, httpx) are imported when a
retriever is built, so importing this package stays fast. The HTTP server lives in
`ponder.tools.retrieval.server` (it imports FastAPI and uvicorn at import time).
"""

from __future__ import annotations

from collections.abc import Callable

from ponder.registry import Registry
from ponder.tools.retrieval.bm25 import BM25Retriever
from ponder.tools.retrieval.client import HttpRetriever, RetrievalError
from ponder.tools.retrieval.corpus import CorpusError, Document, Hit, Retriever, format_hits, load_corpus
from ponder.tools.retrieval.dense import DenseRetriever, load_encoder
from ponder.tools.retrieval.hybrid import FUSIONS, HybridRetriever, convex_combination, reciprocal_rank_fusion

#: retriever kind -> build(docs, url, timeout_s, retries); trait `needs_docs`
RETRIEVER_KINDS: Registry[Callable[..., Retriever]] = Registry("retriever kind", {"needs_docs": True})


@RETRIEVER_KINDS.register("bm25")
def _bm25(docs: list[Document], url: str | None, timeout_s: float, retries: int) -> Retriever:
    return BM25Retriever(docs)


@RETRIEVER_KINDS.register("dense")
def _dense(docs: list[Document], url: str | None, timeout_s: float, retries: int) -> Retriever:
    return DenseRetriever(docs)


@RETRIEVER_KINDS.register("hybrid")
def _hybrid(docs: list[Document], url: str | None, timeout_s: float, retries: int) -> Retriever:
    return HybridRetriever([BM25Retriever(docs), DenseRetriever(docs)])


@RETRIEVER_KINDS.register("http", needs_docs=False)
def _http(docs: list[Document] | None, url: str | None, timeout_s: float, retries: int) -> Retriever:
    if not url:
        raise ValueError("retriever kind 'http' needs a url (e.g. http://127.0.0.1:8000)")
    return HttpRetriever(url, timeout_s=timeout_s, retries=retries)


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
    build = RETRIEVER_KINDS.get(kind)
    if RETRIEVER_KINDS.trait(kind, "needs_docs") and not docs:
        raise ValueError(f"retriever kind {kind!r} needs a non-empty list of documents")
    return build(docs, url, timeout_s, retries)


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
