"""Retrieval over tools: ToolSpecs as documents, searched by BM25, dense or hybrid retrievers.

A tool is indexed as one text: its name (split into words), description and parameter
names, types and descriptions. The retrievers are the corpus retrievers of this
package (bm25s, all-MiniLM-L6-v2 + faiss, rank or score fusion) with the tool name
as the document id, so ranked ids are tool names.

An index can be saved and loaded. The saved metadata names the encoder's fingerprint
(a hash of its weights); loading with a different encoder is refused, since its
embeddings would live in another space than the queries'.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import numpy as np

from ponder.extras import require
from ponder.fileio import write_json_atomic, write_text_atomic
from ponder.tools.retrieval.bm25 import BM25Retriever
from ponder.tools.retrieval.corpus import Document, Hit
from ponder.tools.retrieval.dense import DENSE_FEATURE, DenseRetriever, encoder_path
from ponder.tools.retrieval.hybrid import FUSIONS, HybridRetriever
from ponder.types import ToolSpec

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

TOOL_RETRIEVER_KINDS = ("bm25", "dense", "hybrid")
INDEX_FORMAT = 1
# Written by `ponder tools train` next to the encoder: the hybrid's fusion and dense
# vote weight, chosen on validation tools (see eval/tool_retrieval.py).
FUSION_FILE = "fusion.json"


@dataclass(frozen=True)
class Fusion:
    """How the hybrid fuses BM25's and the dense ranking: `method` one of FUSIONS,
    the dense ranking's weight against BM25's 1."""

    method: str = "rrf"
    dense_weight: float = 1.0

    def __str__(self) -> str:
        return f"{self.method}, dense weight {self.dense_weight:g}"
# Types some schema dialects (BFCL's among them) use, and their JSON Schema names.
_TYPE_ALIASES = {
    "dict": "object", "float": "number", "double": "number", "long": "integer", "int": "integer",
    "tuple": "array", "list": "array", "bool": "boolean", "str": "string", "char": "string",
    "byte": "integer", "short": "integer", "hashmap": "object", "map": "object",
}
_JSON_TYPES = {"object", "number", "integer", "array", "boolean", "string", "null"}


class ToolIndexError(ValueError):
    """A tool index that cannot be built or loaded; the message says why, in one line."""


def _normalise_type(node: dict[str, Any]) -> None:
    declared = node.get("type")
    if isinstance(declared, str):
        mapped = _TYPE_ALIASES.get(declared.lower(), declared.lower())
        if mapped in _JSON_TYPES:
            node["type"] = mapped
        else:  # "any", or a language's class name ("ArrayList", "Element"): no constraint
            node.pop("type")
            node.setdefault("x-original-type", declared)


def _normalise_node(node: Any) -> Any:
    """A copy of a schema node with dialect types mapped, recursively."""
    if isinstance(node, list):
        return [_normalise_node(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _normalise_node(value) for key, value in node.items()}
    _normalise_type(out)
    if isinstance(out.get("properties"), dict) and "type" not in out:
        out["type"] = "object"
    required = out.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        out.pop("required")
    return out


def normalise_parameters(parameters: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(JSON Schema of a tool's arguments, None) or (None, why it was skipped).

    Dialect types ("dict", "float", "tuple", Java classes) become JSON Schema types or
    no constraint; a `required` list that is not a list of names is dropped. A schema
    that is still not valid JSON Schema (Draft 7), or not an object schema, is skipped.
    """
    if parameters is None:
        return {"type": "object", "properties": {}}, None
    if not isinstance(parameters, dict):
        return None, f"parameters is a {type(parameters).__name__}, not an object"
    schema = _normalise_node(parameters)
    schema.setdefault("type", "object")
    if schema["type"] != "object":
        return None, f"parameters has type {schema['type']!r}, not 'object'"
    try:
        jsonschema.Draft7Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return None, f"not valid JSON Schema: {exc.message}"
    return schema, None


def _name_words(name: str) -> str:
    """`math.factorial` → "math factorial", `getUserInfo` → "get User Info"."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return " ".join(part for part in re.split(r"[._\-/\s]+", spaced) if part)


def tool_text(spec: ToolSpec) -> str:
    """What is indexed for a tool: name words, description, then each parameter."""
    parts = [_name_words(spec.name) + ".", spec.description.strip()]
    properties = spec.parameters.get("properties") or {}
    if isinstance(properties, dict) and properties:
        described = []
        for name, schema in properties.items():
            schema = schema if isinstance(schema, dict) else {}
            kind = schema.get("type") or schema.get("x-original-type") or "any"
            text = str(schema.get("description") or "").strip().rstrip(".")
            described.append(f"{_name_words(name)} ({kind}){': ' + text if text else ''}")
        parts.append("Parameters: " + "; ".join(described) + ".")
    return " ".join(part for part in parts if part)


def tool_documents(specs: list[ToolSpec]) -> list[Document]:
    """One Document per tool, id = tool name; names must be unique."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ToolIndexError(f"tool name {spec.name!r} appears twice; tool names must be unique in an index")
        seen.add(spec.name)
    return [Document(spec.name, tool_text(spec)) for spec in specs]


