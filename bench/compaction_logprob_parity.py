"""Are compacted episodes token-exact? Samples held-out episodes of a recipe with context
compaction on (rollout.context), then recomputes every policy token's log-probability
with the trainer's forward pass at the same weights, each segment under the context
it was sampled in (train/segment_batch.py), and prints the mean and largest absolute
difference from the recorded ones; beside it the same tokens scored as one stream
(every token after everything before it), which is what compaction must not be
trained as.

    .venv/bin/python bench/compaction_logprob_parity.py --tasks 16 rollout.context.max_tokens=320
    .venv/bin/python bench/compaction_logprob_parity.py --smoke      # the tiny model

The recipe defaults to recipes/demo.yaml (search-QA); extra key=value overrides apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ponder.config import load_recipe  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout.engine import build_engine  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402
from ponder.train.batch import collate  # noqa: E402
from ponder.train.segment_batch import logprob_gap, segment_logprob_gap  # noqa: E402
from ponder.wiring import build_env  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    parser.add_argument("--model", default="smollm2-135m", help="a model name or a run's weights directory")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 2 tasks, a 400-token window")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.smoke:
        args.model, args.tasks = "tiny", 2
        overrides = ["env.max_turns=6", "env.options.max_invalid_actions=0",
                     "rollout.sampling.max_new_tokens_per_turn=16", "rollout.context.max_tokens=400",
                     *overrides]  # fmt: skip
    recipe = load_recipe(args.recipe, [f"model.name={args.model}", "rollout.group_size=1", *overrides])
    if not recipe.rollout.context.max_tokens:
        parser.error("set rollout.context.max_tokens (the window), e.g. rollout.context.max_tokens=320")
    policy = load_policy(args.model, dtype="float32")
    sampling = replace(recipe.rollout.sampling, temperature=1.0, dtype="float32")
    rollout = replace(recipe.rollout, batch_size=8, sampling=sampling)
    spec = build_env(recipe, policy.tokenizer)
    engine = build_engine(HFBackend(policy, sampling, seed=recipe.rollout.seed), spec.factory, rollout)
    trajectories, _ = engine.run(spec.eval[: args.tasks])
    exact = segment_logprob_gap(policy, trajectories, temperature=1.0)
    stream = logprob_gap(policy, collate(trajectories, policy.tokenizer.pad_token_id), temperature=1.0)
    compacted = [t for t in trajectories if t.segments]
    figures = {
        "model": args.model, "episodes": len(trajectories), "compacted_episodes": len(compacted),
        "segments": sum(len(t.segments) + 1 for t in trajectories), "policy_tokens": int(exact["tokens"]),
        "mean_abs_diff": exact["mean"], "max_abs_diff": exact["max"],
        "as_one_stream_mean_abs_diff": stream["mean"], "as_one_stream_max_abs_diff": stream["max"],
    }  # fmt: skip
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
