"""Resident memory of the demo policy's training passes: one row at a time (the RL
update's micro-batch), 60 rows of random lengths 150-640 tokens, half of each a loss
span; prints the RSS and the peak every 10 rows (docs/results/search-qa.md, "Cost").

    .venv/bin/python bench/train_memory.py float32|bfloat16
    PONDER_MMAP_THRESHOLD=0 .venv/bin/python bench/train_memory.py bfloat16

ponder fixes glibc's mmap threshold at 1 MiB when it loads a model on the CPU (large
blocks mapped and unmapped rather than kept in the heap: ponder.models.memory); the
second form leaves glibc's own, which rises to 32 MiB after the first large free.
"""

from __future__ import annotations

import random
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ponder.config import load_recipe  # noqa: E402
from ponder.models.forward import forward_policy  # noqa: E402
from ponder.models.prepare import prepare_policy  # noqa: E402


def rss_gb() -> float:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) / 1e6


def main() -> None:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    torch.set_num_threads(1)
    policy = prepare_policy(load_recipe("recipes/demo.yaml", [f"lora.base_matmul_dtype={dtype}"]))
    policy.model.train()
    rng = random.Random(0)
    print(dtype, "start", round(rss_gb(), 2), flush=True)
    for i in range(60):
        length = rng.randint(150, 640)
        ids, mask = torch.randint(100, 40000, (1, length)), torch.ones(1, length, dtype=torch.long)
        loss_mask = torch.zeros(1, length - 1)
        loss_mask[:, length // 2 :] = 1
        logprobs, _, _ = forward_policy(policy.model, ids, mask, loss_mask=loss_mask)
        (-(logprobs * loss_mask).sum()).backward()
        policy.model.zero_grad(set_to_none=True)
        if i % 10 == 9:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            print(dtype, i + 1, round(rss_gb(), 2), "peak", round(peak, 2), flush=True)


if __name__ == "__main__":
    main()
