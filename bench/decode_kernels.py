"""Matrix products of a decode step, sgemm against oneDNN's blocked weights.

    python bench/decode_kernels.py [--threads 2] [--batches 1,8,32] [--model smollm2-135m]
    python bench/decode_kernels.py --smoke      # tiny model, one rep: checks the script only

For each weight shape of the model's decoder (q|k|v fused, o, gate|up fused, down and
the vocabulary head) and each batch size, times `F.linear` (MKL sgemm on nn.Linear's
layout) and oneDNN's linear on weights reordered into its blocked layout (what
`rollout.llama_decode` uses). Each shape is timed over as many distinct weight
matrices as the model has layers, so the weights stream from memory as in a real
decode step instead of sitting in cache. Reports milliseconds per decode step and the
weight bytes read per second.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ponder.models.cpu_matmul import best_time, onednn_linear, pack  # noqa: E402


def shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (rows, columns, matrices per decode step)."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return {
        "q|k|v": ((heads + 2 * kv) * head_dim, hidden, layers),
        "o": (hidden, heads * head_dim, layers),
        "gate|up": (2 * inner, hidden, layers),
        "down": (hidden, inner, layers),
        "head": (config.vocab_size, hidden, 1),
    }


def model_config(model: str):
    from transformers import AutoConfig

    from ponder.models import tiny_policy
    from ponder.models.loading import embedded_model_dir

    if model == "tiny":
        return tiny_policy().model.config
    return AutoConfig.from_pretrained(embedded_model_dir() if model == "smollm2-135m" else model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a model name or directory (only its config is read)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="ponder's tiny model, batches 1 and 2, one rep")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.reps = "tiny", "1,2", 1
    torch.set_num_threads(args.threads)
    config = model_config(args.model)
    print(f"{args.model}, fp32, {args.threads} threads; ms per decode step (weight GB/s)")
    print("| batch | matrix | sgemm (F.linear) | oneDNN blocked | speed-up |")
    print("|---|---|---|---|---|")
    for batch in [int(b) for b in args.batches.split(",")]:
        totals = [0.0, 0.0]
        for name, (rows, cols, count) in shapes(config).items():
            weights = [torch.randn(rows, cols) for _ in range(count)]
            x = torch.randn(batch, cols)
            plain = best_time(lambda: [F.linear(x, w) for w in weights], args.reps)
            packed = [pack(w) for w in weights]
            blocked = best_time(lambda: [onednn_linear(x, p) for p in packed], args.reps)
            gigabytes = rows * cols * 4 * count / 1e9
            totals[0] += plain
            totals[1] += blocked
            print(f"| {batch} | {name} | {plain * 1e3:.2f} ({gigabytes / plain:.1f}) | "
                  f"{blocked * 1e3:.2f} ({gigabytes / blocked:.1f}) | {plain / blocked:.2f}x |")
        print(f"| {batch} | all | {totals[0] * 1e3:.2f} | {totals[1] * 1e3:.2f} | {totals[0] / totals[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
