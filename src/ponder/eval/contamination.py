"""Contamination: which evaluation items appear, whole or nearly, in the training data.

Each evaluation item is compared with every training item by up to four signals;
each gives the evaluation item its best-matching training item and a score:

- `ngram13` (config.ngram): word 13-grams after normalisation (case folded, NFKC,
  punctuation dropped, arithmetic signs kept), as GPT-3's report checks. The score
  is the *containment*: the share of the evaluation item's shingles that occur in the
  training item (Jaccard, shared / union, is reported beside it). An item shorter
  than n words is one shingle of its own length, so a short duplicate is still found.
- `ngram8` (config.short_ngram): the same with 8-grams, as Llama's and PaLM's reports;
  shorter shingles survive more edits (a synonym swapped every ten words).
- `numbers8` (config.numbers): 8-grams with every number, in digits or in words
  ("42", "3.5", "twenty-one"), as one placeholder: a copy with its numbers renamed.
- `embedding` (config.embeddings): cosine similarity of sentence embeddings (the
  caller's encoder; ponder uses all-MiniLM-L6-v2), for paraphrases.

An n-gram signal flags an item at containment >= config.overlap, the embedding signal
at cosine >= config.threshold. Everything here is a pure function of texts (and, for
embeddings, of vectors the caller computed); reading files and loading the encoder
live in ponder.eval.contamination_data.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rich.console import RenderableType

PLACEHOLDER = "<num>"
# Number words a renamed-number copy may spell out ("twenty-one" is split at its hyphen first).
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand "
    "million billion dozen half once twice".split()
)
# A number (digits with an optional decimal part or thousands commas), a word, or an arithmetic sign:
# "what is 3 + 4" and "what is 3 * 4" are different questions.
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+|[+*/=^%<>×÷−-]")
_WORD_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")  # "twenty-one", "multi-hop": one word each side

Embedder = Callable[[list[str]], np.ndarray]


@dataclass
class ContaminationConfig:
    """How evaluation items are matched against training items.

    ngram: the long shingle, in words (13: GPT-3's contamination check).
    short_ngram: the short shingle, in words (8: Llama's and PaLM's); 0 leaves it out.
    numbers: also compare short shingles with every number (digits or words) replaced
        by one placeholder, to find copies whose numbers were renamed (needs short_ngram > 0).
    overlap: the containment (share of an evaluation item's shingles found in one
        training item) from which an n-gram signal flags the item (0.5).
    threshold: the cosine similarity from which the embedding signal flags an item (0.9).
    embeddings: compute the embedding signal (the caller passes an encoder).
    """

    ngram: int = 13
    short_ngram: int = 8
    numbers: bool = True
    overlap: float = 0.5
    threshold: float = 0.9
    embeddings: bool = False

    def __post_init__(self) -> None:
        if self.ngram < 1 or self.short_ngram < 0:
            raise ValueError(f"contamination: ngram must be >= 1 and short_ngram >= 0, got {self.ngram}, "
                             f"{self.short_ngram}")  # fmt: skip
        for name in ("overlap", "threshold"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"contamination: {name} must be in (0, 1], got {getattr(self, name)}")

    def ngram_signals(self) -> list[tuple[str, int, bool]]:
        """(signal name, shingle size, numbers replaced) of each n-gram signal, in report order."""
        signals = [(f"ngram{self.ngram}", self.ngram, False)]
        if self.short_ngram and self.short_ngram != self.ngram:
            signals.append((f"ngram{self.short_ngram}", self.short_ngram, False))
        if self.numbers:
            size = self.short_ngram or self.ngram
            signals.append((f"numbers{size}", size, True))
        return signals

    def signals(self) -> list[str]:
        """Every signal's name, in report order."""
        return [name for name, _, _ in self.ngram_signals()] + (["embedding"] if self.embeddings else [])


@dataclass
class Item:
    """One record compared: its id (where it came from) and its text."""

    id: str
    text: str


def normalise(text: str, numbers: bool = False) -> list[str]:
    """The words of `text`: NFKC, case folded, punctuation dropped, arithmetic signs kept
    as words. numbers=True: each number (digits or number words, a run of them such as
    "twenty one" counted once) becomes PLACEHOLDER."""
    text = _WORD_HYPHEN.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    words = _TOKEN.findall(text)
    if not numbers:
        return words
    out: list[str] = []
    for word in words:
        is_number = word[0].isdigit() or word in NUMBER_WORDS
        if not is_number:
            out.append(word)
        elif not out or out[-1] != PLACEHOLDER:
            out.append(PLACEHOLDER)
    return out


def shingles(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The n-word windows of `words`; a text shorter than n words is one shingle, itself."""
    if not words:
        return set()
    if len(words) <= n:
        return {tuple(words)}
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b|; 0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def containment(a: set, b: set) -> float:
    """|a ∩ b| / |a|: the share of `a` found in `b`; 0 when `a` is empty."""
    return len(a & b) / len(a) if a else 0.0


@dataclass
class Match:
    """An evaluation item's best training item under one signal."""

    train_index: int  # -1: no training item shares anything
    score: float  # containment (n-gram signals) or cosine similarity (embedding)
    jaccard: float | None = None  # n-gram signals only
    flagged: bool = False


def best_ngram_matches(
    eval_words: list[list[str]], train_words: list[list[str]], n: int, overlap: float
) -> list[Match]:
    """Per evaluation item, the training item holding the largest share of its n-grams
    (ties: the larger Jaccard, then the first). An evaluation item of L < n words is
    compared at L-grams, so a short item found inside a longer training text counts."""
    indexes: dict[int, dict[tuple[str, ...], list[int]]] = {}
    train_sets: dict[tuple[int, int], set[tuple[str, ...]]] = {}

    def index(size: int) -> dict[tuple[str, ...], list[int]]:
        if size not in indexes:  # built once per shingle size, lazily: most items use n
            postings: dict[tuple[str, ...], list[int]] = {}
            for position, words in enumerate(train_words):
                train_sets[(size, position)] = found = shingles(words, size)
                for shingle in found:
                    postings.setdefault(shingle, []).append(position)
            indexes[size] = postings
        return indexes[size]

    matches = []
    for words in eval_words:
        size = min(n, len(words)) or n
        mine = shingles(words, size)
        postings = index(size)
        shared = Counter(position for shingle in mine for position in postings.get(shingle, ()))
        if not shared:
            matches.append(Match(-1, 0.0, 0.0))
            continue
        union = lambda p: len(mine) + len(train_sets[(size, p)]) - shared[p]  # noqa: E731
        best = max(shared, key=lambda p: (shared[p], shared[p] / union(p), -p))
        score = shared[best] / len(mine)
        matches.append(Match(best, score, shared[best] / union(best), score >= overlap))
    return matches


def best_cosine_matches(
    eval_vectors: np.ndarray, train_vectors: np.ndarray, threshold: float, chunk: int = 4096
) -> list[Match]:
    """Per evaluation item (a row of eval_vectors, [E, d], unit length), the training
    row of train_vectors ([T, d], unit length) of highest cosine similarity (ties: the
    first). Training rows are taken `chunk` at a time, so memory stays E x chunk."""
    if len(eval_vectors) == 0:
        return []
    if len(train_vectors) == 0:
        return [Match(-1, 0.0) for _ in range(len(eval_vectors))]
    best_score = np.full(len(eval_vectors), -np.inf, dtype=np.float64)
    best_index = np.zeros(len(eval_vectors), dtype=np.int64)
    for start in range(0, len(train_vectors), chunk):
        scores = np.asarray(eval_vectors, dtype=np.float64) @ np.asarray(train_vectors[start : start + chunk],
                                                                          dtype=np.float64).T  # fmt: skip
        top = scores.argmax(axis=1)
        value = scores[np.arange(len(scores)), top]
        better = value > best_score  # strictly: an earlier chunk keeps a tie
        best_score[better], best_index[better] = value[better], top[better] + start
    return [Match(int(i), float(s), None, bool(s >= threshold)) for i, s in zip(best_index, best_score)]


@dataclass
class ItemReport:
    """One evaluation item: its best training item under each signal."""

    eval_index: int
    eval_id: str
    matches: dict[str, Match] = field(default_factory=dict)

    @property
    def flagged_by(self) -> list[str]:
        return [name for name, match in self.matches.items() if match.flagged]


@dataclass
class ContaminationReport:
    """Every evaluation item's matches, and what was compared."""

    items: list[ItemReport]
    eval_items: list[Item]
    train_items: list[Item]
    config: ContaminationConfig
    signals: list[str]
    skipped: str = ""  # why a signal the config asked for was left out ("" = none was)

    @property
    def flagged(self) -> list[ItemReport]:
        return [item for item in self.items if item.flagged_by]

    @property
    def share(self) -> float:
        """The share of evaluation items flagged by any signal (nan for no items)."""
        return len(self.flagged) / len(self.items) if self.items else math.nan

    def by_signal(self) -> dict[str, int]:
        """How many evaluation items each signal flags."""
        return {name: sum(item.matches[name].flagged for item in self.items) for name in self.signals}

    def summary(self) -> dict[str, Any]:
        """The totals: what a run's results record."""
        return {"eval_items": len(self.items), "train_items": len(self.train_items), "flagged": len(self.flagged),
                "share": self.share, "by_signal": self.by_signal(), "signals": list(self.signals),
                "overlap": self.config.overlap, "threshold": self.config.threshold,
                "skipped": self.skipped}  # fmt: skip

    def to_dict(self, text_chars: int = 200) -> dict[str, Any]:
        """The summary and, per evaluation item, each signal's best training item (id,
        score, Jaccard, flagged) with both texts cut to `text_chars` characters."""
        rows = []
        for item in self.items:
            matches = {}
            for name, match in item.matches.items():
                train = self.train_items[match.train_index] if match.train_index >= 0 else None
                matches[name] = {**asdict(match), "train_id": train.id if train else None}
            rows.append({"eval_id": item.eval_id, "eval_text": self.eval_items[item.eval_index].text[:text_chars],
                         "flagged_by": item.flagged_by, "matches": matches})  # fmt: skip
        return {"summary": self.summary(), "config": asdict(self.config), "items": rows}


def check_contamination(
    train: Sequence[Item], evaluation: Sequence[Item], config: ContaminationConfig | None = None,
    embed: Embedder | None = None, skipped: str = "",
) -> ContaminationReport:  # fmt: skip
    """Match every evaluation item against the training items by the config's signals.
    `embed(texts) -> [len(texts), d]` unit vectors gives the embedding signal; without
    it (or with config.embeddings off) that signal is left out, `skipped` saying why."""
    config = config or ContaminationConfig()
    per_signal: dict[str, list[Match]] = {}
    for name, size, numbers in config.ngram_signals():
        eval_words = [normalise(item.text, numbers) for item in evaluation]
        train_words = [normalise(item.text, numbers) for item in train]
        per_signal[name] = best_ngram_matches(eval_words, train_words, size, config.overlap)
    if config.embeddings and embed is not None:
        eval_vectors = embed([item.text for item in evaluation]) if evaluation else np.zeros((0, 1))
        train_vectors = embed([item.text for item in train]) if train else np.zeros((0, 1))
        per_signal["embedding"] = best_cosine_matches(eval_vectors, train_vectors, config.threshold)
    elif config.embeddings and not skipped:
        skipped = "embedding: no encoder given"
    items = [ItemReport(index, item.id, {name: matches[index] for name, matches in per_signal.items()})
             for index, item in enumerate(evaluation)]  # fmt: skip
    return ContaminationReport(items, list(evaluation), list(train), config, list(per_signal), skipped)


def summary_line(report: ContaminationReport) -> str:
    """One line: `contamination: 2 of 128 eval items (1.6%) match the 256 train items
    (ngram13 1, ngram8 2, numbers8 2; embedding off)`."""
    counts = ", ".join(f"{name} {count}" for name, count in report.by_signal().items())
    share = f"{report.share:.1%}" if report.items else "n/a"
    tail = "" if "embedding" in report.signals else f"; {report.skipped or 'embedding off'}"
    return (f"contamination: {len(report.flagged)} of {len(report.items)} eval items ({share}) match the "
            f"{len(report.train_items)} train items ({counts}{tail})")  # fmt: skip


def _snippet(text: str, chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def contamination_table(report: ContaminationReport, limit: int = 20, chars: int = 60) -> RenderableType:
    """The flagged items, highest score first, `limit` of them (0: all): which eval item
    matched which train item, by which signals at what score; then each signal's count.
    Cells fold rather than cut, so it reads at 80 columns."""
    from rich.console import Group
    from rich.table import Table

    flagged = sorted(report.flagged, key=lambda item: (-max(item.matches[s].score for s in item.flagged_by),
                                                       item.eval_index))  # fmt: skip
    shown = flagged if limit <= 0 else flagged[:limit]
    more = len(flagged) - len(shown)
    items = Table(title=f"{len(flagged)} of {len(report.items)} eval items flagged", show_edge=False,
                  caption=f"{more} more in the full report (--json)" if more else None)
    for header in ("eval item", "train item", "signal", "score"):
        items.add_column(header, overflow="fold", justify="right" if header == "score" else "left")
    for item in shown:
        evaluated = report.eval_items[item.eval_index]
        first = item.matches[item.flagged_by[0]]
        trained = report.train_items[first.train_index]
        items.add_row(f"{evaluated.id}\n[dim]{_snippet(evaluated.text, chars)}[/]",
                      f"{trained.id}\n[dim]{_snippet(trained.text, chars)}[/]",
                      "\n".join(item.flagged_by),
                      "\n".join(f"{item.matches[s].score:.2f}" for s in item.flagged_by))  # fmt: skip
    totals = Table(title="by signal", show_edge=False, caption=_caption(report))
    for header in ("signal", "flags at", "flagged", "share"):
        totals.add_column(header, justify="left" if header == "signal" else "right")
    for name, count in report.by_signal().items():
        at = f"cos ≥ {report.config.threshold:g}" if name == "embedding" else f"≥ {report.config.overlap:g}"
        share = f"{count / len(report.items):.1%}" if report.items else "n/a"
        totals.add_row(name, at, str(count), share)
    share = f"{report.share:.1%}" if report.items else "n/a"
    totals.add_row("any", "", str(len(flagged)), share, style="bold")
    return Group(items, "", totals) if shown else totals


def _caption(report: ContaminationReport) -> str:
    lines = [f"{len(report.eval_items)} eval items against {len(report.train_items)} train items",
             "n-gram score: share of the eval item's n-grams in one train item",
             "train item: the first signal's match"]  # fmt: skip
    if "embedding" not in report.signals:
        lines.append(report.skipped or "embedding off (--embeddings)")
    return "\n".join(lines)
