"""Where ponder's GRPO bench step spends its time and memory (docs/results/benchmarks.md, Profile).

Runs ponder's side of `bench/grpo_vs_trl.py` alone on the single-turn workload (the
same trainer and settings) for a warm-up step and `--steps` measured ones, and reports:

- peak resident memory (RSS) in each phase of the step (generation, reference
  logprobs, update), sampled every 2 ms from /proc/self/statm;
- a cProfile of the measured steps: the functions with the most time of their own.

    .venv/bin/python bench/profile_step.py --threads 2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_MIB


class PhaseMemory:
    """Peak RSS per phase label, from a sampling thread."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.phase, self.peaks, self.interval_s = "load", {}, interval_s
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss_mib())
            time.sleep(self.interval_s)

    def labelled(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            outer, self.phase = self.phase, label
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = outer

        return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a name bench.prepare knows, or a local HF directory")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--micro-batch", type=int, default=4, help="ponder's episodes per forward/backward (0: all)")
    parser.add_argument("--steps", type=int, default=2, help="measured (profiled) steps after one warm-up step")
    parser.add_argument("--top", type=int, default=15, help="functions listed, by own time")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 (base weights)")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--torch-profile", action="store_true",
                        help="torch.profiler instead of cProfile: operators by own CPU and GPU time")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    memory = PhaseMemory()
    import ponder.train.rl as rl
    from bench.common import BenchConfig
    from bench.ponder_side import PonderSide
    from bench.prepare import base_model_dir

    rl.forward_pass_no_grad = memory.labelled("reference logprobs", rl.forward_pass_no_grad)
    rl.optimise = memory.labelled("update", rl.optimise)
    model = args.model if Path(args.model).is_dir() else str(base_model_dir(args.model))
    cfg = BenchConfig(workload="single", model=model, threads=args.threads, micro_batch=args.micro_batch,
                      device=args.device, dtype=args.dtype, prompts_per_step=args.prompts_per_step,
                      group_size=args.group_size, max_new_tokens=args.max_new_tokens)  # fmt: skip
    side = PonderSide(cfg)
    rollouts = side.trainer.rollouts
    rollouts.run = memory.labelled("generation", rollouts.run)  # type: ignore[method-assign]
    memory.phase = "step (other)"
    side.step()  # warm-up: builds the sampling copy, allocator pools
    if args.torch_profile:
        return _torch_profile(side, args)
    profile = cProfile.Profile()
    for _ in range(args.steps):
        profile.enable()
        times = side.step()
        profile.disable()
        print("step: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items() if k.endswith("_s")), flush=True)
    print("\npeak RSS by phase (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.peaks.items()))
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    return 0


def _torch_profile(side: Any, args: argparse.Namespace) -> int:
    """Operators of the measured steps' update by own CPU time and own GPU time."""
    import ponder.train.rl as rl
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    optimise = rl.optimise

    def profiled(*a: Any, **k: Any) -> Any:
        with profile(activities=activities) as prof:
            out = optimise(*a, **k)
        for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if args.device == "cuda" else []):
            print(prof.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=48))
        return out

    rl.optimise = profiled
    for _ in range(args.steps):
        times = side.step()
        print("step: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items() if k.endswith("_s")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
