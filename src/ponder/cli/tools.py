"""`ponder tools train|eval|index|search`, `ponder bench-agent` (and `bench-injection`): wiring only.

Registered by `ponder.cli.build_parser`; the logic lives in eval/tool_retrieval.py,
tools/retrieval/ and eval/bench_agent.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ponder.tools.retrieval.toolindex import Fusion

DEFAULT_ENCODER_DIR = "runs/tools/encoder"


def _data(args: argparse.Namespace) -> Any:
    from ponder.bfcl.data import find_data_dir
    from ponder.eval.tool_retrieval import prepare_data

    data = prepare_data(find_data_dir(args.bfcl_venv), args.test_fraction, args.split_seed,
                        getattr(args, "validation_fraction", 0.0))
    print(data.describe(), file=sys.stderr)
    return data


def cmd_tools_train(args: argparse.Namespace) -> int:
    from ponder.eval.tool_retrieval import cross_validated_fusion, training_examples, tune_fusion
    from ponder.fileio import write_json_atomic
    from ponder.tools.retrieval.finetune import ContrastiveConfig, save_encoder, train_encoder
    from ponder.tools.retrieval.toolindex import FUSION_FILE

    config = ContrastiveConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                               hard_negatives=args.hard_negatives, max_steps=args.max_steps, seed=args.seed,
                               max_seq_length=args.max_seq_length)
    if args.folds == 1 or args.folds < 0:
        raise ValueError(f"--folds must be 0 (off) or at least 2, got {args.folds}")
    if args.folds:
        args.validation_fraction = 0.0  # the folds cover every training function
    data = _data(args)
    examples = training_examples(data, config)
    print(f"ponder tools train: {len(examples)} examples, {config.hard_negatives} hard negative(s) each", file=sys.stderr)

    def on_step(step: int, total: int, loss: float) -> None:
        if step == 1 or step % 10 == 0 or step == total:
            print(f"step {step}/{total} loss {loss:.4f}", file=sys.stderr, flush=True)

    fusion = None
    if args.folds > 0:
        fusion = cross_validated_fusion(data, config, args.folds, lambda part: train_encoder(part, config)[0],
                                        say=lambda text: print(f"ponder tools train: {text}", file=sys.stderr))
    model, result = train_encoder(examples, config, on_step=on_step)
    extra = {"split": {"test_fraction": data.test_fraction, "seed": data.seed, "train_queries": len(data.train),
                       "validation_fraction": data.validation_fraction, "validation_queries": len(data.validation),
                       "folds": args.folds}}
    out = save_encoder(model, args.out, result, config, extra)
    first, last = result.losses[0], sum(result.losses[-5:]) / len(result.losses[-5:])
    print(f"ponder tools train: {result.steps} steps in {result.seconds:.0f} s, loss {first:.3f} → {last:.3f}; saved {out}")
    if data.validation:
        fusion = tune_fusion(data, model)
    if fusion is not None:
        write_json_atomic(out / FUSION_FILE, fusion, sort_keys=False)
        for row in fusion["sweep"]:
            print(f"validation: {row['method']}, dense weight {row['dense_weight']:g}: recall@5 "
                  f"{row['recall@5']:.3f} MRR {row['mrr']:.3f}", file=sys.stderr)
        print(f"ponder tools train: hybrid fusion {fusion['method']}, dense weight {fusion['dense_weight']:g} "
              f"chosen on {fusion['validation_queries']} validation queries ({fusion['selected_by']}); saved {out / FUSION_FILE}")
    return 0


def cmd_tools_eval(args: argparse.Namespace) -> int:
    from ponder.eval.tool_retrieval import evaluate_retrievers, retrieval_markdown
    from ponder.tools.retrieval.toolindex import load_tool_encoder, read_fusion

    data = _data(args)
    tuned, fusion = None, None
    if args.encoder and Path(args.encoder).exists():
        tuned, fusion = load_tool_encoder(args.encoder), read_fusion(args.encoder)
        if fusion is not None:
            print(f"hybrid fusion {fusion}, chosen on validation by `ponder tools train`", file=sys.stderr)
    elif args.encoder != DEFAULT_ENCODER_DIR:
        raise ValueError(f"{args.encoder}: no fine-tuned encoder there; train one with `ponder tools train`")
    rows = evaluate_retrievers(data, tuned, say=lambda line: print(line, file=sys.stderr), only=args.only,
                               fusion=fusion)
    print(retrieval_markdown(rows))
    if args.out:
        from ponder.fileio import write_json_atomic

        write_json_atomic(args.out, {"data": data.describe(), "rows": rows}, sort_keys=False)
    return 0


def cmd_tools_index(args: argparse.Namespace) -> int:
    from ponder.bfcl.data import find_data_dir, load_tool_corpus
    from ponder.tools.retrieval.toolindex import ToolIndex

    corpus = load_tool_corpus(find_data_dir(args.bfcl_venv))
    print(corpus.summary(), file=sys.stderr)
    index = ToolIndex(corpus.specs, kind=args.kind, encoder=args.encoder, fusion=_fusion(args))
    print(f"ponder tools index: {args.kind} index of {len(corpus.specs)} tools written to {index.save(args.out)}")
    return 0


def cmd_tools_search(args: argparse.Namespace) -> int:
    from ponder.tools.retrieval.toolindex import ToolIndex

    index = ToolIndex.load(args.index, encoder=args.encoder)
    hits = index.search([args.query], args.topk)[0]
    for note in index.notes:
        print(f"note: {note}", file=sys.stderr)
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank:2d}. {hit.spec.name}  ({hit.score:.4f})  {hit.spec.description[:100]}")
    return 0


def _fusion(args: argparse.Namespace) -> Fusion:
    """--fusion and --dense-weight where given, else the encoder's fusion.json, else RRF
    with equal votes."""
    from ponder.tools.retrieval.toolindex import Fusion, read_fusion

    chosen = read_fusion(args.encoder) or Fusion()
    return Fusion(args.fusion or chosen.method,
                  chosen.dense_weight if args.dense_weight is None else args.dense_weight)


def _fusion_options(parser: argparse.ArgumentParser) -> None:
    from ponder.tools.retrieval.hybrid import FUSIONS

    parser.add_argument("--fusion", choices=FUSIONS,
                        help="hybrid: rrf (reciprocal rank fusion) or convex (weighted sum of min-max normalised "
                             "scores); default: the encoder's fusion.json, written by `ponder tools train`, else rrf")
    parser.add_argument("--dense-weight", type=float,
                        help="hybrid: the dense ranking's weight, BM25's being 1 (default: the weight in the "
                             "encoder's fusion.json, else 1)")


def _split_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bfcl-venv", default=".venv-bfcl", help="virtual env holding bfcl-eval (make bfcl-venv)")
    parser.add_argument("--test-fraction", type=float, default=0.3, help="share of tool names held out (default 0.3)")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the split by function (default 0)")


def register(commands: Any) -> None:
    """Add `tools` (train, eval, index, search) and `bench-agent` to the CLI."""
    tools = commands.add_parser("tools", help="tool retrieval over the BFCL tool catalogue")
    sub = tools.add_subparsers(dest="tools_command", metavar="ACTION", required=True)

    train = sub.add_parser("train", help="contrastive fine-tuning of the dense tool encoder")
    _split_options(train)
    train.add_argument("--out", default=DEFAULT_ENCODER_DIR, help=f"encoder directory (default {DEFAULT_ENCODER_DIR})")
    train.add_argument("--epochs", type=int, default=3, help="passes over the training pairs (3: chosen among 1, 2, 3 on validation; docs/results/tools.md)")
    train.add_argument("--batch-size", type=int, default=32)
    train.add_argument("--lr", type=float, default=5e-5)
    train.add_argument("--hard-negatives", type=int, default=1, help="mined negatives per example (0: in-batch only)")
    train.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    train.add_argument("--max-seq-length", type=int, default=64, help="token limit of texts while training (default 64)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--validation-fraction", type=float, default=0.2,
                       help="share of the training functions held out to choose the hybrid's fusion "
                            "(written to fusion.json; 0: no validation, no fusion.json; default 0.2)")
    train.add_argument("--folds", type=int, default=0,
                       help="instead of a validation split: choose the fusion by K-fold cross-validation "
                            "over the training functions (K extra trainings), then train on all of them "
                            "(replaces --validation-fraction; default 0: off)")
    train.set_defaults(handler=cmd_tools_train)

    evaluate = sub.add_parser("eval", help="recall@1/5/10, MRR, nDCG@10: BM25, base, fine-tuned, hybrid")
    _split_options(evaluate)
    evaluate.add_argument("--encoder", default=DEFAULT_ENCODER_DIR, help="fine-tuned encoder directory")
    evaluate.add_argument("--out", help="also write the rows as JSON here")
    evaluate.add_argument("--only", nargs="+", choices=["bm25", "base", "tuned", "hybrid", "hybrid-weighted", "hybrid-base"],
                          help="compute only these rows (default: all; tuned rows need --encoder, "
                               "hybrid-weighted its fusion.json)")
    evaluate.set_defaults(handler=cmd_tools_eval)

    index = sub.add_parser("index", help="build a searchable index of every BFCL tool")
    index.add_argument("--bfcl-venv", default=".venv-bfcl")
    index.add_argument("--kind", default="hybrid", choices=["bm25", "dense", "hybrid"])
    index.add_argument("--encoder", help="encoder directory (default: the packaged all-MiniLM-L6-v2)")
    index.add_argument("--out", default="runs/tools/index", help="index directory (default runs/tools/index)")
    _fusion_options(index)
    index.set_defaults(handler=cmd_tools_index)

    search = sub.add_parser("search", help="query an index built by `ponder tools index`")
    search.add_argument("query")
    search.add_argument("--index", default="runs/tools/index")
    search.add_argument("--encoder", help="encoder to embed the query with (default: the one the index names)")
    search.add_argument("--topk", type=int, default=5)
    search.set_defaults(handler=cmd_tools_search)
    register_bench(commands)
    from ponder.cli.injection import register as register_injection

    register_injection(commands)  # `bench-injection`


def cmd_bench_agent(args: argparse.Namespace) -> int:
    """Run the suite, print the table, write the report; samples are logged as they are
    scored and a rerun starts fresh (see `ponder.eval.bench_agent.sample_log`)."""
    from ponder.eval.bench_agent import grouped_metrics, markdown_table, sample_log, write_report
    from ponder.eval.bfcl.adapter import BfclRunConfig
    from ponder.eval.bfcl.suite import run_bfcl_suite, to_agent_sample

    config = BfclRunConfig(categories=tuple(args.categories), per_category=args.per_category, seed=args.seed,
                           samples=args.samples, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.samples > 1 and args.temperature <= 0:
        raise ValueError("--samples > 1 needs --temperature > 0 (greedy replies are all the same)")
    options = {"temperature": args.temperature, "seed": args.seed}

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    out = Path(args.out)
    with sample_log(out, say) as log:
        results, header = run_bfcl_suite(args.model, config, args.retrieval_topk, args.retriever,
                                         args.encoder, args.bfcl_venv, options, say=say, checkpoint=log)
        ks = tuple(sorted({1, args.samples}))
        samples = {name: [to_agent_sample(s) for s in group] for name, group in results.items()}
        conditions = {name: grouped_metrics(group, ks) for name, group in samples.items()}
        print(markdown_table(conditions, ks))
        for path in write_report(conditions, samples, out, ks, header):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def register_bench(commands: Any) -> None:
    from ponder.bfcl.data import ADAPTER_CATEGORIES

    bench = commands.add_parser("bench-agent", help="BFCL's single-turn categories, scored by BFCL's checker")
    bench.add_argument("--suite", default="bfcl", choices=["bfcl"], help="benchmark suite (default bfcl)")
    bench.add_argument("--model", default="smollm2-135m", help="oracle (replays possible answers), smollm2-135m, a model dir or URL")
    bench.add_argument("--categories", nargs="+", default=list(ADAPTER_CATEGORIES))
    bench.add_argument("--per-category", type=int, default=50, help="seeded subset size per category (0 = all)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--samples", type=int, default=1, help="replies per question (pass@k for k = 1 and this)")
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--max-new-tokens", type=int, default=256)
    bench.add_argument("--retrieval-topk", type=int, nargs="+", default=[0],
                       help="conditions: 0 = the question's own functions, k = top-k tools retrieved from all BFCL tools")
    bench.add_argument("--retriever", default="hybrid", choices=["bm25", "dense", "hybrid"])
    bench.add_argument("--encoder", help="dense encoder directory (default: the packaged all-MiniLM-L6-v2); the "
                                         "hybrid uses the fusion in its fusion.json when there is one")
    bench.add_argument("--batch-size", type=int, default=8, help="questions per batched generation (local models)")
    bench.add_argument("--bfcl-venv", default=".venv-bfcl")
    bench.add_argument("--out", default="runs/bench-agent",
                       help="writes results.json, results.md, success.png and samples.jsonl "
                            "(samples.partial.jsonl while it runs; a new run starts fresh)")
    bench.set_defaults(handler=cmd_bench_agent)
