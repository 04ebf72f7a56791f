"""Time of an SFT step on the demo's own demonstrations with micro-batches of 1, 2
and 4 rows (docs/results/search-qa.md, "Cost"). Rows are sorted by length
before they are cut into micro-batches, so a micro-batch pads little and reads the
system prompt all its rows share once (ponder.models.forward).

    .venv/bin/python bench/sft_micro_batch.py --steps 6

Each step draws --rows demonstrations and times one forward and backward pass of
them at each micro-batch size, in turn (the order alternating), so a change in the
machine's load falls on all three; prints each step and the mean seconds per size.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ponder.config import load_recipe  # noqa: E402
from ponder.models.forward import forward_policy  # noqa: E402
from ponder.train.batch import collate  # noqa: E402
from ponder.models.prepare import prepare_policy  # noqa: E402
from ponder.jobs.parts import recipe_demonstrations  # noqa: E402

SIZES = (1, 2, 4)


def step_seconds(policy, rows: list, micro: int, keep_grads: bool = False) -> float:
    """Seconds of one forward and backward pass of `rows` in micro-batches of `micro`
    (the gradients zeroed after, unless `keep_grads`)."""
    batch = collate(rows, policy.tokenizer.pad_token_id)
    tokens = float(batch.loss_mask.sum())
    lengths = batch.attention_mask.sum(-1).tolist()
    order = sorted(range(len(batch)), key=lambda i: lengths[i])
    tick = time.perf_counter()
    for start in range(0, len(order), micro):
        part = batch.select(order[start : start + micro])
        mask = part.loss_mask
        logprobs, _, _ = forward_policy(policy.model, part.input_ids, part.attention_mask, loss_mask=mask)
        (-(logprobs * mask).sum() / tokens).backward()
    seconds = time.perf_counter() - tick
    if not keep_grads:
        policy.model.zero_grad(set_to_none=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/demo.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=8,
                        help="demonstrations per step (the demo's sft.batch_size)")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, [])
    policy = prepare_policy(recipe)
    demonstrations = recipe_demonstrations(recipe, policy)
    policy.model.train()
    rng = random.Random(0)
    times: dict[int, list[float]] = {size: [] for size in SIZES}
    for step in range(args.steps):
        rows = rng.sample(demonstrations, args.rows)
        for size in SIZES if step % 2 else reversed(SIZES):
            times[size].append(step_seconds(policy, rows, size))
        print(step, {size: round(t[-1], 2) for size, t in times.items()}, flush=True)
    print("mean seconds a step:", {size: round(statistics.mean(t), 2) for size, t in times.items()})


if __name__ == "__main__":
    main()
