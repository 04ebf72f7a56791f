"""How well ponder's contamination check finds planted duplicates, and what it finds
between the built-in environments' own train and eval splits (docs/results/evaluation.md).

For each built-in environment (search_qa, math, code, function_calling) the training
split is the training data; the test set is planted from it by rules, no model:
  exact      a training item copied (upper-cased: normalisation must see through it)
  synonyms   words swapped for synonyms (a fixed list)
  reorder    its sentences (or clauses) in another order: the question first
  filler     a sentence of filler before it and one after it
  paraphrase all three rules at once
  renamed    every number replaced by another (training items with a number only)
plus clean items: the other environments' evaluation items (unrelated), and for math
its `far` variant (the same domain, other templates, numbers in words). Recall is per
planted kind, precision over planted + clean; each with the n-gram signals only (what
`ponder demo` and `pipeline` run) and with the embedding signal (all-MiniLM-L6-v2).
Then each environment's own eval split against its train split: the flagged count.

    OMP_NUM_THREADS=1 .venv/bin/python bench/contamination.py --out runs/bench-contamination

Run from the repository root; no LLM is loaded.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from ponder.eval.contamination import ContaminationConfig, Item, check_contamination, normalise
from ponder.eval.contamination_data import minilm_embedder, recipe_splits, task_items

ENVS = {"search_qa": "recipes/search_qa.yaml", "math": "recipes/math.yaml", "code": "recipes/code.yaml",
        "function_calling": "recipes/function_calling.yaml"}  # fmt: skip
# More evaluation splits checked against their environment's training split.
VARIANTS = {"math, variant far": ("recipes/math.yaml", ["env.options.variant=far"]),
            "math, variant ood": ("recipes/math.yaml", ["env.options.variant=ood"])}  # fmt: skip
KINDS = ("exact", "synonyms", "reorder", "filler", "paraphrase", "renamed")
SYNONYMS = {
    "what": "which", "how many": "what number of", "has": "owns", "have": "own", "buys": "purchases",
    "gives": "hands", "away": "off", "more": "additional", "each": "every", "total": "overall",
    "write": "implement", "function": "routine", "returns": "gives back", "list": "sequence",
    "integer": "whole number", "integers": "whole numbers", "string": "text", "find": "determine",
    "calculate": "compute", "get": "obtain", "city": "town", "company": "firm", "work": "be employed",
    "born": "brought into the world", "profession": "occupation", "headquarters": "head office",
    "area": "surface", "number": "figure", "given": "provided", "using": "with", "equally": "evenly",
    "among": "between", "left": "remaining", "now": "at this point", "are": "remain",
}  # fmt: skip
_SYNONYM = re.compile(r"\b(" + "|".join(sorted(map(re.escape, SYNONYMS), key=len, reverse=True)) + r")\b", re.I)
FILLER = ("Here is one more question for you, so please read all of it carefully before you start.",
          "Take your time and check your work before you give the final answer.")  # fmt: skip
THRESHOLDS = (0.8, 0.85, 0.9, 0.95)  # embedding thresholds the sweep reads off the same scores


def synonyms(text: str) -> str:
    def swap(match: re.Match) -> str:
        word = SYNONYMS[match[0].lower()]
        return word[0].upper() + word[1:] if match[0][0].isupper() else word

    return _SYNONYM.sub(swap, text)


def reorder(text: str) -> str:
    """The last sentence first (the question before its story); one sentence: its
    clauses around the first comma, or around ' and ', swapped."""
    sentences = re.split(r"(?<=[.?!])\s+", text.strip())
    if len(sentences) >= 2:
        return " ".join([sentences[-1], *sentences[:-1]])
    for mark in (", ", " and "):
        if mark in text:
            head, tail = text.split(mark, 1)
            return f"{tail.rstrip('.?!')}{mark}{head[0].lower()}{head[1:]}{text.strip()[-1]}"
    return text


def filler(text: str) -> str:
    return f"{FILLER[0]} {text} {FILLER[1]}"


def renamed(text: str, rng: random.Random) -> str:
    """Every number replaced by another of the same number of digits."""

    def other(match: re.Match) -> str:
        value, digits = int(match[0]), len(match[0])
        low, high = (0, 9) if digits == 1 else (10 ** (digits - 1), 10**digits - 1)
        choices = [n for n in range(low, min(high, low + 200) + 1) if n != value]
        return str(rng.choice(choices))

    return re.sub(r"\d+", other, text)


def planted(train: list[Item], per_kind: int, rng: random.Random) -> list[tuple[str, Item, int]]:
    """(kind, planted item, index of the training item it came from)."""
    rules = {"exact": lambda t: t.upper(), "synonyms": synonyms, "reorder": reorder, "filler": filler,
             "paraphrase": lambda t: filler(reorder(synonyms(t)))}  # fmt: skip
    out = []
    for kind in KINDS:
        pool = [i for i, item in enumerate(train) if kind != "renamed" or re.search(r"\d", item.text)]
        if kind in ("synonyms", "paraphrase"):  # a rule that changes nothing plants an exact copy
            pool = [i for i in pool if synonyms(train[i].text) != train[i].text]
        for index in rng.sample(pool, min(per_kind, len(pool))):
            text = renamed(train[index].text, rng) if kind == "renamed" else rules[kind](train[index].text)
            out.append((kind, Item(f"{kind}-{len(out)}", text), index))
    return out


def _counts(flags: list[bool]) -> dict[str, Any]:
    return {"found": sum(flags), "of": len(flags), "recall": sum(flags) / len(flags) if flags else None}


def _found(item: Any, origin: int, signal: str, train: list[Item]) -> bool:
    """Flagged by `signal`, matched with the training item it was planted from or with
    one that reads the same to that signal (templates repeat: "What is 3 + 4?" and
    "What is 5 + 2?" are one text with numbers as placeholders)."""
    match = item.matches[signal]
    if not match.flagged:
        return False
    if match.train_index == origin or signal == "embedding":
        return match.train_index == origin or train[match.train_index].text == train[origin].text
    numbers = signal.startswith("numbers")
    return normalise(train[match.train_index].text, numbers) == normalise(train[origin].text, numbers)


def score_planted(env: str, train: list[Item], clean: list[Item], per_kind: int, embed: Any, seed: int) -> dict:
    """Recall per planted kind and precision, n-gram signals alone and with embeddings."""
    plants = planted(train, per_kind, random.Random(seed))
    test = [item for _, item, _ in plants] + clean
    config = ContaminationConfig(embeddings=embed is not None)
    tick = time.perf_counter()
    report = check_contamination(train, test, config, embed)
    seconds = time.perf_counter() - tick
    ngram = [name for name in report.signals if name != "embedding"]
    result: dict[str, Any] = {"planted": len(plants), "clean": len(clean), "check_s": seconds, "recall": {}}
    for kind in KINDS:
        rows = [(report.items[i], origin) for i, (k, _, origin) in enumerate(plants) if k == kind]
        hit = lambda item, origin, names: any(_found(item, origin, n, train) for n in names)  # noqa: E731
        result["recall"][kind] = {signal: _counts([hit(item, origin, [signal]) for item, origin in rows])
                                  for signal in report.signals}  # fmt: skip
        result["recall"][kind]["ngram"] = _counts([hit(item, origin, ngram) for item, origin in rows])
        result["recall"][kind]["any"] = _counts([hit(item, origin, report.signals) for item, origin in rows])
    clean_items = report.items[len(plants):]
    for name, signals in (("ngram", ngram), ("any", report.signals)):
        true = sum(any(item.matches[s].flagged for s in signals) for item in report.items[: len(plants)])
        false = sum(any(item.matches[s].flagged for s in signals) for item in clean_items)
        result[f"precision_{name}"] = true / (true + false) if true + false else None
        result[f"clean_flagged_{name}"] = false
    if embed is not None:  # the same scores read at other thresholds
        result["embedding_sweep"] = _sweep(report, plants, clean_items, train)
    return result


def _sweep(report: Any, plants: list, clean_items: list, train: list[Item]) -> dict[str, Any]:
    """Per embedding threshold: the near duplicates (synonyms, reorder, filler, paraphrase)
    matched with their own training item at or above it, and the clean items at or above it."""
    near = [(report.items[i], origin) for i, (kind, _, origin) in enumerate(plants)
            if kind in ("synonyms", "reorder", "filler", "paraphrase")]  # fmt: skip
    same = lambda match, origin: train[match.train_index].text == train[origin].text  # noqa: E731
    return {f"{t:g}": {"near_recall": sum(item.matches["embedding"].score >= t and same(item.matches["embedding"], origin)
                                          for item, origin in near) / max(len(near), 1),
                       "clean_flagged": sum(item.matches["embedding"].score >= t for item in clean_items)}
            for t in THRESHOLDS}  # fmt: skip


def own_split(train: list[Item], evaluation: list[Item], embed: Any) -> dict[str, Any]:
    """The eval split against the train split: totals, per signal, and a few flagged pairs."""
    tick = time.perf_counter()
    report = check_contamination(train, evaluation, ContaminationConfig(), None)
    ngram_s = time.perf_counter() - tick
    tick = time.perf_counter()
    full = check_contamination(train, evaluation, ContaminationConfig(embeddings=embed is not None), embed)
    examples = []
    for item in full.flagged[:3]:
        match = item.matches[item.flagged_by[0]]
        examples.append({"eval": evaluation[item.eval_index].text[:160], "train": train[match.train_index].text[:160],
                         "signals": {s: round(item.matches[s].score, 3) for s in item.flagged_by}})  # fmt: skip
    sweep = {}
    if "embedding" in full.signals:
        sweep = {f"{t:g}": sum(item.matches["embedding"].score >= t for item in full.items) for t in THRESHOLDS}
    return {**full.summary(), "ngram_flagged": len(report.flagged), "ngram_check_s": ngram_s,
            "full_check_s": time.perf_counter() - tick, "examples": examples, "embedding_sweep": sweep}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bench-contamination", help="directory for results.json")
    parser.add_argument("--per-kind", type=int, default=30, help="planted items per kind and environment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-embeddings", action="store_true")
    args = parser.parse_args(argv)
    tick = time.perf_counter()
    embed, why = (None, "off") if args.no_embeddings else minilm_embedder()
    results: dict[str, Any] = {"embedding": why or "all-MiniLM-L6-v2", "load_s": time.perf_counter() - tick,
                               "planted": {}, "own": {}}  # fmt: skip
    splits = {name: recipe_splits(path) for name, path in ENVS.items()}
    items = {name: (task_items(train), task_items(evaluation)) for name, (train, evaluation) in splits.items()}
    for name, (train, evaluation) in items.items():
        rng = random.Random(args.seed)
        others = [item for other, (_, ev) in items.items() if other != name for item in ev]
        clean = rng.sample(others, min(2 * args.per_kind, len(others)))
        if name == "math":
            far = task_items(recipe_splits(ENVS["math"], ["env.options.variant=far"])[1])
            clean += rng.sample(far, min(args.per_kind, len(far)))
        results["planted"][name] = score_planted(name, train, clean, args.per_kind, embed, args.seed)
        results["own"][name] = own_split(train, evaluation, embed)
        print(f"{name}: {json.dumps(results['own'][name]['by_signal'])}", file=sys.stderr)
    for name, (path, overrides) in VARIANTS.items():
        train, evaluation = recipe_splits(path, overrides)
        results["own"][name] = own_split(task_items(train), task_items(evaluation), embed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    return 0


def _pct(counts: dict[str, Any]) -> str:
    return f"{counts['found']}/{counts['of']}" if counts["of"] else "–"


def markdown(results: dict[str, Any]) -> str:
    """The tables docs/results/evaluation.md shows."""
    lines = ["| env | kind | " + " | ".join(["ngram13", "ngram8", "numbers8", "embedding", "n-grams", "any"]) + " |",
             "|---|---|" + "---:|" * 6]  # fmt: skip
    for env, result in results["planted"].items():
        for kind in KINDS:
            row = result["recall"][kind]
            cells = [_pct(row[s]) if s in row else "–" for s in ("ngram13", "ngram8", "numbers8", "embedding")]
            lines.append(f"| {env} | {kind} | " + " | ".join([*cells, _pct(row["ngram"]), _pct(row["any"])]) + " |")
    lines += ["", "| env | planted | clean | precision n-grams | precision any | clean flagged n-grams / any |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for env, r in results["planted"].items():
        fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {env} | {r['planted']} | {r['clean']} | {fmt(r['precision_ngram'])} | "
                     f"{fmt(r['precision_any'])} | {r['clean_flagged_ngram']} / {r['clean_flagged_any']} |")  # fmt: skip
    lines += ["", "| own split | eval | train | ngram13 | ngram8 | numbers8 | embedding | flagged | n-gram s | all s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for env, r in results["own"].items():
        by = r["by_signal"]
        cells = [str(by.get(s, "–")) for s in ("ngram13", "ngram8", "numbers8", "embedding")]
        lines.append(f"| {env} | {r['eval_items']} | {r['train_items']} | " + " | ".join(cells)
                     + f" | {r['flagged']} ({r['share']:.0%}) | {r['ngram_check_s']:.2f} | {r['full_check_s']:.1f} |")
    sweeps = [(env, r["embedding_sweep"]) for env, r in results["planted"].items() if r.get("embedding_sweep")]
    if sweeps:
        lines += ["", "| embedding cos ≥ | " + " | ".join(f"{env} near / clean / own" for env, _ in sweeps) + " |",
                  "|---|" + "---:|" * len(sweeps)]  # fmt: skip
        for t in THRESHOLDS:
            key = f"{t:g}"
            cells = [f"{sweep[key]['near_recall']:.2f} / {sweep[key]['clean_flagged']} / "
                     f"{results['own'][env]['embedding_sweep'][key]}" for env, sweep in sweeps]  # fmt: skip
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
