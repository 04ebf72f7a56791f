"""Tool retrieval on BFCL: the training data for the encoder and the retrieval table.

All tools of the BFCL data (~2,000 after deduplication) are indexed; queries come with
the names of the tools that answer them. The split is by function: a seeded coin per
tool name decides which tools are held out, test queries need only held-out tools and
training queries none. A second seeded coin carves validation functions out of the
training functions in the same way: the encoder never trains on their queries, and the
hybrid's fusion (RRF or a convex combination of scores, and the dense ranking's weight)
is chosen on them, so nothing is tuned on held-out or live queries. Or, with K folds,
every training function is a validation function once: K encoders each trained
without one fold score that fold's queries, the fusion is chosen on all of them
pooled, and the final encoder trains on every training function.
Training sees only non-live training queries, and its hard negatives come only from
tools offered in non-live training questions (validation tools excluded). The live
categories are scored last, as the generalisation test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ponder.bfcl.data import (
    LIVE, NON_LIVE, LabelledQuery, ToolCorpus, definition_to_spec, function_coin, is_test_function,
    labelled_queries, load_questions, load_tool_corpus, split_by_function, split_queries,
)
from ponder.eval.ranking import paired_difference, ranking_report
from ponder.tools.retrieval.corpus import Hit
from ponder.tools.retrieval.hybrid import FUSIONS, fuse
from ponder.tools.retrieval.finetune import ContrastiveConfig, ContrastiveExample, mine_examples
from ponder.tools.retrieval.toolindex import Fusion, ToolIndex, tool_text


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
    validation: list[LabelledQuery] = field(default_factory=list)
    validation_fraction: float = 0.0  # share of the training functions held out for validation

    def describe(self) -> str:
        validation = (f", {len(self.validation)} validation queries (validation_fraction "
                      f"{self.validation_fraction} of training functions)") if self.validation_fraction else ""
        return (f"{self.corpus.summary()}; {len(self.train)} training queries{validation}, {len(self.test)} "
                f"held-out queries (test_fraction {self.test_fraction}, seed {self.seed}), {len(self.live)} live queries")


VALIDATION_SALT = "validation:"  # an independent coin from the held-out one


def is_validation_function(name: str, validation_fraction: float, seed: int) -> bool:
    return is_test_function(name, validation_fraction, seed, VALIDATION_SALT)


def _split_validation(queries: list[LabelledQuery], fraction: float, seed: int) -> tuple[list, list]:
    """(train, validation) by function, as the held-out split: mixed queries are dropped."""
    return split_by_function(queries, fraction, seed, VALIDATION_SALT)


def prepare_data(data_dir: Path, test_fraction: float = 0.3, seed: int = 0,
                 validation_fraction: float = 0.0) -> ToolRetrievalData:
    for flag, value in (("--test-fraction", test_fraction), ("--validation-fraction", validation_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{flag} must be in [0, 1), got {value}")
    corpus = load_tool_corpus(data_dir)
    train, test = split_by_function(labelled_queries(data_dir, NON_LIVE), test_fraction, seed)
    train, validation = _split_validation(train, validation_fraction, seed)
    indexed = {spec.name for spec in corpus.specs}
    live = [q for q in labelled_queries(data_dir, LIVE) if q.relevant <= indexed]
    train_tools: dict[str, str] = {}
    for category in NON_LIVE:
        for question in load_questions(data_dir, category):
            for definition in question.functions:
                spec, _ = definition_to_spec(definition)
                if spec is not None and not is_test_function(spec.name, test_fraction, seed) \
                        and not is_validation_function(spec.name, validation_fraction, seed):
                    train_tools.setdefault(spec.name, tool_text(spec))
    return ToolRetrievalData(corpus, train, test, live, train_tools, test_fraction, seed,
                             validation, validation_fraction)


def training_examples(data: ToolRetrievalData, config: ContrastiveConfig) -> list[ContrastiveExample]:
    """(query, positive, hard negatives) rows; negatives mined by BM25 among training tools."""
    from ponder.types import ToolSpec

    pool = [ToolSpec(name, text) for name, text in data.train_tools.items()]
    bm25 = ToolIndex(pool, kind="bm25")
    pairs = [(q.query, q.relevant) for q in data.train]
    return mine_examples(pairs, data.train_tools, bm25.rank_names, config)


FUSION_GRID = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)  # dense vote weights tried; BM25's is 1
FUSION_SELECTED_BY = ("validation recall@5 (the agent is offered the top 5), ties by MRR, then RRF before the "
                      "convex combination, then the smaller weight")


def fusion_sweep(bm25_ranked: list[list[Hit]], dense_ranked: list[list[Hit]], relevant: list[set[str]],
                 grid: tuple[float, ...] = FUSION_GRID, rrf_k: int = 60) -> tuple[Fusion, list[dict[str, Any]]]:
    """(chosen fusion, one ranking report per fusion tried): each query's BM25 and dense
    hits (doc_id = tool name, best first) fused by each of FUSIONS with weights [1, w]
    for w in `grid`; chosen by FUSION_SELECTED_BY."""
    rows = []
    for method in FUSIONS:
        for weight in grid:
            fused = [[hit.doc_id for hit in fuse(method, [bm25, dense], 10, [1.0, weight], rrf_k)]
                     for bm25, dense in zip(bm25_ranked, dense_ranked)]
            rows.append({"method": method, "dense_weight": weight, **ranking_report(fused, relevant)})
    best = max(rows, key=lambda row: (row["recall@5"], row["mrr"], -FUSIONS.index(row["method"]),
                                      -row["dense_weight"]))
    return Fusion(best["method"], best["dense_weight"]), rows


def tune_fusion(data: ToolRetrievalData, encoder: Any, depth: int = 50, rrf_k: int = 60) -> dict[str, Any]:
    """The hybrid's fusion chosen on the validation queries (never held-out or live),
    with the sweep and the single retrievers' validation scores, as written to fusion.json."""
    if not data.validation:
        raise ValueError("no validation queries: prepare the data with validation_fraction > 0")
    queries, relevant = [q.query for q in data.validation], [q.relevant for q in data.validation]
    bm25 = ToolIndex(data.corpus.specs, kind="bm25").hits(queries, depth)
    dense = ToolIndex(data.corpus.specs, kind="dense", encoder=encoder).hits(queries, depth)
    return fusion_report(bm25, dense, relevant, data.seed, depth, rrf_k, selected_by=FUSION_SELECTED_BY,
                         validation_fraction=data.validation_fraction)


