"""Forgetting on a sequence of synthetic task families: naive sequential fine-tuning
vs rehearsal (reservoir replay) vs EWC, with AA / BWT / FWT.

Families are the search-QA task kinds, trained in the order single_hop → multi_hop
→ in_prompt: the last one teaches "answer from the prompt, do not search", which
conflicts with what the first taught. Each family's data are oracle demonstrations
replayed through the real environment (train split), scored on held-out tasks
(eval split) by teacher-forced turn accuracy (ponder.jobs.sequence).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/continual_forgetting.py --out runs/continual
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from ponder.config import ContinualConfig, LoraConfig, PipelineRecipe, SFTTrainerConfig, load_recipe
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions
from ponder.eval.agent_metrics import forgetting_metrics
from ponder.fileio import write_text_atomic
from ponder.models import apply_lora, load_policy
from ponder.tools.retrieval import build_retriever
from ponder.train.dpo import trajectory_example
from ponder.jobs.sequence import Family, train_sequence
from ponder.train.sft import build_demonstrations

ORDER = ("single_hop", "multi_hop", "in_prompt")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--recipe", default="recipes/pipeline_search_qa.yaml", help="env and rollout settings"
    )
    parser.add_argument(
        "--world-eval-tasks", type=int, default=64,
        help="taskgen.n_eval of the world the families come from, pinned so the held-out "
        "demonstrations do not move when the recipe's evaluation size changes",
    )
    parser.add_argument("--train-per-family", type=int, default=16)
    parser.add_argument("--eval-per-family", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="SFT steps per family")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--replay-capacity", type=int, default=16)
    parser.add_argument("--replay-ratio", type=float, default=0.5)
    parser.add_argument(
        "--ewc-lambda", type=float, default=1e4,
        help="EWC penalty weight (1e3 changed little here, 1e5 and up froze the model; docs/results/pipeline.md)",
    )
    parser.add_argument("--fisher-examples", type=int, default=8)
    parser.add_argument("--methods", default="naive,replay,ewc")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/continual")
    return parser.parse_args(argv)


def build_families(args: argparse.Namespace, tokenizer_policy) -> list[Family]:
    overrides = [f"model.name={args.model}", f"env.options.taskgen.n_eval={args.world_eval_tasks}"]
    recipe = load_recipe(args.recipe, overrides, cls=PipelineRecipe)
    options = SearchQAOptions.from_recipe(recipe)
    data = load_search_qa(options)
    retriever = build_retriever(options.retriever.kind, data.corpus)
    factory = SearchQAEnvFactory.from_recipe(recipe, retriever, tokenizer_policy.tokenizer)
    families = []
    for kind in ORDER:
        train = [t for t in data.train if t.kind == kind][: args.train_per_family]
        held_out = [t for t in data.eval if t.kind == kind][: args.eval_per_family]
        demos = [
            build_demonstrations(tasks, "oracle", factory, tokenizer_policy, recipe)
            for tasks in (train, held_out)
        ]
        families.append(
            Family(kind, [trajectory_example(t) for t in demos[0]], [trajectory_example(t) for t in demos[1]])
        )
    return families


def run_method(method: str, args: argparse.Namespace, families: list[Family], out: Path) -> dict:
    continual = ContinualConfig(
        replay_capacity=args.replay_capacity if method == "replay" else 0,
        replay_ratio=args.replay_ratio,
        ewc_lambda=args.ewc_lambda if method == "ewc" else 0.0,
        fisher_examples=args.fisher_examples,
    )
    sft = SFTTrainerConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        micro_batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=1,
        schedule="constant",
    )
    torch.manual_seed(args.seed)  # every method starts from the same adapters
    policy = apply_lora(load_policy(args.model, device="cpu"), LoraConfig(r=16, alpha=32))
    tick = time.perf_counter()
    result = train_sequence(
        policy,
        families,
        sft,
        continual,
        out / method,
        args.seed,
        say=lambda s: print(f"[{method}] {s}", flush=True),
    )
    metrics = forgetting_metrics(result.accuracy, result.baseline)
    penalty = max((h.get("sft/ewc_penalty", 0.0) for h in result.history), default=0.0)
    return {
        "method": method,
        **metrics,
        "max_ewc_penalty": penalty,
        "ewc_lambda": continual.ewc_lambda,
        "accuracy": result.accuracy,
        "token_accuracy": result.token_accuracy,
        "baseline": result.baseline,
        "families": result.families,
        "wall_s": time.perf_counter() - tick,
    }


def table(rows: list[dict]) -> str:
    lines = ["| method | AA | BWT | FWT | final accuracy per family | wall s |", "|---|---|---|---|---|---|"]
    for row in rows:
        final = ", ".join(f"{f} {a:.3f}" for f, a in zip(row["families"], row["accuracy"][-1]))
        lines.append(
            f"| {row['method']} | {row['AA']:.3f} | {row['BWT']:+.3f} | {row['FWT']:+.3f} | {final} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = build_families(args, load_policy(args.model, device="cpu"))
    print(
        "families: "
        + ", ".join(f"{f.name} ({len(f.train)} train, {len(f.eval)} held out)" for f in families),
        flush=True,
    )
    rows = []
    for method in args.methods.split(","):
        rows.append(run_method(method, args, families, out))
        write_text_atomic(
            out / "results.json", json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n"
        )
        write_text_atomic(out / "table.md", table(rows))
        print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
