"""What constrained sampling costs (ponder.rollout.constrain): tokens/s of the `hf`
backend with every row constrained by a JSON Schema against the same rows free, side
by side (alternating call by call, medians over --rounds), at several batch sizes;
and the time to compile a schema cold and to take a matcher from the cache.

    .venv/bin/python bench/constrained_decoding.py --batch 1 8 32 --rounds 3
    .venv/bin/python bench/constrained_decoding.py --smoke      # the tiny model, seconds

Every row writes --tokens tokens either way (free rows continue a story; constrained
ones write it into a JSON string whose minLength keeps it open past the cap), so the
two sides do the same decode work and differ by the masks alone.
Prints a table and, with --out, writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ponder.config import SamplingConfig  # noqa: E402
from ponder.models import load_policy  # noqa: E402
from ponder.rollout.backend import GenerationRequest  # noqa: E402
from ponder.rollout.constrain import Constraint, Grammars  # noqa: E402
from ponder.rollout.hf import HFBackend  # noqa: E402

PROMPT = "The lighthouse keeper had seen many storms, but the one that came that night"
# minLength keeps the story open past --tokens, so neither side stops before the cap
SCHEMA = {"type": "object", "properties": {"title": {"enum": ["The Storm", "The Keeper"]},
                                           "story": {"type": "string", "minLength": 2000}},
          "required": ["title", "story"], "additionalProperties": False}  # fmt: skip


def tokens_per_s(backend: HFBackend, ids: list[int], batch: int, tokens: int, constraint: Constraint | None) -> float:
    requests = [GenerationRequest(f"r{i}", ids, tokens, constraint) for i in range(batch)]
    start = time.perf_counter()
    generations = backend.generate(requests, [])
    elapsed = time.perf_counter() - start
    written = [len(g.token_ids) for g in generations]
    if min(written) < tokens:  # a row that stopped early would make its side look faster
        print(f"  note: a row stopped after {min(written)} of {tokens} tokens", flush=True)
    return sum(written) / elapsed


def compile_times(policy, backend: HFBackend, schemas: int) -> dict[str, float]:
    """Median ms to compile a schema (a fresh one each time) and to take a cached one."""
    grammars = Grammars(policy.tokenizer, sorted(backend.eos_ids), policy.model.config.vocab_size)
    cold, cached = [], []
    for i in range(schemas):
        constraint = Constraint.json_schema({**SCHEMA, "title": f"schema {i}"})
        start = time.perf_counter()
        grammars.matcher(constraint)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        grammars.matcher(constraint)
        cached.append(time.perf_counter() - start)
    return {"compile_ms": 1e3 * statistics.median(cold), "cached_ms": 1e3 * statistics.median(cached)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64, help="tokens each row writes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, one round, batch 1 and 2")
    parser.add_argument("--out", help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batch, args.rounds, args.tokens = "tiny", [1, 2], 1, 16
    policy = load_policy(args.model)
    backend = HFBackend(policy, SamplingConfig(temperature=1.0), seed=0, reuse_kv=False)
    ids = policy.tokenizer.encode(PROMPT)
    constraint = Constraint.json_schema(SCHEMA)
    tokens_per_s(backend, ids, 1, 4, constraint)  # warm-up: the sampler copy, the grammar
    rows = []
    for batch in args.batch:
        free, constrained = [], []
        for _ in range(args.rounds):
            free.append(tokens_per_s(backend, ids, batch, args.tokens, None))
            constrained.append(tokens_per_s(backend, ids, batch, args.tokens, constraint))
        row = {"batch": batch, "free_tok_s": statistics.median(free), "constrained_tok_s": statistics.median(constrained)}
        row["ratio"] = row["constrained_tok_s"] / row["free_tok_s"]
        rows.append(row)
        print(f"batch {batch:>3}: free {row['free_tok_s']:7.1f} tok/s, constrained "
              f"{row['constrained_tok_s']:7.1f} tok/s, ratio {row['ratio']:.3f}", flush=True)  # fmt: skip
    times = compile_times(policy, backend, 5 if args.smoke else 20)
    print(f"compile a schema: {times['compile_ms']:.2f} ms cold, {times['cached_ms']:.3f} ms cached")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "tokens": args.tokens, "rounds": args.rounds,
                                              "rows": rows, **times}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
