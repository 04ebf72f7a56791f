"""What ponder's thread choice costs beside a competing load: batch-1 decode calls with
the count chosen by load (`ponder.models.cpu_threads`, torch at 2 threads) and with
one thread forced, alternating, --pause seconds apart, beside N busy processes (a
session of their own, as in bench/vllm_vs_ponder.py --load). docs/results/benchmarks.md,
"Under contention, profiled".

    .venv/bin/python bench/thread_choice.py --load 2 --calls 6

Prints, per call, milliseconds per generated token: wall, CPU and run-queue time of
this process (its schedstat), and the time the choice itself took (`step_threads`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import ponder.models.cpu_threads as cpu_threads  # noqa: E402
from bench.vllm_vs_ponder import competing_load, prompts, schedstat  # noqa: E402
from ponder.config import SamplingConfig  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout import GenerationRequest, HFBackend  # noqa: E402

CHOICE_S: list[float] = []
STEP_THREADS = cpu_threads.step_threads


def timed_choice() -> int:
    """`step_threads`, timed (cpu_block calls it by its module name)."""
    tick = time.perf_counter()
    threads = STEP_THREADS()
    CHOICE_S.append(time.perf_counter() - tick)
    return threads


def one_call(backend, contexts, mode: str, key: str, new_tokens: int) -> tuple[float, ...]:
    """(wall, CPU, run-queue, choice) milliseconds per token of one generate call."""
    os.environ[cpu_threads.ENV_VAR] = mode
    requests = [GenerationRequest(f"{key}-{i}", c, new_tokens) for i, c in enumerate(contexts)]
    run, wait = schedstat(SimpleNamespace())
    tick = time.perf_counter()
    tokens = sum(len(g.token_ids) for g in backend.generate(requests, []))
    wall = time.perf_counter() - tick
    run_after, wait_after = schedstat(SimpleNamespace())
    spent = (wall, run_after - run, wait_after - wait, CHOICE_S[-1])
    return tuple(round(1e3 * s / tokens, 1) for s in spent)


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the calls")
    parser.add_argument("--calls", type=int, default=6, help="calls per mode")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds before each call")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    cpu_threads.step_threads = timed_choice
    policy = load_policy("smollm2-135m")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=args.new_tokens, max_total_tokens=512)
    backend = HFBackend(policy, sampling, seed=0)
    contexts = prompts(policy.tokenizer, 1)
    for mode in ("1", "auto"):  # warm-up, and the process's first decision (a fresh window)
        one_call(backend, contexts, mode, f"warm-{mode}", 8)
    load = competing_load(args.load)
    try:
        time.sleep(20.0)
        calls: dict[str, list[tuple[float, ...]]] = {"auto": [], "1": []}
        for index in range(args.calls):
            for mode, rows in calls.items():
                time.sleep(args.pause)
                rows.append(one_call(backend, contexts, mode, f"{mode}-{index}", args.new_tokens))
    finally:
        os.killpg(load.pid, 9)
    print("ms per token: wall / CPU / run queue / the choice itself", flush=True)
    for mode, rows in calls.items():
        median = statistics.median(r[0] for r in rows)
        name = "chosen" if mode == "auto" else "one thread"
        print(f"{name:>10}: median wall {median:.1f}  {rows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
