"""When to drop finished rows from a CPU decode batch: ponder's decoder (the `hf`
backend) at several values of `ponder.rollout.hf.COMPACT_AT`, rounds alternating,
the same prompts and sampling as bench/vllm_vs_ponder.py (docs/results/benchmarks.md,
"Finished rows").

    .venv/bin/python bench/finished_rows.py --batches 8 32 128 --at 0.999 0.875 0.75 0.5

Dropping rows copies every layer's cache; keeping a finished row costs its share of
each step. COMPACT_AT a: drop them once at most a of the batch still generates
(0.999: whenever a row finished, the rule before 2026-11-28). The backend drops them
at once in batches of at most hf.SMALL_BATCH rows; this bench sets that to 0 so the
sweep covers every batch size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_vs_ponder import prompts, tokens_per_s  # noqa: E402

from ponder.config import SamplingConfig  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout import HFBackend, hf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--at", type=float, nargs="+", default=[0.999, 0.75])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per batch size (median kept)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    policy = load_policy("smollm2-135m")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=args.new_tokens,
                              max_total_tokens=512, dtype=args.dtype)  # fmt: skip
    backend = HFBackend(policy, sampling, seed=0)
    tokens_per_s(backend, prompts(policy.tokenizer, 2), 8, -1)  # warm-up: packed weights
    hf.SMALL_BATCH, round_index = 0, 0
    for batch in args.batches:
        contexts = prompts(policy.tokenizer, batch)
        rates: dict[float, list[float]] = {at: [] for at in args.at}
        for _ in range(args.repeats):
            for at in args.at:
                hf.COMPACT_AT, round_index = at, round_index + 1
                rates[at].append(tokens_per_s(backend, contexts, args.new_tokens, round_index))
        cells = "  ".join(f"{at:g}: {statistics.median(r):6.1f}" for at, r in rates.items())
        print(f"batch {batch:>3}  tokens/s at COMPACT_AT  {cells}", flush=True)


if __name__ == "__main__":
    main()
