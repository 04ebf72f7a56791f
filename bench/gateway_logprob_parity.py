"""Are the logprobs the gateway records the trainer's? Runs an agent program through the
gateway on the embedded model (fp32, temperature 1), then recomputes every recorded
completion token's logprob with the trainer's forward pass (models.logprobs) at the same
weights, and prints the mean and largest absolute difference over the policy's tokens,
with the drift and rewrite counts.

    .venv/bin/python bench/gateway_logprob_parity.py --tasks 16
    .venv/bin/python bench/gateway_logprob_parity.py --smoke     # the tiny model

The program is examples/agents/openai_loop.py on the math tasks (recipes/gateway_math.yaml).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ponder.config import SamplingConfig, load_recipe  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.models.logprobs import token_logprobs  # noqa: E402
from ponder.rollout.engine import build_engine  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402
from ponder.wiring import build_env  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.tasks = "tiny", 2
    recipe = load_recipe(ROOT / "recipes" / "gateway_math.yaml", [f"model.name={args.model}", "rollout.group_size=1"])
    policy = load_policy(args.model, dtype="float32")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=80, max_total_tokens=1024, dtype="float32")
    spec = build_env(recipe, policy.tokenizer)
    engine = build_engine(HFBackend(policy, sampling, seed=0), spec.factory,
                          recipe.rollout.__class__(batch_size=8, group_size=1, sampling=sampling))  # fmt: skip
    trajectories, _ = engine.run(spec.eval[: args.tasks])
    differences = []
    with torch.no_grad():
        for trajectory in trajectories:
            ids = torch.tensor([trajectory.prompt_ids + trajectory.response_ids])
            recomputed = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, len(trajectory.prompt_ids) - 1 :]
            sampled = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
            differences.append((recomputed[sampled] - torch.tensor(trajectory.old_logprobs)[sampled]).abs())
    every = torch.cat(differences)
    figures = {"model": args.model, "episodes": len(trajectories), "policy_tokens": int(every.numel()),
               "mean_abs_diff": float(every.mean()), "max_abs_diff": float(every.max()),
               **engine.step_metrics()}  # fmt: skip
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.exit(main())
