"""An SFT step on the demo's own demonstrations with the frozen base's products in
fp32 against bf16 (`lora.base_matmul_dtype`), and how far the LoRA gradient moves
(docs/results/benchmarks.md, "bf16 on a CPU").

    .venv/bin/python bench/train_dtype.py --steps 6

Two copies of the policy with the same adapters; each step draws --rows
demonstrations and times one forward and backward pass of them on each copy, in
turn (the order alternating, so a change in the machine's load falls on both);
prints each step's seconds, the gradient's relative gap ‖g_bf16 − g_fp32‖ / ‖g_fp32‖
and the cosine between them, and the means.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.sft_micro_batch import step_seconds  # noqa: E402
from ponder.config import load_recipe  # noqa: E402
from ponder.models.prepare import prepare_policy  # noqa: E402
from ponder.jobs.parts import recipe_demonstrations  # noqa: E402

DTYPES = ("float32", "bfloat16")


def gradient(policy) -> torch.Tensor:
    grads = [p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]
    policy.model.zero_grad(set_to_none=True)
    return torch.cat(grads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--recipe", default="recipes/demo.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=8,
                        help="demonstrations per step (the demo's sft.batch_size)")  # fmt: skip
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, [])
    policies = {}
    for dtype in DTYPES:
        lora = replace(recipe.lora, base_matmul_dtype=dtype)
        policies[dtype] = prepare_policy(replace(recipe, lora=lora))  # seeded: the same adapters on both
        policies[dtype].model.train()
    demonstrations = recipe_demonstrations(recipe, policies["float32"])
    rng = random.Random(0)
    times: dict[str, list[float]] = {dtype: [] for dtype in DTYPES}
    gaps, cosines = [], []
    for step in range(args.steps):
        rows = rng.sample(demonstrations, args.rows)
        grads = {}
        for dtype in DTYPES if step % 2 else reversed(DTYPES):
            times[dtype].append(step_seconds(policies[dtype], rows, 1, keep_grads=True))
            grads[dtype] = gradient(policies[dtype])
        exact, rounded = grads["float32"], grads["bfloat16"]
        gaps.append(float((rounded - exact).norm() / exact.norm()))
        cosine = torch.nn.functional.cosine_similarity(rounded.double(), exact.double(), dim=0)
        cosines.append(float(cosine))
        seconds = {d: round(t[-1], 2) for d, t in times.items()}
        print(step, seconds, f"gap {gaps[-1]:.4f} cos {cosines[-1]:.5f}", flush=True)
    means = {d: statistics.mean(t) for d, t in times.items()}
    print(f"mean seconds a step: fp32 {means['float32']:.2f}, bf16 {means['bfloat16']:.2f} "
          f"({means['float32'] / means['bfloat16']:.2f}x); gradient gap {statistics.mean(gaps):.4f}, "
          f"cosine {statistics.mean(cosines):.5f}")  # fmt: skip


if __name__ == "__main__":
    main()
