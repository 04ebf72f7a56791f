"""Retrieval records: documents, the corpus loader, hits and the Retriever protocol.

The corpus format is Search-R1's: one JSON object per line with a string `id` and
a string `contents` (for Wikipedia dumps the first line of `contents` is the
title). Any other keys are kept in `Document.metadata`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ponder.fileio import read_jsonl


class CorpusError(ValueError):
    """A corpus file that cannot be used; the message names the file and line."""


@dataclass
class Document:
    """One passage of the corpus."""

    id: str
    contents: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Hit:
    """One retrieved passage; higher `score` is better (its scale depends on the retriever)."""

    doc_id: str
    contents: str
    score: float


@runtime_checkable
class Retriever(Protocol):
    """Anything that maps a batch of queries to ranked passages."""

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """One list per query, best first, at most `topk` hits each."""
        ...


def load_corpus(path: str | os.PathLike[str]) -> list[Document]:
    """Read a Search-R1 style JSONL corpus; blank lines are skipped.

    Raises CorpusError naming the file (and the line, where there is one) for an
    unreadable file, a line that is not a JSON object, a missing or empty `id` or
    `contents`, non-string `contents`, a duplicate `id`, or a corpus with no documents.
    """
    name = os.fspath(path)
    docs: list[Document] = []
    first_line_of: dict[str, str] = {}
    for where, record in read_jsonl(name, CorpusError, "corpus"):
        doc = _document(where, record)
        if doc.id in first_line_of:
            raise CorpusError(f"{where}: duplicate id {doc.id!r} (first on line {first_line_of[doc.id]})")
        first_line_of[doc.id] = where.rsplit(":", 1)[1]
        docs.append(doc)
    if not docs:
        raise CorpusError(f"{name}: corpus is empty")
    return docs


def _document(where: str, record: Any) -> Document:
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    doc_id = record.pop("id", None)
    # Some corpora number their passages; an integer id is unambiguous, so accept it as text.
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise CorpusError(f"{where}: missing or empty 'id'")
    contents = record.pop("contents", None)
    if contents is None:
        raise CorpusError(f"{where}: missing 'contents' (document {doc_id!r})")
    if not isinstance(contents, str):
        raise CorpusError(
            f"{where}: 'contents' must be a string, got {type(contents).__name__} (document {doc_id!r})"
        )
    if not contents.strip():
        raise CorpusError(f"{where}: empty 'contents' (document {doc_id!r})")
    try:  # a lone-surrogate escape (\ud800-\udfff) decodes to half a character, which no tokenizer or UTF-8 file takes
        doc_id.encode("utf-8"), contents.encode("utf-8")
        if record:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise CorpusError(f"{where}: document {doc_id!r} holds a lone surrogate (a \\ud800-\\udfff escape)") from None
    return Document(doc_id, contents, record)


def _title_and_body(hit: Hit) -> tuple[str, str]:
    # Search-R1 corpora put the title on the first line of `contents`; a single-line
    # passage has no title, so its id stands in for one.
    first, _, rest = hit.contents.strip().partition("\n")
    if not rest.strip():
        return hit.doc_id, " ".join(first.split())
    return first.strip(), " ".join(rest.split())


def format_hits(hits: list[Hit]) -> str:
    """Render hits the way Search-R1 shows them to the policy, one passage per line.

    `Doc 1 (Title: <title>) <text>`: the title is the first line of the passage (its id
    when the passage is a single line) and the text is the rest, whitespace collapsed
    so that each passage stays on one line.
    """
    if not hits:
        return "No results found."
    lines = []
    for rank, hit in enumerate(hits, start=1):
        title, body = _title_and_body(hit)
        lines.append(f"Doc {rank} (Title: {title}) {body}".rstrip())
    return "\n".join(lines)
