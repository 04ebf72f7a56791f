"""`ponder train-adapters`: several LoRA adapters RL-trained in one run (ponder.jobs.adapters)."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "Train several LoRA adapters on one frozen base in one run. ADAPTERS is a YAML file mapping each "
    "adapter's name to its recipe overrides (dotted keys, e.g. `alice: {optim.lr: 1.0e-4, "
    "env.options.taskgen.seed: 1}`), applied on top of --recipe and the command line's KEY=VALUE. Each "
    "adapter has its own tasks, reward, optimizer, learning rate, seed and checkpoints; the model and "
    "rollout sections are shared. Every step samples all adapters' episodes in one batch (each row "
    "under its own adapter) and then updates each adapter alone. Writes OUT/adapters/NAME, a normal "
    "run directory per adapter: `ponder eval --model OUT/adapters/NAME` evaluates one."
)


def cmd_train_adapters(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.jobs.adapters import adapter_recipes, read_adapters_file, run_train_adapters
    from ponder.jobs.demo import warm_up_weights
    from ponder.rundir import claim_run_dir, discard_on_error

    # a bad adapters file or recipe fails before the run directory is made
    recipes = adapter_recipes(args.recipe, args.overrides, read_adapters_file(args.adapters))
    if args.sft_from:
        for recipe in recipes.values():
            warm_up_weights(args.sft_from, recipe)
    out = claim_run_dir(args.out, args.overwrite)
    console = Console(stderr=True)
    with discard_on_error(out):
        run_train_adapters(recipes, out, say=console.print, sft_from=args.sft_from)
    console.print(f"wrote one run per adapter under {out / 'adapters'}")
    return 0


def register(commands: Any) -> None:
    """Add `train-adapters` to ponder's subcommands."""
    short = "RL-train several LoRA adapters on one base in one run"
    train = commands.add_parser("train-adapters", help=short, description=DESCRIPTION)
    train.add_argument("adapters", metavar="ADAPTERS", help="YAML: adapter name -> its recipe overrides")
    train.add_argument("--recipe", default=None, metavar="YAML", help="the base recipe (default: the demo's)")
    train.add_argument("--out", default="runs/adapters", help="output directory (default runs/adapters)")
    train.add_argument("--sft-from", default=None, metavar="RUN",
                       help="start every adapter from RUN's SFT warm-up (a finished `ponder demo` or "
                            "`ponder train` run of the same recipe; the adapters keep its LoRA rank)")
    train.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every adapter")
    train.set_defaults(handler=cmd_train_adapters)
