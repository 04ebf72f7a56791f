"""Decode speed of ponder's CPU decoder at a thread count, under whatever load the
machine has now (docs/benchmarks.md, "Under CPU contention").

    OMP_NUM_THREADS=2 .venv/bin/python bench/decode_threads.py --threads 2 --batch 1
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 .venv/bin/python bench/decode_threads.py --threads 2
    PONDER_CPU_THREADS=2 ...         # the count forced, not chosen by load

Prints the thread count, the wait policy, tokens/s of three `HFBackend.generate`
calls (after one warm-up) and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ponder.config import SamplingConfig  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout.backend import GenerationRequest  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = load_policy("smollm2-135m", "float32", "cpu")
    sampling = SamplingConfig(max_new_tokens_per_turn=args.new_tokens, max_total_tokens=args.new_tokens + 64)
    backend = HFBackend(policy, sampling, reuse_kv=False)
    ids = policy.tokenizer.encode(PROMPT)

    def rate(seed: int) -> float:
        requests = [GenerationRequest(f"{seed}-{i}", ids, args.new_tokens) for i in range(args.batch)]
        tick = time.perf_counter()
        out = backend.generate(requests, [])
        return sum(len(g.token_ids) for g in out) / (time.perf_counter() - tick)

    rate(0)
    rates = [round(rate(seed), 1) for seed in (1, 2, 3)]
    policy_name = os.environ.get("OMP_WAIT_POLICY", "default")
    print(f"threads {args.threads} batch {args.batch} wait {policy_name}: {rates} tokens/s; "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