def fusion_report(bm25: list[list[Hit]], dense: list[list[Hit]], relevant: list[set[str]], seed: int,
                  depth: int, rrf_k: int, selected_by: str, **extra: Any) -> dict[str, Any]:
    """What fusion.json holds: the fusion chosen by `fusion_sweep` on these hits (best
    first, cut at `depth`), the sweep, and the single retrievers' scores on the same
    queries; `extra` says how the queries were held out."""
    chosen, sweep = fusion_sweep(bm25, dense, relevant, rrf_k=rrf_k)
    singles = {name: ranking_report([[hit.doc_id for hit in hits[:10]] for hits in ranked], relevant)
               for name, ranked in (("bm25", bm25), ("dense", dense))}
    return {"method": chosen.method, "dense_weight": chosen.dense_weight, "bm25_weight": 1.0, "rrf_k": rrf_k,
            "depth": depth, "methods": list(FUSIONS), "grid": list(FUSION_GRID), "selected_by": selected_by,
            "validation_queries": len(relevant), **extra, "split_seed": seed, "sweep": sweep,
            "single_retrievers": singles}


FOLD_SALT = "fold:"  # independent of the held-out and validation coins


def function_fold(name: str, folds: int, seed: int) -> int:
    """The cross-validation fold (0 .. folds-1) of a training function: a seeded coin."""
    return min(int(function_coin(name, seed, FOLD_SALT) * folds), folds - 1)


def fold_data(data: ToolRetrievalData, fold: int, folds: int) -> tuple[ToolRetrievalData, list[LabelledQuery]]:
    """(training data without fold `fold`'s functions, the fold's queries): by function,
    as the held-out split; queries mixing the fold's and other tools are dropped."""
    def in_fold(name: str) -> bool:
        return function_fold(name, folds, data.seed) == fold

    train, validation = split_queries(data.train, in_fold)
    tools = {name: text for name, text in data.train_tools.items() if not in_fold(name)}
    return replace(data, train=train, train_tools=tools, validation=[]), validation