def encoder_fingerprint(model: SentenceTransformer) -> str:
    """A short hash of the encoder's weights: equal weights, equal fingerprint."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def truncate_query(query: str, model: SentenceTransformer) -> tuple[str, str | None]:
    """The query cut to the encoder's token limit, and a note when it was cut."""
    limit = int(model.max_seq_length) - 2  # [CLS] and [SEP]
    tokenizer = model.tokenizer
    ids = tokenizer(query, add_special_tokens=False)["input_ids"]
    if len(ids) <= limit:
        return query, None
    kept = tokenizer.decode(ids[:limit])
    return kept, f"query truncated from {len(ids)} to {limit} tokens (the encoder's limit)"


@dataclass
class ToolHit:
    """One retrieved tool; `score` is the retriever's (RRF for hybrid)."""

    spec: ToolSpec
    score: float


class _TruncatingDense:
    """A dense retriever whose queries are cut to the encoder's limit, with a note each."""

    def __init__(self, dense: DenseRetriever, notes: list[str]) -> None:
        self.dense = dense
        self.notes = notes

    def search(self, queries: list[str], topk: int) -> list[list[Any]]:
        cut = []
        for position, query in enumerate(queries):
            text, note = truncate_query(query, self.dense.model)
            if note is not None:
                self.notes.append(f"query {position}: {note}")
                logger.warning("query %d: %s", position, note)
            cut.append(text)
        return self.dense.search(cut, topk)


