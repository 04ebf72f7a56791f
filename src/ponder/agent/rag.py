"""Retrieval-augmented generation over local documents, as a tool with provenance.

`RagIndex.from_paths` ingests files and folders (see `rag_ingest`) into the retrieval
stack rollouts use: BM25 and dense (all-MiniLM-L6-v2) fused by reciprocal rank
fusion. The `rag_search` tool returns JSON in which every hit names its source, its
page or row, and a snippet; `provenance(state)` collects those hits from a finished
run, so an answer can be shown with the passages it was built on.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from ponder.agent.rag_ingest import IngestReport, ingest
from ponder.agent.state import AgentState
from ponder.tools.base import Tool
from ponder.tools.builtin import QUERY_PARAMETERS
from ponder.tools.retrieval import BM25Retriever, DenseRetriever, Document, HybridRetriever, Retriever
from ponder.types import ToolSpec

RAG_TOOL = "rag_search"
_LOCATION_KEYS = ("page", "row", "table", "section", "chunk")


@dataclass
class Provenance:
    """Where a passage came from: document id, source file, page/row when known, and a snippet."""

    id: str
    source: str
    snippet: str
    score: float
    page: int | None = None
    row: int | None = None
    table: int | None = None
    section: str | None = None
    chunk: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


class RagIndex:
    """Passages from local documents behind one retriever; see module docstring.

    `kind`: "hybrid" (BM25 + dense, RRF; the default), "bm25" or "dense".
    """

    def __init__(self, documents: list[Document], kind: str = "hybrid", report: IngestReport | None = None,
                 encoder: Any = None, snippet_chars: int = 400) -> None:
        if not documents:
            raise ValueError("no passages to index: every document was empty or unreadable")
        self.documents = documents
        self.report = report or IngestReport(documents=documents)
        self.snippet_chars = snippet_chars
        self.retriever = _retriever(documents, kind, encoder)
        self._by_id = {d.id: d for d in documents}

    @classmethod
    def from_paths(cls, paths: list[str | os.PathLike[str]], kind: str = "hybrid", chunk_chars: int = 800,
                   overlap: int = 150, encoder: Any = None) -> RagIndex:
        """Ingest files and folders; unreadable ones are skipped and listed in `report.errors`."""
        report = ingest(paths, chunk_chars, overlap)
        if not report.documents:
            reasons = "; ".join(f"{path}: {message}" for path, message in report.errors[:3]) or "no files"
            raise ValueError(f"no passages to index ({reasons})")
        return cls(report.documents, kind, report, encoder)

    def search(self, query: str, k: int = 3) -> list[Provenance]:
        """The `k` best passages for `query`, best first, each with its provenance."""
        hits = self.retriever.search([query], k)[0]
        found = []
        for hit in hits:
            metadata = self._by_id[hit.doc_id].metadata
            location = {key: metadata[key] for key in _LOCATION_KEYS if key in metadata}
            snippet = " ".join(hit.contents.split())[: self.snippet_chars]
            found.append(Provenance(hit.doc_id, metadata.get("source", hit.doc_id), snippet, round(hit.score, 6), **location))
        return found

    def as_tool(self, k: int = 3, name: str = RAG_TOOL) -> Tool:
        """A tool returning {"results": [provenance…]} as JSON for the model to read and cite."""

        def run(query: str) -> str:
            results = [p.to_dict() for p in self.search(query, k)]
            return json.dumps({"results": results}, ensure_ascii=False)

        sources = ", ".join(self.report.sources[:5]) + (" …" if len(self.report.sources) > 5 else "")
        spec = ToolSpec(
            name=name,
            description=f"Search the local documents ({sources}) and return passages with their source, page or row.",
            parameters=dict(QUERY_PARAMETERS),
        )
        return Tool(spec, run, isolation="thread")  # the index lives in this process


def _retriever(documents: list[Document], kind: str, encoder: Any) -> Retriever:
    if kind == "bm25":
        return BM25Retriever(documents)
    if kind == "dense":
        return DenseRetriever(documents, model=encoder)
    if kind == "hybrid":
        return HybridRetriever([BM25Retriever(documents), DenseRetriever(documents, model=encoder)])
    raise ValueError(f"unknown retriever kind {kind!r} (valid: hybrid, bm25, dense)")


def provenance(state: AgentState, tool_name: str = RAG_TOOL) -> list[dict[str, Any]]:
    """Every passage the RAG tool showed the model during the run, in order, without repeats."""
    seen: set[str] = set()
    found: list[dict[str, Any]] = []
    for turn in state.turns:
        for call, result in zip(turn.tool_calls, turn.tool_results):
            if call.name != tool_name or result.is_error:
                continue
            try:
                results = json.loads(result.content).get("results", [])
            except (json.JSONDecodeError, AttributeError):
                continue  # cut by max_observation_chars: not JSON any more
            for item in results:
                if isinstance(item, dict) and item.get("id") not in seen:
                    seen.add(item.get("id"))
                    found.append(item)
    return found
