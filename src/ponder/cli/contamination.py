"""`ponder contamination TRAIN EVAL`: which evaluation items overlap the training data
(ponder.eval.contamination, ponder.eval.contamination_data)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Compare every item of EVAL with every item of TRAIN and list the evaluation
items that overlap one training item, with the signal that flagged each and its
score, then each signal's count and the share of EVAL flagged.

TRAIN and EVAL are each a recipe (.yaml: its environment's train split, or its
eval split, after key=value overrides), a task file or dataset (JSONL, Parquet,
a saved datasets directory, hf:NAME[:CONFIG]:SPLIT), SFT or DPO data (messages;
prompt, chosen, rejected) or trajectories (.parquet: actions, observations).

signals:
  ngram13   share of the eval item's word 13-grams found in one train item
  ngram8    the same with 8-grams (--short-ngram)
  numbers8  8-grams with every number (digits or words) as one placeholder:
            a copy with renamed numbers
  embedding cosine similarity of all-MiniLM-L6-v2 embeddings, for paraphrases
            (needs ponder[retrieval]; without it left out, with the reason)

Text is normalised first (case, Unicode, punctuation; arithmetic signs kept);
an item shorter than n words is compared whole. The table's train item is the
match of the first signal listed; --json and --out give every signal's."""


def cmd_contamination(args: argparse.Namespace) -> int:
    from ponder.cli.core import _console
    from ponder.eval.contamination import ContaminationConfig, contamination_table, summary_line
    from ponder.eval.contamination_data import check_items, read_pair, write_report
    from ponder.fileio import dumps_strict

    config = ContaminationConfig(args.ngram, args.short_ngram, not args.no_numbers, args.overlap, args.threshold,
                                 not args.no_embeddings)  # fmt: skip
    train, evaluation = read_pair(args.train, args.eval, args.overrides)
    report = check_items(train, evaluation, config)
    if args.out:
        write_report(report, args.out)
    if args.json:
        print(dumps_strict(report.to_dict(), indent=2))
    else:
        _console().print(contamination_table(report, args.show))
    print(summary_line(report) + (f"; wrote {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def register(commands: Any) -> None:
    """Add `contamination` to ponder's subcommands."""
    check = commands.add_parser("contamination", help="evaluation items that overlap the training data",
                                description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    check.add_argument("train", metavar="TRAIN", help="training data: a recipe, task file, dataset, SFT/DPO data or "
                       "trajectories")  # fmt: skip
    check.add_argument("eval", metavar="EVAL", help="evaluation data, in any of the same forms")
    check.add_argument("--ngram", type=int, default=13, metavar="N", help="the long shingle in words (default 13)")
    check.add_argument("--short-ngram", type=int, default=8, metavar="N",
                       help="the short shingle, also used with numbers replaced (default 8; 0 leaves it out)")
    check.add_argument("--overlap", type=float, default=0.5, metavar="SHARE",
                       help="an n-gram signal flags at this share of the eval item's n-grams (default 0.5)")
    check.add_argument("--threshold", type=float, default=0.9, metavar="COS",
                       help="the embedding signal flags at this cosine similarity (default 0.9)")
    check.add_argument("--no-numbers", action="store_true", help="leave out the renamed-numbers signal")
    check.add_argument("--no-embeddings", action="store_true", help="leave out the embedding signal")
    check.add_argument("--show", type=int, default=20, metavar="K", help="flagged items in the table (default 20; "
                       "0: all)")  # fmt: skip
    check.add_argument("--json", action="store_true", help="print the whole report as JSON instead of the table")
    check.add_argument("--out", metavar="REPORT.json", help="also write the whole report (every item) here")
    check.add_argument("overrides", nargs="*", metavar="key=value", help="overrides for a recipe source")
    check.set_defaults(handler=cmd_contamination)
