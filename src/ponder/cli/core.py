"""`ponder …` — wires recipes, data, models and runners together; owns no logic.

Bad input (recipe keys, model paths, corpus or task files) prints one line naming
the problem and exits with code 2; a bug of ponder's prints a one-line summary and
the file holding its traceback, exit code 1; an interrupt exits 130. Set
PONDER_DEBUG=1 to see the traceback instead.
`key=value` recipe overrides may stand anywhere on the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130
MODEL_HELP = ("smollm2-135m (embedded), tiny, a local HF model dir, a ponder run / stage / checkpoint dir, "
              "or a hub id (downloads when the network allows)")


def _quiet_libraries() -> None:
    """No per-load progress bars or deprecation notices from the libraries underneath:
    ponder shows its own progress. Nothing here stops a hub id from downloading."""
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.config import load_recipe
    from ponder.eval import evaluate, held_out_recipe, metrics_table, save_result
    from ponder.eval.runner import describe_weights, trained_weights
    from ponder.rundir import claim_run_dir
    from ponder.runlog.progress import item_progress

    recipe = load_recipe(args.recipe, args.overrides)
    if args.model:
        recipe.model.name = args.model
    if args.samples < 1:
        raise ValueError(f"--samples must be at least 1, got {args.samples}")
    recipe = held_out_recipe(recipe, args.episodes, args.samples)  # the demo's held-out evaluation
    out = claim_run_dir(args.out or recipe.eval.out, args.overwrite, create=False)
    console = Console(stderr=True)
    weights = describe_weights(trained_weights(recipe.model.name))  # which of a run's weights: best/, a step
    console.print(f"[bold]ponder eval[/] model={recipe.model.name}{weights} recipe={args.recipe or 'defaults'}",
                  soft_wrap=True)  # fmt: skip
    if args.repeats != 1:
        return _eval_repeats(args, recipe, out, console)
    with item_progress("episodes", recipe.eval.episodes * recipe.rollout.group_size) as advance:
        result = evaluate(recipe, on_episode_done=advance)
    save_result(result, recipe, claim_run_dir(out, args.overwrite))
    table = _console()
    title = f"{recipe.model.name} on {len(result.tasks)} held-out tasks"
    table.print(metrics_table(result.metrics, title=title, width=table.width))  # transposed when too wide
    _print_trajectory_table(table, result.metrics)
    console.print(f"wrote {out / 'trajectories.parquet'} and {out / 'metrics.json'}")
    return 0


def _eval_repeats(args: argparse.Namespace, recipe: Any, out: Path, console: Any) -> int:
    """`ponder eval --repeats N`: the evaluation over N sampling seeds, and its spread."""
    from ponder.eval import metrics_table
    from ponder.eval.variance import evaluate_repeats, repeats_table, save_repeats, spread_reading
    from ponder.rundir import claim_run_dir
    from ponder.runlog.progress import item_progress

    episodes = recipe.eval.episodes * recipe.rollout.group_size * max(args.repeats, 1)
    with item_progress("episodes", episodes) as advance:
        results = evaluate_repeats(recipe, args.repeats, on_episode_done=advance)
    spread = save_repeats(results, recipe, claim_run_dir(out, args.overwrite))
    table = _console()
    title = f"{recipe.model.name} on {len(results[0].tasks)} held-out tasks, seed {recipe.rollout.seed}"
    table.print(metrics_table(results[0].metrics, title=title, width=table.width))
    _print_trajectory_table(table, results[0].metrics)
    table.print(repeats_table(spread, f"reward over {args.repeats} sampling seeds"))
    table.print(spread_reading(spread, recipe.eval.temperature == 0), highlight=False)
    console.print(f"wrote {out / 'repeats.json'}, the first seed's files in {out} and the others in {out / 'repeats'}")
    return 0


def _print_trajectory_table(table: Any, metrics: dict[str, Any], title: str = "outcome vs trajectory") -> None:
    from ponder.eval import trajectory_table

    rendered = trajectory_table(metrics, title)
    if rendered is not None:
        table.print(rendered)


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from ponder.config import load_recipe
    from ponder.envs.data import load_search_qa
    from ponder.envs.search_qa import SearchQAOptions
    from ponder.tools.retrieval import build_retriever, load_corpus
    from ponder.tools.retrieval.server import ServerLimits, api_key_from_env, serve

    limits = ServerLimits(args.max_body_bytes, args.max_queries, args.max_topk, args.api_key or api_key_from_env())
    if args.corpus:
        docs = load_corpus(args.corpus)
    else:
        docs = load_search_qa(SearchQAOptions.from_recipe(load_recipe(args.recipe))).corpus
    retriever = build_retriever(args.kind, docs)
    keyed = "; API key required" if limits.api_key else ""
    print(f"serving {len(docs)} documents ({args.kind}) on http://{args.host}:{args.port}/retrieve{keyed}", flush=True)
    serve(retriever, host=args.host, port=args.port, topk=args.topk, limits=limits)
    return 0


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    from ponder.agent.toolbox import ToolboxOptions, build_tools
    from ponder.tools import ToolRegistry
    from ponder.tools.mcp.server import CallLog, serve_http, serve_stdio

    names = [name.strip() for name in args.tools.split(",") if name.strip()]
    options = ToolboxOptions(args.files_root, args.corpus, args.docs, args.python_timeout_s)
    registry = ToolRegistry(build_tools(names, options), default_timeout_s=args.timeout_s)
    log = CallLog(args.call_log)
    if args.transport == "stdio":
        serve_stdio(registry, log)
    else:
        serve_http(registry, args.host, args.port, log)
    return 0


def cmd_gen_tasks(args: argparse.Namespace) -> int:
    from ponder.config import load_recipe
    from ponder.envs.search_qa import SearchQAOptions
    from ponder.envs.synthetic import generate_world
    from ponder.envs.taskfile import write_jsonl

    world = generate_world(SearchQAOptions.from_recipe(load_recipe(args.recipe, args.overrides)).taskgen)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "corpus.jsonl", world.corpus)
    write_jsonl(out / "train.jsonl", [task.to_dict() for task in world.train])
    write_jsonl(out / "eval.jsonl", [task.to_dict() for task in world.eval])
    print(f"wrote {len(world.corpus)} documents, {len(world.train)} train and {len(world.eval)} eval tasks to {out}")
    return 0


# The --quick demo: the same pipeline, small enough for a smoke check (minutes).
QUICK_DEMO = [
    "eval.episodes=8",
    "sft.steps=4",
    "train.steps=2",
    "train.tasks_per_step=2",
    "rollout.group_size=4",
]


def cmd_train(args: argparse.Namespace) -> int:
    from ponder.jobs.train import TrainOptions, run_train

    if args.ray and "=" in args.ray:  # `--ray key=value …`: an override, not an address
        args.overrides, args.ray = [args.ray, *args.overrides], "local"
    return run_train(TrainOptions(
        recipe=args.recipe, resume=args.resume, out=args.out, model=args.model, overwrite=args.overwrite,
        sft_from=args.sft_from, allow_recipe_change=args.allow_recipe_change, ray=args.ray,
        overrides=list(args.overrides),
    ))  # fmt: skip


def cmd_plot(args: argparse.Namespace) -> int:
    from ponder.runlog.plot import compare_runs, plot_run

    if not args.compare:
        if len(args.run_dirs) != 1 or args.key or args.out:
            raise ValueError("one RUN_DIR, or --compare with --key and --out (see --help)")
        for path in plot_run(args.run_dirs[0]):
            print(path)
        return 0
    if not args.key or not args.out:
        raise ValueError("--compare needs at least one --key and an --out FILE.png")
    labels = [str(run) for run in args.run_dirs]
    print(compare_runs(dict(zip(labels, args.run_dirs)), args.key, args.out, smooth=args.smooth))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.eval.report_html import write_report
    from ponder.eval.report_html.data import stage_metrics

    written = write_report(args.run_dir, args.out, args.compare, tokens=not args.text)
    tables = Console(stderr=True, width=None if sys.stderr.isatty() else 80)  # stdout: the page's path only
    for stage, metrics in stage_metrics(args.run_dir).items():
        _print_trajectory_table(tables, metrics, f"{stage}: outcome vs trajectory")
    print(written)
    return 0


def _add_report_command(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="an HTML page of a run: tables, curves, episode browser",
        description="Write one HTML file (no network needed to open it) for a run directory of `ponder demo`, "
        "`train`, `eval` or `pipeline`: the evaluation table per stage, learning curves from its "
        "metrics.jsonl files, and an episode browser that shows each turn's trained and masked tokens, "
        "per-turn rewards, the step checks' problems and the reward breakdown. --compare puts a second run "
        "beside it. Each stage's outcome-vs-trajectory table goes to stderr, the page's path to stdout.",
    )  # fmt: skip
    report.add_argument("run_dir", metavar="RUN_DIR", help="a ponder run directory")
    report.add_argument("--compare", metavar="OTHER_RUN_DIR", help="a second run: side-by-side tables, overlaid curves")
    report.add_argument("--out", metavar="FILE.html", help="where to write it (default: RUN_DIR/report.html)")
    report.add_argument("--text", action="store_true",
                        help="show each turn's stored text instead of decoding its tokens with the run's tokenizer")
    report.set_defaults(handler=cmd_report)


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.config import load_recipe
    from ponder.jobs.demo import run_demo
    from ponder.jobs.demo_table import demo_table
    from ponder.rundir import claim_run_dir, discard_on_error, require_run_dir
    from ponder.wiring import check_parts

    recipe = load_recipe(args.recipe, (QUICK_DEMO if args.quick else []) + args.overrides)
    check_parts(recipe)  # a bad env, task file or reward fails before the run directory is made
    out = Path(args.out or ("runs/demo-quick" if args.quick else "runs/demo"))
    if args.resume:
        require_run_dir(out, ("recipe.yaml",), f"it without --resume: ponder demo --out {out}")
    else:
        claim_run_dir(out, args.overwrite, can_resume=True)
    console = Console(stderr=True)
    with discard_on_error(out, fresh=not args.resume):
        results = run_demo(recipe, out, say=console.print, sft_from=args.sft_from, resume=args.resume,
                           skip_oracle=args.skip_oracle,
                           contamination_embeddings=args.contamination_embeddings)  # fmt: skip
    _console().print(demo_table(results))
    if "verdict" in results:
        _console().print(results["verdict"], highlight=False)
    console.print(f"wrote {out / 'results.json'} and plots in {out / 'rl' / 'plots'}")
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ponder.config import PipelineRecipe, load_recipe
    from ponder.jobs.pipeline import check_pipeline, run_pipeline, stage_table_markdown
    from ponder.rundir import claim_run_dir, discard_on_error, require_run_dir

    recipe = load_recipe(args.recipe, args.overrides, cls=PipelineRecipe)
    out = Path(args.out or recipe.pipeline.out)
    check_pipeline(recipe)  # a bad recipe fails before the output directory is touched
    if args.resume:
        require_run_dir(out, ("recipe.yaml",), f"it without --resume: ponder pipeline run {args.recipe} --out {out}")
    else:
        claim_run_dir(out, args.overwrite, can_resume=True)
    console = Console(stderr=True)
    with discard_on_error(out, fresh=not args.resume):
        stages = run_pipeline(recipe, out, say=console.print, contamination_embeddings=args.contamination_embeddings)
    print(stage_table_markdown(stages), end="")
    console.print(f"wrote {out / 'results.json'} and one directory per stage in {out}")
    return 0


def _add_pipeline_command(commands: Any) -> None:
    """`pipeline run RECIPE`."""
    pipeline = commands.add_parser("pipeline", help="staged training: warmup, SFT, DPO or RL, evaluation")
    actions = pipeline.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="run (or, with --resume, continue) every stage of a pipeline recipe")
    run.add_argument("recipe", metavar="RECIPE", help="YAML recipe, e.g. recipes/pipeline_search_qa.yaml")
    run.add_argument("--out", help="run directory (default: the recipe's pipeline.out)")
    _add_reuse_flags(run, resume="continue the run in --out: finished stages are skipped, an interrupted one resumes")
    _add_contamination_flag(run)
    run.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    run.set_defaults(handler=cmd_pipeline)


def _add_contamination_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contamination-embeddings", action="store_true",
                        help="the run's contamination check of training data against the held-out tasks "
                        "(contamination.json) adds the embedding signal to the n-gram ones (loads "
                        "all-MiniLM-L6-v2, seconds)")  # fmt: skip


def cmd_export(args: argparse.Namespace) -> int:
    from ponder.models.adapters import export_trained

    if args.keep_layers is not None:
        from ponder.models.students import write_student

        out, kept = write_student(args.run_dir, args.keep_layers, args.out)
        print(f"wrote a Hugging Face model with {len(kept)} decoder layers ({', '.join(map(str, kept))}) to {out}; "
              f"train it with model.name={out}")  # fmt: skip
        return 0
    out = export_trained(args.run_dir, args.out, merge=args.merge)
    kind = "a Hugging Face model (merged)" if args.merge else "a PEFT adapter (or a full model, if fully fine-tuned)"
    print(f"wrote {kind} to {out}")
    return 0


def _add_export_command(commands: Any) -> None:
    export = commands.add_parser(
        "export", help="a run's model as a Hugging Face model (--merge) or adapter"
    )
    export.add_argument("run_dir", metavar="RUN_DIR", help="a ponder run, stage or checkpoint directory (with "
                        "--keep-layers: any model, e.g. smollm2-135m)")
    export.add_argument("--out", required=True, help="new directory to write (must not exist or be empty)")
    export.add_argument("--merge", action="store_true",
                        help="fold the adapters into the base weights: loads with AutoModelForCausalLM alone")
    export.add_argument("--keep-layers", type=int, metavar="K",
                        help="a smaller student for distillation: the model (merged) with K of its decoder "
                        "layers, evenly spaced, first and last kept, as a Hugging Face model")
    export.set_defaults(handler=cmd_export)


def cmd_merge(args: argparse.Namespace) -> int:
    from ponder.models.merging import load_merge_config, run_merge

    config, sources = load_merge_config(args.config, args.overrides)
    out = run_merge(config, sources, args.config, overwrite=args.overwrite)
    kind = "a full model" if config.merge_on == "full" else "a LoRA adapter"
    print(f"wrote {kind} ({config.merge_method} of {len(sources)}) to {out}; load it with --model {out}")
    return 0


def _add_merge_command(commands: Any) -> None:
    merge = commands.add_parser(
        "merge", help="merge trained runs or adapters: task arithmetic, TIES, DARE",
        description="Merge trained runs into one model, as a mergekit-like YAML file says: merge_method "
        "(linear, task_arithmetic, ties, dare_linear, dare_ties), base_model, models (a list of "
        "{model: RUN_OR_DIR, weight: W}), parameters (density: TIES's kept fraction; drop_rate: DARE's "
        "drop probability; seed; scale: the merged task vector's multiplier; svd_rank), merge_on (full: "
        "task vectors finetuned - base on every weight, writes a full model; lora: PEFT's "
        "add_weighted_adapter, writes an adapter for `ponder serve --adapter`) and out. The output is "
        "written atomically and loads like any trained run: ponder eval --model OUT.",
    )
    merge.add_argument("config", metavar="CONFIG.yaml", help="the merge file")
    merge.add_argument("--overwrite", action="store_true", help="replace a ponder model already in 'out'")
    merge.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. parameters.seed=1")
    merge.set_defaults(handler=cmd_merge)


def cmd_needle(args: argparse.Namespace) -> int:
    from ponder.config import RopeScalingConfig
    from ponder.eval.needle import NeedleRun, accuracy_grid, run_needle
    from ponder.fileio import write_json_atomic
    from ponder.models.loading import load_policy

    rope = RopeScalingConfig(type=args.rope, factor=args.factor)
    policy = load_policy(args.model, args.dtype, args.device, rope)
    run = NeedleRun(args.lengths, args.depths, args.per_cell, args.seed, args.finetune_steps,
                    args.finetune_length, args.finetune_lr)  # fmt: skip
    result = run_needle(policy, run, on_row=_print_needle_row)
    trained = result.pop("policy")
    for stage in ("before", "after"):
        for length, by_depth in accuracy_grid(result.get(stage, [])).items():
            cells = "  ".join(f"{d:.0%}:{a:.2f}" for d, a in by_depth.items())
            print(f"{stage:6} {length:6} tokens  {cells}")
    if args.out:
        write_json_atomic(Path(args.out), {"model": args.model, "rope_scaling": vars(rope), **result})
        print(f"wrote {args.out}")
    if args.save_adapter and args.finetune_steps > 0:
        from ponder.models.adapters import save_trained

        print(f"wrote the long-context adapter to {save_trained(trained, args.save_adapter)}")
    return 0


def _print_needle_row(row: dict[str, Any]) -> None:
    mark = "ok  " if row["correct"] else "MISS"
    print(f"{row['stage']:6} {row['tokens']:6} tokens depth {row['depth']:.2f} {mark} {row['seconds']:6.1f}s "
          f"{row['answer'][:30]!r}", flush=True)  # fmt: skip


def _add_needle_command(commands: Any) -> None:
    needle = commands.add_parser(
        "needle", help="needle-in-a-haystack: a fact hidden deep in a long document",
        description="Hide 'The secret code of <name> is <number>.' at each depth of a synthetic document "
        "of each length, ask for it at the end, and score exact match on the number (greedy). Lengths "
        "like 1x,2x,4x are multiples of the model's trained context (max_position_embeddings). --rope "
        "sets RoPE scaling; --finetune-steps N then LoRA-fine-tunes on N generated needle documents of "
        "--finetune-length tokens and measures again.",
    )
    needle.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    needle.add_argument("--rope", default="none", choices=["none", "linear", "dynamic", "yarn"], help="RoPE scaling")
    needle.add_argument("--factor", type=float, default=1.0, help="RoPE scaling factor (>= 1)")
    needle.add_argument("--lengths", default="1x,2x,4x", help="token counts or multiples of the trained length")
    needle.add_argument("--depths", default="0,25,50,75,100", help="needle depths in percent of the document")
    needle.add_argument("--per-cell", type=int, default=1, help="documents per length and depth")
    needle.add_argument("--seed", type=int, default=0, help="picks names, codes and filler")
    needle.add_argument("--finetune-steps", type=int, default=0, help="long fine-tune steps (0: none)")
    needle.add_argument("--finetune-length", default="2x", help="fine-tune document length")
    needle.add_argument("--finetune-lr", type=float, default=1e-4, help="fine-tune learning rate")
    needle.add_argument("--save-adapter", help="directory to save the fine-tuned LoRA adapter in")
    needle.add_argument("--device", default="auto", help="auto, cpu or cuda")
    needle.add_argument("--dtype", default="float32", help="float32, bfloat16 (a GPU) or auto")
    needle.add_argument("--out", help="JSON file for every case and the fine-tune's losses")
    needle.set_defaults(handler=cmd_needle)


def _add_reuse_flags(parser: argparse.ArgumentParser, resume: str) -> None:
    flags = parser.add_mutually_exclusive_group()
    flags.add_argument("--resume", action="store_true", help=resume)
    flags.add_argument("--overwrite", action="store_true", help="replace the run already in --out")


def cmd_gain(args: argparse.Namespace) -> int:

    from ponder.eval.gain import gain_table, load_evaluation, load_stage_pair, reward_weights, runs_table

    metric = reward_weights(args.reward_of) if args.reward_of else args.metric
    if args.versus and len(args.versus) != len(args.runs):
        raise ValueError(f"--versus names {len(args.versus)} run(s) for {len(args.runs)} RUN_DIR(s); "
                         "give one control per run, in the same order")  # fmt: skip
    before = args.before or (args.after if args.versus else "sft")
    controls = args.versus or [None] * len(args.runs)
    pairs = [load_stage_pair(run, before, args.after, metric, control) for run, control in zip(args.runs, controls)]
    label = "control" if args.versus else before
    more = [load_evaluation(path, metric) for path in args.more_before]
    if args.metric:
        _console().print(f"scored by the reward component '{args.metric}', not the total reward")
    if args.reward_of:
        paid = " ".join(f"{weight:+g}·{name}" for name, weight in metric.items() if weight)
        _console().print(f"scored by the reward of {args.reward_of}: {paid}")
    if args.each:
        table = runs_table(pairs, [str(run) for run in args.runs], label, args.after, more)
    else:
        table = gain_table(pairs, label, args.after, more)
    _console().print(table)
    return 0


def _add_training_commands(commands: Any) -> None:
    """`train`, `plot`, `demo` and `gain`."""
    _add_train_command(commands)
    _add_plot_and_demo_commands(commands)
    _add_gain_command(commands)


def _add_train_command(commands: Any) -> None:
    train = commands.add_parser("train", help="RL-train a policy (GRPO, RLOO, REINFORCE, PPO) from a recipe")
    source = train.add_mutually_exclusive_group(required=True)
    source.add_argument("--recipe", help="YAML recipe, e.g. recipes/search_qa_grpo.yaml")
    source.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    train.add_argument("--out", help="run directory (default: the recipe's train.out)")
    train.add_argument("--model", help=MODEL_HELP + " to start from")
    train.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    train.add_argument("--sft-from", metavar="RUN_DIR",
                       help="start from a finished run's SFT warm-up (RUN_DIR/sft, copied into "
                       "--out) instead of warming up again; its recipe must match in all but the RL "
                       "settings")  # fmt: skip
    train.add_argument("--allow-recipe-change", action="store_true",
                       help="with --resume: accept overrides beyond train.steps/save_every/eval_every")  # fmt: skip
    train.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                       help="roll out on train.ray_workers Ray actors (needs ponder[ray]), environments on "
                       "train.ray_env_workers, the learner in an actor (train.ray_learner=false: here). "
                       "No ADDRESS: a local cluster; else a cluster's HOST:PORT or 'auto'")  # fmt: skip
    train.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    train.set_defaults(handler=cmd_train)


def _add_plot_and_demo_commands(commands: Any) -> None:
    plot = commands.add_parser(
        "plot", help="learning-curve PNGs of a run, or runs overlaid (--compare)",
        description="With one RUN_DIR: every learning-curve figure of the run into RUN_DIR/plots. With "
        "--compare: the metrics named by --key (as in metrics.jsonl, e.g. reward/mean, "
        "kind/multi_hop/searches, val/reward), one panel each, one line per run, into --out; a demo's "
        "metrics are read from its rl/.",
    )  # fmt: skip
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--compare", action="store_true", help="overlay the runs instead of plotting one")
    plot.add_argument("--key", action="append", metavar="METRIC", help="a metric to overlay (repeatable)")
    plot.add_argument("--smooth", type=float, default=0.0, help="exponential smoothing in [0, 1) (default 0)")
    plot.add_argument("--out", metavar="FILE.png", help="where --compare writes its figure")
    plot.set_defaults(handler=cmd_plot)

    demo = commands.add_parser("demo", help="SFT warm-up, then RL, each evaluated: the before/after table")
    demo.add_argument("--recipe", default="recipes/demo.yaml", help="demo recipe (default: recipes/demo.yaml)")
    demo.add_argument("--quick", action="store_true", help="a small smoke run: " + " ".join(QUICK_DEMO))
    demo.add_argument("--out", help="output directory (default: runs/demo or runs/demo-quick)")
    _add_reuse_flags(demo, resume="continue the demo in --out, run with the same recipe and overrides: the "
                     "stages it measured (oracle, base, SFT warm-up, evaluations) are reused, RL resumes from "
                     "its latest checkpoint, only what is missing runs")  # fmt: skip
    demo.add_argument("--skip-oracle", action="store_true",
                      help="leave out the oracle's evaluation (the ceiling column of the table)")
    demo.add_argument(
        "--sft-from",
        metavar="RUN_DIR",
        help="reuse a finished demo run's SFT weights and pre-RL evaluations (compare RL variants from one "
        "warm-up; with another reward its evaluations' episodes are re-scored, with more env.max_turns run again)",
    )
    _add_contamination_flag(demo)
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    demo.set_defaults(handler=cmd_demo)


def _add_gain_command(commands: Any) -> None:
    gain = commands.add_parser(
        "gain",
        help="paired reward gain of one demo stage over another, over seeds",
        description="The paired reward gain of --after over --before on the runs' held-out tasks. Runs are "
        "pooled by task: each task's before and after rewards are averaged over the runs (a warm-up's "
        "evaluation shared by --sft-from runs counts once), then paired over tasks.",
    )  # fmt: skip
    gain.add_argument("runs", nargs="+", metavar="RUN_DIR", help="`ponder demo` output directories")
    gain.add_argument("--before", choices=["base", "sft", "rl"],
                      help="baseline stage (default sft; with --versus, the --after stage)")
    gain.add_argument("--versus", nargs="+", metavar="CONTROL_DIR",
                      help="read the baseline from these runs instead, one per RUN_DIR in the same order "
                      "(e.g. each seed's control without RL's signal): the gain of each run over its control")
    gain.add_argument("--after", default="rl", choices=["base", "sft", "rl"], help="stage compared (default rl)")
    gain.add_argument("--each", action="store_true",
                      help="one row per run instead of pooling (compare algorithms or settings side by side)")
    gain.add_argument("--more-before", nargs="+", default=[], metavar="EVAL",
                      help="more evaluations of the --before model (`ponder eval` output directories or parquet "
                      "files, e.g. other sampling seeds), averaged into each task's before")  # fmt: skip
    scoring = gain.add_mutually_exclusive_group()
    scoring.add_argument("--metric", metavar="COMPONENT",
                         help="compare one reward component instead of the total reward, e.g. math's verified "
                         "`correct` when the runs were paid different rewards (a process reward, a hackable one)")
    scoring.add_argument("--reward-of", metavar="RECIPE",
                         help="score every episode by RECIPE's reward (its weights over the components each "
                         "episode logged), e.g. a shaped variant read by the shipped recipe's reward")
    gain.set_defaults(handler=cmd_gain)


def build_parser() -> argparse.ArgumentParser:
    from ponder.cli.overview import group_commands

    parser = argparse.ArgumentParser(
        prog="ponder",
        epilog="`ponder COMMAND --help` shows a command's flags and an example. Recipes are YAML files (see "
        "recipes/; shipped ones are found from any directory); any key can be overridden as key=value "
        "anywhere on the line, e.g. rollout.sampling.temperature=0.7. Errors print one line; "
        "PONDER_DEBUG=1 ponder ... shows the traceback.",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_eval_and_retriever_commands(commands)
    _add_mcp_serve_command(commands)
    _add_training_commands(commands)
    _add_pipeline_command(commands)
    _add_export_command(commands)
    _add_merge_command(commands)
    _add_needle_command(commands)
    _add_report_command(commands)

    gen = commands.add_parser("gen-tasks", help="write the synthetic corpus and train/eval tasks as JSONL")
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--recipe", help="recipe whose env.options.taskgen settings to use")
    gen.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    gen.set_defaults(handler=cmd_gen_tasks)
    _register_package_commands(commands)
    group_commands(parser, commands, "Train LLM agents that think, search and call tools, and run them.")
    return parser


def _add_eval_and_retriever_commands(commands: Any) -> None:
    run = commands.add_parser("eval", help="evaluate a policy on a recipe's held-out tasks")
    run.add_argument("--recipe", help="YAML recipe (default: built-in defaults)")
    run.add_argument("--model", help=MODEL_HELP)
    run.add_argument("--episodes", type=int, help="number of held-out tasks to run (default eval.episodes)")
    run.add_argument("--samples", type=int, default=1, metavar="K", help="episodes sampled per task (default 1, "
                     "as the demo evaluates; K > 1 for pass@k or a lower-variance mean)")
    run.add_argument("--repeats", type=int, default=1, metavar="N",
                     help="run the evaluation N times, sampling seeds rollout.seed, +1, …: each repeat's mean, "
                     "then their spread beside one run's standard error (default 1)")  # fmt: skip
    run.add_argument("--out", help="output directory (default: the recipe's eval.out)")
    run.add_argument("--overwrite", action="store_true", help="replace an evaluation already in --out")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    run.set_defaults(handler=cmd_eval)

    serve = commands.add_parser("serve-retriever", help="serve a corpus over Search-R1's POST /retrieve API")
    serve.add_argument("--corpus", help="JSONL corpus of {id, contents} (default: the recipe's corpus)")
    serve.add_argument("--recipe", help="recipe whose corpus to serve when --corpus is not given")
    serve.add_argument("--kind", default="bm25", choices=["bm25", "dense", "hybrid"], help="retriever")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--topk", type=int, default=3, help="results per query when a request gives none")
    serve.add_argument("--api-key", help="require this key on /retrieve (Authorization: Bearer KEY); "
                       "default $PONDER_RETRIEVER_API_KEY, which keeps it out of the process list")
    serve.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger request bodies get 413")
    serve.add_argument("--max-queries", type=int, default=256, help="more queries in one request get 422")
    serve.add_argument("--max-topk", type=int, default=100, help="a larger topk gets 422")
    serve.set_defaults(handler=cmd_serve_retriever)


def _register_package_commands(commands: Any) -> None:
    """The commands other packages define."""
    from ponder.cli.agent import register as register_agent_commands

    register_agent_commands(commands)  # `chat` and `run-agent`
    from ponder.cli.tools import register as register_tool_commands

    register_tool_commands(commands)  # `tools` and `bench-agent`
    from ponder.cli.serve import register as register_serve_command

    register_serve_command(commands)  # `serve` and `gateway`
    from ponder.cli.warmup import register as register_warmup_command

    register_warmup_command(commands)  # `warmup`
    from ponder.cli.improve import register as register_improve_command

    register_improve_command(commands)  # `improve`
    from ponder.cli.personal import register as register_personal_command

    register_personal_command(commands)  # `personal`
    from ponder.cli.tinker import register as register_tinker_command

    register_tinker_command(commands)  # `tinker-serve`
    from ponder.cli.data import register as register_data_command

    register_data_command(commands)  # `export-data`
    from ponder.cli.contamination import register as register_contamination_command

    register_contamination_command(commands)  # `contamination`
    from ponder.cli.estimate import register as register_estimate_command

    register_estimate_command(commands)  # `estimate`
    from ponder.cli.sandbagging import register as register_sandbagging_command

    register_sandbagging_command(commands)  # `sandbagging`
    from ponder.cli.adapters import register as register_adapters_command

    register_adapters_command(commands)  # `train-adapters`


def _add_mcp_serve_command(commands: Any) -> None:
    from ponder.agent.toolbox import BUILTIN_TOOLS

    serve = commands.add_parser(
        "mcp-serve", help="serve ponder's tools to MCP clients (stdio or HTTP)",
        description="Serve ponder's built-in tools over the Model Context Protocol. Calls are validated "
        "against each tool's JSON Schema and stopped at its time limit; python runs in ponder's jail.",
    )  # fmt: skip
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                       help="stdio (an MCP client starts this command) or http (streamable HTTP at /mcp)")
    serve.add_argument("--host", default="127.0.0.1", help="http: bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")
    serve.add_argument("--tools", default="calculator",
                       help=f"comma-separated tools to serve: {','.join(BUILTIN_TOOLS)} (default calculator)")
    serve.add_argument("--corpus", help="JSONL corpus of {id, contents} for the search tool")
    serve.add_argument("--docs", action="append", help="document file or folder for the rag tool (repeatable)")
    serve.add_argument("--files-root", help="folder the read_file tool may read")
    serve.add_argument("--python-timeout-s", type=float, default=5.0, help="time limit of a python run")
    serve.add_argument("--timeout-s", type=float, default=10.0, help="time limit of any other tool call")
    serve.add_argument("--call-log", metavar="FILE", help="append one JSON line per call (tool, arguments, "
                       "is_error, elapsed_s) to FILE")  # fmt: skip
    serve.set_defaults(handler=cmd_mcp_serve)


def _console() -> Any:
    """Tables on stdout: the terminal's width, or 80 columns when piped."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 80)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `key=value` overrides are collected wherever they stand
    (argparse alone takes them only before the first option)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    overrides = [token for token in extra if "=" in token and not token.startswith("-")]
    unknown = [token for token in extra if token not in overrides]
    if unknown or (overrides and not hasattr(args, "overrides")):
        parser.error(f"{args.command}: unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = list(args.overrides) + overrides
    return args


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    args = parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, OSError) as err:  # every ponder input error is a ValueError subclass
        if os.environ.get("PONDER_DEBUG"):
            raise
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"ponder {args.command}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"ponder {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # a bug of ponder's: one line here, the traceback in a file
        if os.environ.get("PONDER_DEBUG"):
            raise
        where = _write_traceback(args.command)
        summary = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
        print(f"ponder {args.command}: internal error: {summary} (traceback in {where}; PONDER_DEBUG=1 "
              "shows it here)", file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL


def _write_traceback(command: str) -> str:
    """The current exception's traceback in a file of its own; its path."""
    import tempfile
    import traceback

    folder = Path(os.environ.get("PONDER_LOG_DIR") or Path(tempfile.gettempdir()) / "ponder-errors")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f"{command}-", suffix=".txt", delete=False) as handle:
        handle.write(traceback.format_exc())
    return handle.name
