"""Decode speed of ponder's CPU decoder at a thread count, under whatever load the
machine has now (docs/results/benchmarks.md, "Under CPU contention").

    OMP_NUM_THREADS=2 .venv/bin/python bench/decode_threads.py --threads 2 --batch 1
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 .venv/bin/python bench/decode_threads.py --threads 2
    PONDER_CPU_THREADS=2 ...         # the count forced, not chosen by load

Prints the thread count, the wait policy, tokens/s of three `HFBackend.generate`
calls (after one warm-up) and the load average.

Several counts and batches, alternating call by call (the count forced through
PONDER_CPU_THREADS), medians over --rounds: which count is faster at which batch on
a free machine (docs/results/benchmarks.md, "One thread or two, by batch"):

    .venv/bin/python bench/decode_threads.py --threads 1 2 --batch 1 2 4 8 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ponder.config import SamplingConfig  # noqa: E402
from ponder.models.cpu_threads import ENV_VAR  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout.backend import GenerationRequest  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="counts (several alternate)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per count and batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(args.threads))
    policy = load_policy("smollm2-135m", "float32", "cpu")
    sampling = SamplingConfig(max_new_tokens_per_turn=args.new_tokens, max_total_tokens=args.new_tokens + 64)
    backend = HFBackend(policy, sampling, reuse_kv=False)
    ids = policy.tokenizer.encode(PROMPT)

    def rate(seed: int, batch: int, threads: int) -> float:
        if len(args.threads) > 1:
            os.environ[ENV_VAR] = str(threads)
        else:
            torch.set_num_threads(threads)
        requests = [GenerationRequest(f"{seed}-{i}", ids, args.new_tokens) for i in range(batch)]
        tick = time.perf_counter()
        out = backend.generate(requests, [])
        return sum(len(g.token_ids) for g in out) / (time.perf_counter() - tick)

    rates: dict[tuple[int, int], list[float]] = {(b, t): [] for b in args.batch for t in args.threads}
    for batch in args.batch:
        for threads in args.threads:
            rate(0, batch, threads)  # warm-up
    for seed in range(1, args.rounds + 1):
        for batch in args.batch:
            for threads in args.threads:
                rates[batch, threads].append(round(rate(seed, batch, threads), 1))
    wait = os.environ.get("OMP_WAIT_POLICY", "default")
    for batch in args.batch:
        parts = [f"{t} threads {statistics.median(rates[batch, t]):6.1f}" for t in args.threads]
        print(f"batch {batch:3d} wait {wait}: " + "  ".join(parts) + f" tokens/s (median of {args.rounds}); "
              f"each {[rates[batch, t] for t in args.threads]}")  # fmt: skip
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
