"""`ponder export-data`: ponder's data in TRL's and verl's dataset layouts (ponder.jobs.export_data)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Write ponder's data in the layout another trainer reads, as a .parquet or .jsonl file.

SOURCE is a run directory or a trajectory file (its episodes; the run's recipe.yaml
rebuilds each task's prompt), SFT data (rows with `messages`), DPO data (`prompt`,
`chosen`, `rejected`), or tasks (a task file, verl or TRL data, hf:NAME[:CONFIG]:SPLIT).
Without SOURCE, --recipe's own tasks of --split are written.

layouts:
  trl-messages           {messages}: conversations (SFT data; episodes that answered)
  trl-prompt-completion  {prompt, completion}: the same, split at the first reply
  trl-preference         {prompt, chosen, rejected}: DPO data; per task, the best and
                         the worst episode of a run when they scored apart
  trl-prompt             {prompt, answers, id, kind}: TRL's prompt-only RL data (GRPO)
  verl-rl                {data_source, prompt, ability, reward_model: {style,
                         ground_truth}, extra_info: {split, index, id, question}}
  verl-sft               {messages, data_source, extra_info}: verl's multi-turn SFT

Messages hold role and content (tool calls ponder's tag protocols make stay in the
reply's text, as the model wrote them). The file is written atomically. ponder reads
the verl and TRL files back as tasks (env.format), docs/guide/data.md."""


def cmd_export_data(args: argparse.Namespace) -> int:
    from ponder.jobs.export_data import export_data

    rows = export_data(args.source, args.layout, args.out, args.recipe, args.split, args.min_reward,
                       args.data_source)  # fmt: skip
    print(f"wrote {rows} rows ({args.layout}) to {args.out}", file=sys.stderr)
    return 0


def register(commands: Any) -> None:
    """Add `export-data` to ponder's subcommands."""
    from ponder.data.export import LAYOUTS

    export = commands.add_parser("export-data", help="trajectories, SFT/DPO data and tasks in TRL's or verl's "
                                 "dataset layouts", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    export.add_argument("source", nargs="?", help="a run dir, trajectory .parquet, SFT/DPO data or a task source")
    export.add_argument("--layout", required=True, choices=LAYOUTS.names(), help="the layout to write (above)")
    export.add_argument("--out", required=True, help="the file to write: .parquet or .jsonl")
    export.add_argument("--recipe", help="the recipe whose environment builds the prompts (default: a run's own "
                        "recipe.yaml; none for plain data)")  # fmt: skip
    export.add_argument("--split", default="train", choices=["train", "eval"],
                        help="the recipe's split to write without SOURCE; verl's extra_info.split (default train)")
    export.add_argument("--min-reward", type=float, metavar="R",
                        help="episodes: keep conversations that scored at least R (default: every one that answered)")
    export.add_argument("--data-source", default="", metavar="NAME",
                        help="verl's data_source (default: each task's kind; e.g. openai/gsm8k picks verl's "
                             "GSM8K scorer)")  # fmt: skip
    export.set_defaults(handler=cmd_export_data)
