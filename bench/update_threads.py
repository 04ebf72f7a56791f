"""Time of a training pass (forward and backward through the LoRA policy, the RL
update's and SFT's unit of work) at a thread count, idle and beside a competing
load (docs/results/benchmarks.md, "The update under contention").

    .venv/bin/python bench/update_threads.py                 # idle machine
    .venv/bin/python bench/update_threads.py --load 2        # then beside 2 busy processes

Each round times one pass of --rows rows of --tokens tokens at 2 threads, at 1, and
with the count ponder chooses (`ponder.models.cpu_threads.cpu_block`), in turn,
so a change in the machine's load falls on all three; prints the median seconds of
each and the counts chosen.
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

from bench.vllm_vs_ponder import competing_load  # noqa: E402
from ponder.config import LoraConfig  # noqa: E402
from ponder.models import apply_lora, load_policy  # noqa: E402
from ponder.models.cpu_threads import cpu_block, torch_threads  # noqa: E402
from ponder.models.forward import forward_policy  # noqa: E402


def training_pass(policy, ids: torch.Tensor, threads: int | None, chosen: list[int] | None = None) -> float:
    """Seconds of one forward and backward pass at `threads` threads (None: the count
    ponder chooses, appended to `chosen`)."""
    tick = time.perf_counter()
    with torch_threads(threads) if threads is not None else cpu_block():
        if chosen is not None:
            chosen.append(torch.get_num_threads())
        mask = torch.ones_like(ids)
        logprobs, _, _ = forward_policy(policy.model, ids, mask, loss_mask=mask[:, 1:])
        logprobs.sum().backward()
    policy.model.zero_grad(set_to_none=True)
    return time.perf_counter() - tick


def sweep(policy, ids: torch.Tensor, rounds: int, label: str) -> None:
    times: dict[str, list[float]] = {"2 threads": [], "1 thread": [], "chosen": []}
    chosen = []
    for _ in range(rounds):
        times["2 threads"].append(training_pass(policy, ids, 2))
        times["1 thread"].append(training_pass(policy, ids, 1))
        times["chosen"].append(training_pass(policy, ids, None, chosen))
    cells = "  ".join(f"{name} {statistics.median(v):6.2f}s" for name, v in times.items())
    print(f"{label:>5}: {cells}  (chose {chosen}; load average {os.getloadavg()[0]:.2f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load", type=int, default=0, help="then again beside N busy processes (0: idle only)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds the load runs before measuring")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    policy = apply_lora(load_policy("smollm2-135m", "float32", "cpu"), LoraConfig(r=16, alpha=32))
    policy.model.train()
    ids = torch.randint(0, policy.tokenizer.vocab_size, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    training_pass(policy, ids, 2)  # warm-up
    sweep(policy, ids, args.rounds, "idle")
    if args.load:
        load = competing_load(args.load)
        try:
            time.sleep(args.settle)
            sweep(policy, ids, args.rounds, f"load {args.load}")
        finally:
            os.killpg(load.pid, 9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
