"""`ponder warmup`: one SFT warm-up shared by several recipes (ponder.jobs.shared_warmup)."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "One SFT warm-up for several recipes: each recipe's demonstrations (its env and sft section), one "
    "adapter trained on all of them (the recipes' common sft batch size and lr, for the sum of their "
    "steps). Writes OUT/sft (the adapter), OUT/warmup.json, and per recipe OUT/NAME (NAME: the recipe "
    "file's stem) with the adapter and the recipe as run, so RL starts from it with "
    "`ponder demo --recipe OUT/NAME/recipe.yaml --sft-from OUT/NAME`, and `ponder merge` takes "
    "`base_model: OUT/sft` to merge what RL changed on each task."
)


def cmd_warmup(args: argparse.Namespace) -> int:
    from ponder.jobs.shared_warmup import warm_up_recipes

    return warm_up_recipes(args.recipe, args.out, args.overwrite)


def register(commands: Any) -> None:
    """Add `warmup` to ponder's subcommands."""
    short = "one SFT warm-up shared by several recipes (for RL, merging)"
    warmup = commands.add_parser("warmup", help=short, description=DESCRIPTION)
    warmup.add_argument("--recipe", action="append", required=True, metavar="YAML",
                        help="a recipe whose demonstrations join the warm-up; give it once per recipe")
    warmup.add_argument("--out", default="runs/warmup", help="output directory (default runs/warmup)")
    warmup.add_argument("--overwrite", action="store_true", help="replace the warm-up already in --out")
    warmup.set_defaults(handler=cmd_warmup)
