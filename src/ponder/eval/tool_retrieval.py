"""Tool retrieval on BFCL: the training data for the encoder and the retrieval table.

All tools of the BFCL data (~2,000 after deduplication) are indexed; queries come with
the names of the tools that answer them. The split is by function: a seeded coin per
tool name decides which tools are held out, test queries need only held-out tools and
training queries none. Training sees only non-live training queries, and its hard
negatives come only from tools offered in non-live training questions. The live
categories are scored last, as the generalisation test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ponder.eval.bfcl.data import (
    LIVE, NON_LIVE, LabelledQuery, ToolCorpus, definition_to_spec, is_test_function, labelled_queries,
    load_questions, load_tool_corpus, split_by_function,
)
from ponder.eval.ranking import ranking_report
from ponder.tools.retrieval.finetune import ContrastiveConfig, ContrastiveExample, mine_examples
from ponder.tools.retrieval.toolindex import ToolIndex, tool_text


@dataclass
class ToolRetrievalData:
    """The corpus, the split and the tools training may see."""

    corpus: ToolCorpus
    train: list[LabelledQuery]
    test: list[LabelledQuery]
    live: list[LabelledQuery]
    train_tools: dict[str, str]  # name → indexed text, for tools of non-live training questions
    test_fraction: float
    seed: int

    def describe(self) -> str:
        return (f"{self.corpus.summary()}; {len(self.train)} training queries, {len(self.test)} held-out "
                f"queries (test_fraction {self.test_fraction}, seed {self.seed}), {len(self.live)} live queries")


def prepare_data(data_dir: Path, test_fraction: float = 0.3, seed: int = 0) -> ToolRetrievalData:
    corpus = load_tool_corpus(data_dir)
    train, test = split_by_function(labelled_queries(data_dir, NON_LIVE), test_fraction, seed)
    indexed = {spec.name for spec in corpus.specs}
    live = [q for q in labelled_queries(data_dir, LIVE) if q.relevant <= indexed]
    train_tools: dict[str, str] = {}
    for category in NON_LIVE:
        for question in load_questions(data_dir, category):
            for definition in question.functions:
                spec, _ = definition_to_spec(definition)
                if spec is not None and not is_test_function(spec.name, test_fraction, seed):
                    train_tools.setdefault(spec.name, tool_text(spec))
    return ToolRetrievalData(corpus, train, test, live, train_tools, test_fraction, seed)


def training_examples(data: ToolRetrievalData, config: ContrastiveConfig) -> list[ContrastiveExample]:
    """(query, positive, hard negatives) rows; negatives mined by BM25 among training tools."""
    from ponder.types import ToolSpec

    pool = [ToolSpec(name, text) for name, text in data.train_tools.items()]
    bm25 = ToolIndex(pool, kind="bm25")
    pairs = [(q.query, q.relevant) for q in data.train]
    return mine_examples(pairs, data.train_tools, bm25.rank_names, config)


RETRIEVER_ROWS = (  # (key, label, kind, encoder)
    ("bm25", "bm25", "bm25", None),
    ("base", "dense (base MiniLM)", "dense", "base"),
    ("tuned", "dense (fine-tuned)", "dense", "tuned"),
    ("hybrid", "hybrid (BM25 + fine-tuned)", "hybrid", "tuned"),
    ("hybrid-base", "hybrid (BM25 + base)", "hybrid", "base"),
)


def evaluate_retrievers(
    data: ToolRetrievalData, tuned_encoder: Any = None, say: Callable[[str], None] = lambda _: None,
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """recall@1/5/10, MRR and nDCG@10 on the held-out and live queries for each retriever.

    Without a fine-tuned encoder its rows are left out. Embeddings are computed once per
    encoder and shared between its dense and hybrid rows.
    """
    specs = data.corpus.specs
    encoders = {"base": None, "tuned": tuned_encoder}
    dense_embeddings: dict[str, Any] = {}
    rows = []
    for key, label, kind, encoder_key in RETRIEVER_ROWS:
        if (encoder_key == "tuned" and tuned_encoder is None) or (only and key not in only):
            continue
        started = time.perf_counter()
        embeddings = dense_embeddings.get(encoder_key) if encoder_key else None
        index = ToolIndex(specs, kind=kind, encoder=encoders.get(encoder_key) if encoder_key else None,
                          embeddings=embeddings)
        if encoder_key and encoder_key not in dense_embeddings:
            dense_embeddings[encoder_key] = index.embeddings()
        for split, queries in (("held-out", data.test), ("live", data.live)):
            ranked = index.rank_names([q.query for q in queries], 10)
            report = ranking_report(ranked, [q.relevant for q in queries])
            rows.append({"retriever": label, "split": split, **report})
        say(f"{label}: {time.perf_counter() - started:.0f} s")
    return rows


def retrieval_markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown, held-out rows first, then live (the generalisation test)."""
    header = "| split | retriever | queries | recall@1 | recall@5 | recall@10 | MRR | nDCG@10 |"
    lines = [header, "|" + "---|" * 8]
    for split in ("held-out", "live"):
        for row in rows:
            if row["split"] == split:
                metrics = " | ".join(f"{row[m]:.3f}" for m in ("recall@1", "recall@5", "recall@10", "mrr", "ndcg@10"))
                lines.append(f"| {split} | {row['retriever']} | {int(row['queries'])} | {metrics} |")
    return "\n".join(lines)
