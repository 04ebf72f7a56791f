"""The update's LoRA linears: ponder's fused forward/backward against PEFT's own.

    python bench/lora_linear.py [--threads 2] [--rows 4] [--tokens 100] [--reps 8]
    python bench/lora_linear.py --smoke      # tiny model, two reps: checks the script only

Loads the model with LoRA (r 16, alpha 32, every linear layer, random non-zero B as
after some training) and times one forward + backward of a [rows, tokens] batch with
logits kept at the last half of the positions (the completion), as the update step
does. The LoRA layers switch between `ponder.models.lora_fused.FusedLoraLinear` and
PEFT's `Linear` every repetition (A B A B; the first pair is a warm-up), so both see
the same machine state. Prints the median and best milliseconds of each and their
ratio, and checks that both give the same gradients first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def lora_model(model: str):
    from ponder.config import LoraConfig
    from ponder.models import apply_lora, load_policy, tiny_policy

    policy = tiny_policy() if model == "tiny" else load_policy(model)
    policy = apply_lora(policy, LoraConfig(r=16, alpha=32))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    return policy.model


def forward_backward(model, input_ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """Seconds for one forward + backward, and the adapter gradients."""
    started = time.perf_counter()
    logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=input_ids.shape[1] // 2).logits
    logits.logsumexp(-1).mean().backward()
    seconds = time.perf_counter() - started
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return seconds, grads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a model name or directory ponder can load")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rows", type=int, default=4, help="sequences per micro-batch (the bench's --micro-batch)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per sequence")
    parser.add_argument("--reps", type=int, default=8, help="A B pairs, the first one a warm-up")
    parser.add_argument("--smoke", action="store_true", help="ponder's tiny model, 2 x 16 tokens, two reps")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.rows, args.tokens, args.reps = "tiny", 2, 16, 2
    from peft.tuners.lora.layer import Linear

    from ponder.models.lora_fused import FusedLoraLinear

    torch.set_num_threads(args.threads)
    model = lora_model(args.model)
    layers = [module for module in model.modules() if isinstance(module, Linear)]
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (args.rows, args.tokens), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {"fused": [], "peft": []}
    grads = {}
    for rep in range(args.reps):
        for name, cls in (("fused", FusedLoraLinear), ("peft", Linear)):
            for layer in layers:
                layer.__class__ = cls
            seconds, grads[name] = forward_backward(model, input_ids)
            if rep:
                times[name].append(seconds)
    worst = max(float((grads["fused"][k] - g).norm() / g.norm()) for k, g in grads["peft"].items())
    if worst > 1e-4:
        print(f"gradients differ: largest relative difference {worst:.2e}", file=sys.stderr)
        return 1
    print(f"{args.model}, LoRA r16 on {len(layers)} linears, fp32, {args.threads} threads, "
          f"[{args.rows}, {args.tokens}] tokens, forward + backward; gradients equal within {worst:.1e}")
    print("| forward | median ms | best ms |")
    print("|---|---|---|")
    for name, label in (("peft", "PEFT's Linear"), ("fused", "ponder's fused LoRA linear")):
        print(f"| {label} | {statistics.median(times[name]) * 1e3:.1f} | {min(times[name]) * 1e3:.1f} |")
    print(f"fused / PEFT: {statistics.median(times['fused']) / statistics.median(times['peft']):.3f} (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
