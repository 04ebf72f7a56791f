"""Forgetting on a sequence of task families, one continual-learning method per row
(`continual.method`: naive, replay, ewc, si, mas, agem, derpp, lora_per_task), with
AA / BWT / FWT.

Families are task kinds of the recipe's environment, trained in the order given. By
default the search-QA kinds single_hop → multi_hop → in_prompt: the last one teaches
"answer from the prompt, do not search", which conflicts with what the first taught.
With the math + search-QA mixture, a fourth family (math word problems) follows.
Each family's data are oracle demonstrations replayed through the real environment
(train split), scored on held-out tasks (eval split) by teacher-forced turn accuracy
(ponder.jobs.sequence).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/continual_forgetting.py --out runs/continual
    # four families, every method in one table:
    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/continual_forgetting.py \\
        --recipe recipes/mixture_math_search.yaml \\
        --families search_qa/single_hop,search_qa/multi_hop,search_qa/in_prompt,math/level1 \\
        --methods all --out runs/continual-4
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

from ponder.config import ContinualConfig, LoraConfig, PipelineRecipe, SFTTrainerConfig, load_recipe, to_dict
from ponder.eval.agent_metrics import forgetting_metrics
from ponder.fileio import write_text_atomic
from ponder.jobs.sequence import Family, train_sequence
from ponder.models import apply_lora, load_policy
from ponder.train.continual_methods import CONTINUAL_METHODS
from ponder.train.dpo import trajectory_example
from ponder.train.sft import build_demonstrations
from ponder.wiring import build_env

ORDER = ("single_hop", "multi_hop", "in_prompt")
ALL = ("naive", "replay", "ewc", "si", "mas", "agem", "derpp", "lora_per_task")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument(
        "--recipe", default="recipes/pipeline_search_qa.yaml", help="env and rollout settings"
    )
    parser.add_argument("--families", default=",".join(ORDER), help="task kinds of the recipe's env, in order")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override")
    parser.add_argument(
        "--world-eval-tasks", type=int, default=64,
        help="search-QA only: taskgen.n_eval of the world the families come from, pinned so the held-out "
        "demonstrations do not move when the recipe's evaluation size changes",
    )
    parser.add_argument("--train-per-family", type=int, default=16)
    parser.add_argument("--eval-per-family", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="SFT steps per family")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument(
        "--replay-capacity", type=int, default=16, help="the buffer of replay, and the memory of agem and derpp"
    )
    parser.add_argument("--replay-ratio", type=float, default=0.5)
    parser.add_argument(
        "--ewc-lambda", type=float, default=1e4,
        help="EWC penalty weight (1e3 changed little here, 1e5 and up froze the model; docs/results/pipeline.md)",
    )
    parser.add_argument("--fisher-examples", type=int, default=8, help="EWC's Fisher and MAS's importance")
    parser.add_argument("--si-c", type=float, default=1.0)
    parser.add_argument("--si-xi", type=float, default=1e-3)
    parser.add_argument("--mas-lambda", type=float, default=1.0)
    parser.add_argument("--memory-batch-size", type=int, default=4, help="A-GEM's and DER++'s memory batches")
    parser.add_argument("--derpp-alpha", type=float, default=0.5)
    parser.add_argument("--derpp-beta", type=float, default=0.5)
    parser.add_argument("--derpp-topk", type=int, default=64)
    parser.add_argument("--lora-router", default="task", help="lora_per_task: task or centroid")
    parser.add_argument("--lora-merge", default="ties", help="lora_per_task: a ponder merge method, or '' for none")
    parser.add_argument("--lora-merge-density", type=float, default=0.5, help="TIES's density, DARE's 1 − drop rate")
    parser.add_argument("--methods", default="naive,replay,ewc", help=f"comma-separated, or all ({','.join(ALL)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/continual")
    args = parser.parse_args(argv)
    args.methods = ",".join(ALL) if args.methods == "all" else args.methods
    return args


def build_families(args: argparse.Namespace, tokenizer_policy) -> list[Family]:
    """The demonstrations of each kind in args.families: the first train-per-family of
    its training tasks and eval-per-family of its held-out ones."""
    overrides = [f"model.name={args.model}", *args.set]
    if load_recipe(args.recipe, overrides, cls=PipelineRecipe).env.kind == "search_qa":
        overrides.append(f"env.options.taskgen.n_eval={args.world_eval_tasks}")
    recipe = load_recipe(args.recipe, overrides, cls=PipelineRecipe)
    spec = build_env(recipe, tokenizer_policy.tokenizer)
    families = []
    for kind in args.families.split(","):
        train = [t for t in spec.train if t.kind == kind][: args.train_per_family]
        held_out = [t for t in spec.eval if t.kind == kind][: args.eval_per_family]
        if not train or not held_out:
            kinds = sorted({t.kind for t in spec.train})
            raise SystemExit(f"--families: no train or held-out task of kind {kind!r}; the recipe has {kinds}")
        demos = [
            build_demonstrations(tasks, "oracle", spec.factory, tokenizer_policy, recipe)
            for tasks in (train, held_out)
        ]
        families.append(
            Family(kind, [trajectory_example(t) for t in demos[0]], [trajectory_example(t) for t in demos[1]])
        )
    return families


def method_config(method: str, args: argparse.Namespace) -> ContinualConfig:
    """The flags as one method's ContinualConfig: the buffer only where the method keeps
    one of its own (ewc, si and mas run without rehearsal here)."""
    buffered = CONTINUAL_METHODS.trait(method, "buffer") in ("rehearsal", "memory")
    return ContinualConfig(
        method=method, replay_capacity=args.replay_capacity if buffered else 0, replay_ratio=args.replay_ratio,
        ewc_lambda=args.ewc_lambda, fisher_examples=args.fisher_examples, si_c=args.si_c, si_xi=args.si_xi,
        mas_lambda=args.mas_lambda, memory_batch_size=args.memory_batch_size, derpp_alpha=args.derpp_alpha,
        derpp_beta=args.derpp_beta, derpp_topk=args.derpp_topk, lora_router=args.lora_router,
        lora_merge=args.lora_merge, lora_merge_density=args.lora_merge_density,
    )  # fmt: skip


def run_method(method: str, args: argparse.Namespace, families: list[Family], out: Path) -> dict:
    continual = method_config(method, args)
    sft = SFTTrainerConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        micro_batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=1,
        schedule="constant",
    )
    torch.manual_seed(args.seed)  # every method starts from the same adapters
    base = load_policy(args.model, device=args.device)
    policy = apply_lora(base, LoraConfig(r=args.lora_r, alpha=2 * args.lora_r))
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
    terms = [v for h in result.history for k, v in h.items() if k.endswith("_penalty") or k == "sft/derpp_mse"]
    return {
        "method": method,
        **metrics,
        "max_penalty": max(terms, default=0.0),
        "merged_AA": sum(result.merged) / len(result.merged) if result.merged else None,
        "merged": result.merged,
        "continual": to_dict(continual),
        "accuracy": result.accuracy,
        "token_accuracy": result.token_accuracy,
        "baseline": result.baseline,
        "families": result.families,
        "wall_s": time.perf_counter() - tick,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| method | AA | BWT | FWT | largest penalty | merged AA | final accuracy per family | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        final = ", ".join(f"{f} {a:.3f}" for f, a in zip(row["families"], row["accuracy"][-1]))
        penalty = f"{row['max_penalty']:.3g}" if row["max_penalty"] else "—"
        merged = f"{row['merged_AA']:.3f}" if row.get("merged_AA") is not None else "—"
        lines.append(
            f"| {row['method']} | {row['AA']:.3f} | {row['BWT']:+.3f} | {row['FWT']:+.3f} | {penalty} | {merged} "
            f"| {final} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    unknown = [m for m in args.methods.split(",") if m not in CONTINUAL_METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; valid: {', '.join(CONTINUAL_METHODS.names())}, all")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = build_families(args, load_policy(args.model, device=args.device))
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