def cross_validated_fusion(data: ToolRetrievalData, config: ContrastiveConfig, folds: int,
                           train: Callable[[list[ContrastiveExample]], Any], say: Callable[[str], None] = print,
                           depth: int = 50, rrf_k: int = 60) -> dict[str, Any]:
    """The hybrid's fusion chosen by `folds`-fold cross-validation over the training
    functions: per fold an encoder trained (`train(examples) -> model`) without the fold's
    functions ranks the fold's queries; the fusion is chosen by FUSION_SELECTED_BY on
    every fold's rankings pooled (each training query scored once, by an encoder that
    never saw its tools). Held-out and live queries are never used."""
    if data.validation:
        raise ValueError("cross-validation folds the training functions: prepare the data with validation_fraction 0")
    bm25_index = ToolIndex(data.corpus.specs, kind="bm25")
    bm25, dense, relevant = [], [], []
    for fold in range(folds):
        part, validation = fold_data(data, fold, folds)
        model = train(training_examples(part, config))
        queries = [q.query for q in validation]
        bm25 += bm25_index.hits(queries, depth)
        dense += ToolIndex(data.corpus.specs, kind="dense", encoder=model).hits(queries, depth)
        relevant += [q.relevant for q in validation]
        say(f"fold {fold + 1}/{folds}: trained on {len(part.train)} queries, ranked {len(validation)}")
    selected_by = f"{folds}-fold cross-validation over the training functions, pooled: {FUSION_SELECTED_BY}"
    return fusion_report(bm25, dense, relevant, data.seed, depth, rrf_k, selected_by=selected_by, folds=folds)


RETRIEVER_ROWS = (  # (key, label, kind, encoder, tuned: use the fusion chosen on validation)
    ("bm25", "bm25", "bm25", None, False),
    ("base", "dense (base MiniLM)", "dense", "base", False),
    ("tuned", "dense (fine-tuned)", "dense", "tuned", False),
    ("hybrid", "hybrid (BM25 + fine-tuned, RRF, equal weights)", "hybrid", "tuned", False),
    ("hybrid-weighted", "hybrid (BM25 + fine-tuned, {fusion})", "hybrid", "tuned", True),
    ("hybrid-base", "hybrid (BM25 + base)", "hybrid", "base", False),
)


def evaluate_retrievers(
    data: ToolRetrievalData, tuned_encoder: Any = None, say: Callable[[str], None] = lambda _: None,
    only: list[str] | None = None, fusion: Fusion | None = None,
) -> list[dict[str, Any]]:
    """recall@1/5/10, MRR and nDCG@10 on the held-out and live queries for each retriever.

    Without a fine-tuned encoder its rows are left out, and without `fusion` (the one
    chosen on validation) the tuned hybrid row, which also carries `vs_fine_tuned`: its
    per-query difference from the fine-tuned encoder (`paired_difference`). Embeddings
    are computed once per encoder and shared between its dense and hybrid rows.
    """
    specs = data.corpus.specs
    encoders = {"base": None, "tuned": tuned_encoder}
    dense_embeddings: dict[str, Any] = {}
    rows = []
    encoder_ranked: dict[str, list[list[str]]] = {}  # split -> the fine-tuned encoder's rankings
    for key, label, kind, encoder_key, weighted in RETRIEVER_ROWS:
        if (encoder_key == "tuned" and tuned_encoder is None) or (only and key not in only) \
                or (weighted and fusion is None):
            continue
        started = time.perf_counter()
        label = label.format(fusion=fusion) if weighted else label
        embeddings = dense_embeddings.get(encoder_key) if encoder_key else None
        index = ToolIndex(specs, kind=kind, encoder=encoders.get(encoder_key) if encoder_key else None,
                          embeddings=embeddings, fusion=fusion if weighted and fusion else Fusion())
        if encoder_key and encoder_key not in dense_embeddings:
            dense_embeddings[encoder_key] = index.embeddings()
        for split, queries in (("held-out", data.test), ("live", data.live)):
            ranked = index.rank_names([q.query for q in queries], 10)
            relevant = [q.relevant for q in queries]
            rows.append({"retriever": label, "split": split, **ranking_report(ranked, relevant)})
            if key == "tuned":
                encoder_ranked[split] = ranked
            elif key == "hybrid-weighted" and split in encoder_ranked:
                rows[-1]["vs_fine_tuned"] = paired_difference(ranked, encoder_ranked[split], relevant)
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
    lines += [_paired_line(row) for row in rows if "vs_fine_tuned" in row]
    return "\n".join(lines)


def _paired_line(row: dict[str, Any]) -> str:
    """One sentence: the tuned hybrid minus the fine-tuned encoder, per query, paired."""
    parts = [f"{name} {d['mean']:+.4f} (paired se {d['se']:.4f}; better on {int(d['better'])}, "
             f"worse on {int(d['worse'])} queries)" for name, d in row["vs_fine_tuned"].items()]
    return f"\n{row['split']}: {row['retriever']} minus dense (fine-tuned): " + ", ".join(parts)
