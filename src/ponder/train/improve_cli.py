"""`ponder improve`: rejection-sampling fine-tuning / STaR rounds (train/improve.py)."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "Grow a policy on its own verified answers. Each round samples K answers per training task, keeps "
    "the verified ones (and, with improve.rationalize, STaR's rationalisations: a failed task retried "
    "with its answer as a hint, kept if it then verifies and trained on without the hint), SFT-trains "
    "on them (section sft) and evaluates on held-out tasks. Per round: held-out accuracy ± its "
    "standard error, pass@1 / pass@K of the samples and diversity (distinct answers, bigram entropy). "
    "Settings live in the recipe's `improve` section; the flags below override them."
)


def cmd_improve(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.config import load_recipe
    from ponder.rundir import claim_run_dir, discard_on_error
    from ponder.train.improve import check_improve, run_improve
    from ponder.wiring import check_parts

    recipe = load_recipe(args.recipe, args.overrides)
    for flag, key in (("rounds", "rounds"), ("samples", "samples"), ("tasks", "tasks"), ("episodes", "eval_episodes")):
        if getattr(args, flag) is not None:
            setattr(recipe.improve, key, getattr(args, flag))
    check_improve(recipe)
    check_parts(recipe)  # a bad env or reward fails before the run directory is made
    out = claim_run_dir(args.out, args.overwrite)
    console = Console(stderr=True)
    with discard_on_error(out):
        run_improve(recipe, out, args.sft_from, say=console.print)
    console.print(f"wrote {out / 'results.json'}, {out / 'metrics.jsonl'} and round-NN/ weights")
    return 0


def register(commands: Any) -> None:
    """Add `improve` to ponder's subcommands."""
    improve = commands.add_parser("improve", help="RFT / STaR rounds: sample, keep verified answers, SFT, repeat",
                                  description=DESCRIPTION)  # fmt: skip
    improve.add_argument("--recipe", required=True, help="YAML recipe, e.g. recipes/math.yaml")
    improve.add_argument("--rounds", type=int, help="rounds (improve.rounds, default 3)")
    improve.add_argument("--samples", type=int, help="answers sampled per task, K (improve.samples, default 4)")
    improve.add_argument("--tasks", type=int, help="training tasks per round, 0 = all (improve.tasks, default 64)")
    improve.add_argument("--episodes", type=int, help="held-out tasks per evaluation (improve.eval_episodes)")
    improve.add_argument("--sft-from", metavar="DIR",
                         help="start from these trained weights: a demo run (its sft/) or an adapter directory")
    improve.add_argument("--out", default="runs/improve", help="run directory (default runs/improve)")
    improve.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    improve.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    improve.set_defaults(handler=cmd_improve)
