"""`ponder improve` (RFT / STaR rounds, train/improve.py) and `ponder refine` (self-refine,
eval/refine.py)."""

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
    from ponder.jobs.improve import check_improve, run_improve
    from ponder.rundir import claim_run_dir, discard_on_error
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
    """Add `improve` and `refine` to ponder's subcommands."""
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
    register_refine(commands)


REFINE_DESCRIPTION = (
    "Self-refine on held-out tasks: answer, ask a critic to check the answer (the same policy, or a "
    "served model with --critic-url), answer again with the critique under the question, score each "
    "revision with the recipe's verifier; a task stops once a revision does not score higher. Prints "
    "the monotone-improvement rate (revisions scoring higher than what they replaced), the regression "
    "rate, and accuracy before, after (each task's last answer) and best-of (the verifier picks)."
)


def cmd_refine(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.config import load_recipe
    from ponder.eval.refine import refine, refinement_stats
    from ponder.fileio import write_json_atomic
    from ponder.models.adapters import load_adapter_weights
    from ponder.models.prepare import prepare_policy
    from ponder.rewards.judge import openai_completion
    from ponder.rundir import claim_run_dir
    from ponder.types import save_trajectories
    from ponder.wiring import check_parts, policy_completion

    recipe = load_recipe(args.recipe, args.overrides)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    check_parts(recipe)
    out = claim_run_dir(args.out, args.overwrite)
    policy = prepare_policy(recipe)
    if args.sft_from:
        load_adapter_weights(policy.model, _weights_dir(args.sft_from))
    critic = (openai_completion(args.critic_url, args.critic_model, max_tokens=args.critic_tokens) if args.critic_url
              else policy_completion(policy, args.critic_tokens))  # fmt: skip
    result = refine(recipe, policy, args.rounds, critic, args.verified, args.episodes)
    stats = refinement_stats(result.scores)
    for index, trajectories in enumerate(result.trajectories):
        save_trajectories(trajectories, out / f"round-{index}.parquet")
    write_json_atomic(out / "results.json", {"stats": stats, "scores": result.scores, "critiques": result.critiques})
    for key, value in stats.items():
        print(f"{key:34s} {value:.4f}")
    Console(stderr=True).print(f"wrote {out / 'results.json'} and round-N.parquet")
    return 0


def _weights_dir(path: str) -> str:
    from pathlib import Path

    return str(Path(path) / "sft") if (Path(path) / "sft").is_dir() else path


def register_refine(commands: Any) -> None:
    refine = commands.add_parser("refine", help="self-refine: answer, critique, revise; rate of improvement",
                                 description=REFINE_DESCRIPTION)  # fmt: skip
    refine.add_argument("--recipe", required=True, help="YAML recipe, e.g. recipes/math.yaml")
    refine.add_argument("--rounds", type=int, default=2, help="critique-and-revise rounds (default 2)")
    refine.add_argument("--episodes", type=int, help="held-out tasks (default eval.episodes)")
    refine.add_argument("--sft-from", metavar="DIR", help="trained weights: a demo run (its sft/) or an adapter directory")
    refine.add_argument("--critic-url", help="an OpenAI-compatible API root for the critic (default: the policy itself)")
    refine.add_argument("--critic-model", default="default", help="the critic's model name at --critic-url")
    refine.add_argument("--critic-tokens", type=int, default=96, help="tokens the critic may write (default 96)")
    refine.add_argument("--verified", default="correct", help="the reward component that verifies (default correct)")
    refine.add_argument("--out", default="runs/refine", help="output directory (default runs/refine)")
    refine.add_argument("--overwrite", action="store_true", help="replace the output already in --out")
    refine.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    refine.set_defaults(handler=cmd_refine)
