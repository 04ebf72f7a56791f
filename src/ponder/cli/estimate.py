"""`ponder estimate RECIPE`: peak memory and time per stage before anything runs
(ponder.estimate); `--versus RUN_DIR`: the prediction against a finished run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Predict, before anything runs, what RECIPE (after key=value overrides) needs:

  memory  weights, the trained parameters (LoRA or all), gradients, AdamW state,
          the sampler's copy, KV caches at the rollout and evaluation batch and
          the token cap, activations of one micro-batch, a KL reference, value
          head or teacher where the recipe has them; each stage's peak
  time    the SFT warm-up, an RL step's rollouts (decode: bandwidth-bound),
          no-grad passes and update (compute-bound), the RL run, evaluations

The model's config is read (config.json; no weights load). Devices: cpu (this
machine, from --calibrate's measurement, else a conservative default) or a GPU
from its published peaks (h100, h100-pcie, h200, a100, a100-40gb, l40s, l4, a10,
rtx4090, t4) times a stated utilisation; --devices N spreads rollouts and
evaluations over N of them. Times are at the recipe's token caps (an upper
bound) unless --episode-tokens / --decode-tokens say otherwise. Every
assumption is printed under the tables.

--versus RUN_DIR compares the prediction for the run's recipe.yaml, at the
tokens its episodes had, with what it recorded (stage seconds, per-step
seconds, peak memory), each row's error in % of the measured value."""


def cmd_estimate(args: argparse.Namespace) -> int:
    from ponder.config import load_recipe
    from ponder.estimate import build_estimate
    from ponder.estimate.recipe import tokens_with
    from ponder.estimate.report import render, to_dict
    from ponder.fileio import dumps_strict

    if args.recipe and "=" in args.recipe and not args.recipe.endswith((".yaml", ".yml")):
        args.overrides, args.recipe = [args.recipe, *args.overrides], None  # an override, not a recipe
    if args.calibrate:
        _calibrate()
        if not args.recipe and not args.versus:
            return 0
    if args.versus:
        return _versus(args)
    if not args.recipe:
        raise ValueError("give a RECIPE, --versus RUN_DIR or --calibrate (see --help)")
    recipe = load_recipe(args.recipe, args.overrides)
    tokens = tokens_with(recipe, args.episode_tokens, args.decode_tokens)
    estimate = build_estimate(recipe, args.device, args.devices, tokens, args.mfu, args.bandwidth_util)
    if args.json:
        print(dumps_strict({"recipe": args.recipe, **to_dict(estimate)}, indent=2))
    else:
        render(estimate, _console())
    return 0


def _calibrate() -> None:
    from ponder.estimate.devices import calibrate_cpu, calibration_file

    measured = calibrate_cpu()
    print(f"calibrated this CPU ({measured['threads']} threads): {measured['matmul_gflops']:.0f} GFLOP/s fp32 "
          f"matmul, {measured['bandwidth_gbs']:.1f} GB/s; saved to {calibration_file()}", file=sys.stderr)  # fmt: skip


def _versus(args: argparse.Namespace) -> int:
    from ponder.config import load_recipe
    from ponder.estimate import build_estimate
    from ponder.estimate.recipe import tokens_with
    from ponder.estimate.report import to_dict
    from ponder.estimate.versus import compare, read_run, rows_dict, versus_table
    from ponder.fileio import dumps_strict

    measured = read_run(args.versus)
    recipe = load_recipe(measured.recipe_path, args.overrides)
    tokens = tokens_with(recipe, args.episode_tokens, args.decode_tokens, measured.tokens)
    estimate = build_estimate(recipe, args.device, args.devices, tokens, args.mfu, args.bandwidth_util)
    rows = compare(estimate, measured)
    if args.json:
        print(dumps_strict({"run_dir": str(args.versus), "rows": rows_dict(rows), "estimate": to_dict(estimate)},
                           indent=2))  # fmt: skip
        return 0
    console = _console()
    console.print(versus_table(rows, f"{args.versus}: predicted vs measured ({estimate.device.label})"))
    console.print(f"tokens per episode: {estimate.tokens.episode}, {estimate.tokens.decode} generated, from "
                  f"{estimate.tokens.source}", highlight=False)  # fmt: skip
    if not rows:
        print(f"ponder estimate: {args.versus} recorded no stage times or peaks to compare", file=sys.stderr)
    return 0


def _console() -> Any:
    from ponder.cli.core import _console

    return _console()


def register(commands: Any) -> None:
    """Add `estimate` to ponder's subcommands."""
    estimate = commands.add_parser("estimate", help="predict a recipe's peak memory and time per stage",
                                   description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    estimate.add_argument("recipe", nargs="?", metavar="RECIPE", help="YAML recipe, e.g. recipes/demo.yaml")
    estimate.add_argument("--device", metavar="NAME", help="cpu or a GPU of the table (default: this machine's "
                          "GPU when torch sees one, else its CPU)")  # fmt: skip
    estimate.add_argument("--devices", type=int, default=1, metavar="N", help="how many of them (default 1)")
    estimate.add_argument("--calibrate", action="store_true", help="measure this CPU's matmul GFLOP/s and memory "
                          "bandwidth (a few seconds) and keep them in ponder's cache dir for later estimates")
    estimate.add_argument("--mfu", type=float, metavar="F", help="share of the peak FLOP/s a training or "
                          "prefill pass reaches (default: the device's; printed)")
    estimate.add_argument("--bandwidth-util", type=float, metavar="F", help="share of the memory bandwidth a "
                          "decode step reaches (default: the device's; printed)")
    estimate.add_argument("--episode-tokens", type=int, metavar="N", help="tokens per episode, prompt and response "
                          "(default: rollout.sampling.max_total_tokens)")
    estimate.add_argument("--decode-tokens", type=int, metavar="N", help="tokens generated per episode (default: "
                          "env.max_turns x max_new_tokens_per_turn, at most the episode's)")
    estimate.add_argument("--versus", metavar="RUN_DIR", help="a finished `ponder demo` or `ponder train` run: "
                          "predicted vs measured per row, with the error in %%")
    estimate.add_argument("--json", action="store_true", help="print the estimate (or comparison) as JSON")
    estimate.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    estimate.set_defaults(handler=cmd_estimate)
