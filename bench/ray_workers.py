"""One against two Ray rollout workers (and the one-process run), per GRPO step:
step time, the Ray rollout call's wall time, the slowest worker's own rollout time,
the scheduling overhead (time in Ray calls minus that rollout: task submission,
transfers of tasks, weights and trajectories, loading the weights in the workers)
and the weight broadcast (state dict into the object store).

Configurations alternate round by round (local, 1 worker, 2 workers, local, …) so a
change in the machine's load hits them alike; each trainer runs one warm-up step
(workers build their sampling copy, Ray warms up) before the measured steps.

    OMP_NUM_THREADS=1 python bench/ray_workers.py --model smollm2-135m --rounds 2 \
        --steps 2 --out /tmp/ray_workers.json
    OMP_NUM_THREADS=1 python bench/ray_workers.py --configs "one process" \
        "one process, async" "2 Ray workers" "2 Ray workers, async" --out /tmp/async.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from ponder.jobs.parts import rl_trainer
from ponder.config import load_recipe  # noqa: E402
from ponder.train.ray.rollouts import RayRollouts, connect  # noqa: E402

RECIPE = [
    "train.tasks_per_step=4",
    "rollout.group_size=4",
    "rollout.batch_size=8",
    "rollout.sampling.max_new_tokens_per_turn=48",
    "env.max_turns=2",
    "algo.micro_batch_size=4",
    "train.save_every=1000",
    "tracking.trackers=[]",
]
KEYS = ("time/step_s", "time/rollout_s", "ray/worker_rollout_s", "ray/overhead_s", "ray/weights_sync_s", "time/update_s")


# name -> (Ray workers, 0 = one process; train.async_rollouts)
CONFIGS = {
    "one process": (0, False),
    "1 Ray worker": (1, False),
    "2 Ray workers": (2, False),
    "one process, async": (0, True),
    "2 Ray workers, async": (2, True),
}


def run_config(model: str, workers: int, overlap: bool, steps: int, out: Path) -> list[dict[str, float]]:
    """A fresh trainer (same seed each time), `workers` Ray workers (0: one process),
    rollouts overlapping the update or not; one warm-up step, then `steps` measured
    steps' timings (with overlap, a step's rollout time is the wait for its episodes)."""
    recipe = load_recipe(None, [f"model.name={model}", f"train.steps={steps + 2}", *RECIPE,
                                f"train.async_rollouts={str(overlap).lower()}"])  # fmt: skip
    trainer = rl_trainer(recipe, out)
    rollouts = RayRollouts(recipe, trainer.policy, workers=workers) if workers else None
    if rollouts is not None:
        trainer.use_rollouts(rollouts)
    measured = []
    try:
        for step in range(steps + 1):
            tick = time.perf_counter()
            metrics = trainer.train_step()
            metrics["time/step_s"] = time.perf_counter() - tick
            metrics["time/rollout_s"] = metrics["time/step_s"] - metrics["time/update_s"] - metrics["time/logprob_s"]
            trainer.step += 1
            if step > 0:
                measured.append({k: float(metrics.get(k, 0.0)) for k in KEYS})
    finally:
        trainer.drain()  # the next step's rollouts, still in flight with overlap
        if rollouts is not None:
            rollouts.close()
    return measured


def summary(results: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| configuration | step s | rollout s | worker rollout s | Ray overhead s | weights sync s | update s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows in results.items():
        cells = [f"{statistics.median(r[k] for r in rows):.2f}" for k in KEYS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per trainer (after one warm-up)")
    parser.add_argument("--out", default="/tmp/ray_workers.json")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS)[:3], choices=list(CONFIGS), metavar="NAME",
                        help=f"which to run, from: {'; '.join(CONFIGS)} (default: the first three)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    connect(None, num_cpus=2)  # a local cluster: two workers, one CPU each
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.configs}
    scratch = Path(args.out).with_suffix(".runs")
    for round_index in range(args.rounds):
        for index, name in enumerate(args.configs):
            rows = run_config(args.model, *CONFIGS[name], args.steps, scratch / f"{round_index}-{index}")
            results[name] += rows
            print(f"round {round_index} {name}: " + ", ".join(f"{k}={rows[-1][k]:.2f}" for k in KEYS), flush=True)
    table = summary(results)
    print(table)
    record = {"command": " ".join([sys.executable, *sys.argv]), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "recipe": RECIPE, "model": args.model, "results": results, "table": table}  # fmt: skip
    Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