class ToolIndex:
    """Search a tool catalogue by BM25, dense embeddings or both (hybrid).

    `encoder`: a SentenceTransformer, a model directory (e.g. a `ponder tools train`
    output) or None for the packaged all-MiniLM-L6-v2; unused by "bm25". `fusion`: how
    the hybrid fuses the two rankings and the dense one's weight (see `read_fusion`).
    After each `search`, `notes` lists what was done to the queries (truncation).
    """

    def __init__(self, specs: list[ToolSpec], kind: str = "hybrid", encoder: Any = None,
                 rrf_k: int = 60, depth: int = 50, embeddings: np.ndarray | None = None,
                 fusion: Fusion = Fusion()) -> None:
        if kind not in TOOL_RETRIEVER_KINDS:
            raise ToolIndexError(f"unknown tool retriever kind {kind!r}; valid kinds: {', '.join(TOOL_RETRIEVER_KINDS)}")
        if not specs:
            raise ToolIndexError("a tool index needs at least one tool")
        if fusion.method not in FUSIONS:
            raise ToolIndexError(f"unknown fusion {fusion.method!r}; valid: {', '.join(FUSIONS)}")
        self.specs = list(specs)
        self.kind = kind
        self.by_name = {spec.name: spec for spec in self.specs}
        self.fusion = {"rrf_k": rrf_k, "depth": depth, "dense_weight": float(fusion.dense_weight),
                       "method": fusion.method}
        self.notes: list[str] = []
        docs = tool_documents(self.specs)
        self.bm25 = BM25Retriever(docs) if kind in ("bm25", "hybrid") else None
        self.dense: DenseRetriever | None = None
        self.model = None
        if kind in ("dense", "hybrid"):
            self.model = load_tool_encoder(encoder)
            self.dense = DenseRetriever.from_embeddings(docs, embeddings, self.model) if embeddings is not None \
                else DenseRetriever(docs, model=self.model)
        parts = [r for r in (self.bm25, _TruncatingDense(self.dense, self.notes) if self.dense else None) if r]
        self._retriever = parts[0] if len(parts) == 1 else \
            HybridRetriever(parts, k=rrf_k, depth=depth, weights=[1.0, float(fusion.dense_weight)],
                            fusion=fusion.method)

    def search(self, queries: list[str], topk: int) -> list[list[ToolHit]]:
        """The `topk` best tools per query, best first."""
        return [[ToolHit(self.by_name[hit.doc_id], hit.score) for hit in hits] for hits in self.hits(queries, topk)]

    def hits(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The `topk` best tools per query as retrieval hits (doc_id = tool name, score)."""
        self.notes.clear()
        return self._retriever.search(list(queries), topk)

    def rank_names(self, queries: list[str], topk: int) -> list[list[str]]:
        return [[hit.spec.name for hit in hits] for hits in self.search(queries, topk)]

    def embeddings(self) -> np.ndarray | None:
        """The dense tool embeddings ([tools, dim], unit length), None for BM25."""
        if self.dense is None:
            return None
        index = self.dense._index
        return index.reconstruct_n(0, index.ntotal)

    def save(self, directory: str | Path) -> Path:
        """Write tools.json, meta.json and (dense kinds) embeddings.npy into `directory`."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "tools.json", json.dumps([asdict(s) for s in self.specs], ensure_ascii=False))
        meta: dict[str, Any] = {"format": INDEX_FORMAT, "kind": self.kind, "tools": len(self.specs),
                                "fusion": self.fusion}
        if self.dense is not None:
            np.save(out / "embeddings.npy", self.embeddings())
            meta["encoder"] = {"fingerprint": encoder_fingerprint(self.model), "path": _model_source(self.model)}
        write_json_atomic(out / "meta.json", meta, sort_keys=False)
        return out

    @classmethod
    def load(cls, directory: str | Path, encoder: Any = None) -> ToolIndex:
        """An index saved by `save`; refused when `encoder` is not the one it was built with."""
        where = Path(directory)
        try:
            meta = json.loads((where / "meta.json").read_text(encoding="utf-8"))
            specs = [ToolSpec(**item) for item in json.loads((where / "tools.json").read_text(encoding="utf-8"))]
        except (OSError, ValueError, TypeError) as exc:
            raise ToolIndexError(f"{where}: not a tool index ({exc})") from exc
        if meta.get("format") != INDEX_FORMAT:
            raise ToolIndexError(f"{where}: index format {meta.get('format')!r}, this ponder reads {INDEX_FORMAT}")
        embeddings = None
        if meta["kind"] in ("dense", "hybrid"):
            built_with = meta.get("encoder") or {}
            model = load_tool_encoder(encoder if encoder is not None else built_with.get("path"))
            found = encoder_fingerprint(model)
            if found != built_with.get("fingerprint"):
                raise ToolIndexError(
                    f"{where}: index was built with encoder {built_with.get('fingerprint')} "
                    f"({built_with.get('path')}), but the encoder given is {found}; "
                    "rebuild it with `ponder tools index` or pass the encoder it was built with"
                )
            encoder, embeddings = model, np.load(where / "embeddings.npy")
        fusion = meta.get("fusion") or {}
        return cls(specs, kind=meta["kind"], encoder=encoder, embeddings=embeddings,
                   rrf_k=fusion.get("rrf_k", 60), depth=fusion.get("depth", 50),
                   fusion=Fusion(fusion.get("method", "rrf"), fusion.get("dense_weight", 1.0)))


def read_fusion(encoder: Any) -> Fusion | None:
    """The fusion `ponder tools train` chose for the encoder directory `encoder` (its
    fusion.json; files written before the choice of method hold RRF weights), or None
    when there is none."""
    if encoder is None or not isinstance(encoder, (str, Path)):
        return None
    path = Path(encoder) / FUSION_FILE
    if not path.is_file():
        return None
    try:
        chosen = json.loads(path.read_text(encoding="utf-8"))
        fusion = Fusion(str(chosen.get("method", "rrf")), float(chosen["dense_weight"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolIndexError(f"{path}: unreadable fusion choice ({exc!r}); rerun `ponder tools train` "
                             f"or delete the file to use equal votes") from exc
    if fusion.method not in FUSIONS:
        raise ToolIndexError(f"{path}: unknown fusion {fusion.method!r} (valid: {', '.join(FUSIONS)}); "
                             "rerun `ponder tools train`")
    return fusion


def _model_source(model: SentenceTransformer) -> str:
    return str(getattr(model, "ponder_source", "") or encoder_path())


def load_tool_encoder(encoder: Any = None) -> SentenceTransformer:
    """A SentenceTransformer as given, from a directory, or the packaged all-MiniLM-L6-v2."""
    from ponder.tools.retrieval.dense import load_encoder

    SentenceTransformer = require("sentence_transformers", "retrieval", DENSE_FEATURE).SentenceTransformer
    if isinstance(encoder, SentenceTransformer):
        return encoder
    if encoder is None or str(encoder) in ("", "base", str(encoder_path())):
        model = load_encoder()
        model.ponder_source = str(encoder_path())
        return model
    path = Path(encoder)
    if not (path / "modules.json").is_file():
        raise ToolIndexError(f"{path}: not a sentence-transformers model directory (no modules.json)")
    model = SentenceTransformer(str(path), local_files_only=True)
    model.ponder_source = str(path)
    return model
