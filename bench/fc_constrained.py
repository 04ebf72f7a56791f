"""Function calling with and without constrained calls: per BFCL category, the score
by BFCL's own checker and the format errors, for evaluations of the same held-out
questions (the `eval-*.parquet` files `ponder demo` / `ponder eval` write), plus the
paired difference of each labelled evaluation against the first.

A format error is a reply that opened a call (`<tool_call>`) the parser could not
read (bad JSON, no closing tag, a call without name or arguments).

    python bench/fc_constrained.py base=runs/fcw/eval-base.parquet \
        base+c=runs/fc-base-c/eval.parquet sft=runs/fcw/eval-sft.parquet ...
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import pyarrow.parquet as pq

CATEGORIES = ("simple_python", "multiple", "irrelevance")


def category(task_id: str) -> str:
    return next((c for c in CATEGORIES if task_id.startswith(c)), "other")


def scores(path: str) -> dict[str, tuple[str, float, bool]]:
    """task id -> (category, BFCL score, format error) for one evaluation file."""
    out = {}
    for row in pq.read_table(path).to_pylist():
        breakdown = {pair["key"]: pair["value"] for pair in row["breakdown"] or []}
        turn = (row["turns"] or [{}])[0]
        action = turn.get("action") or ""
        bad_parse = "<tool_call>" in action and bool(turn.get("error"))
        out[row["task_id"]] = (category(row["task_id"]), breakdown.get("bfcl", 0.0), bad_parse)
    return out


def paired(before: dict, after: dict) -> tuple[float, float]:
    diffs = [after[t][1] - before[t][1] for t in before if t in after]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return mean, se


def table(runs: dict[str, dict]) -> list[str]:
    first = next(iter(runs.values()))
    head = "| eval | all | " + " | ".join(CATEGORIES) + " | format errors | vs first (paired se) |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for label, run in runs.items():
        by = {c: [s for cat, s, _ in run.values() if cat == c] for c in CATEGORIES}
        cells = [f"{statistics.fmean(v):.3f}" if v else "" for v in by.values()]
        errors = sum(bad for *_, bad in run.values())
        mean, se = paired(first, run)
        versus = "" if run is first else f"{mean:+.3f} ({se:.3f})"
        total = statistics.fmean(s for _, s, _ in run.values())
        lines.append(f"| {label} | {total:.3f} | " + " | ".join(cells) + f" | {errors} / {len(run)} | {versus} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evals", nargs="+", metavar="LABEL=PARQUET", help="labelled evaluation files, first = baseline")
    parser.add_argument("--json", help="also write the per-category figures here")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.evals:
        label, _, path = item.partition("=")
        if not path:
            parser.error(f"{item!r}: give LABEL=PATH")
        runs[label] = scores(path)
    print("\n".join(table(runs)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({label: {t: list(v) for t, v in run.items()} for label, run in runs.items()}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
