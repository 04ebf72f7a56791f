"""How close ponder gets to this machine's limits, all measured in the same run.

    python bench/roofline.py [--threads N] [--batches 1,8,32] [--new-tokens 64] [--out roofline.json]
    python bench/roofline.py --smoke      # tiny model, tiny sizes: checks the script only

Measures, in fp32 on the CPU:
- peak matmul throughput: the best of several (n × n) @ (n × n) products, 2n³ FLOPs each;
- memory bandwidth: the best of several reads (sum) and copies of a 512 MiB buffer;
- ponder's rollout throughput: `HFBackend.generate` (KV cache, shared prompt prefill)
  on the embedded model at several batch sizes, sampled tokens per second;
- ponder's training throughput: the update's forward (`forward_policy`, LoRA r16 on
  every linear layer) and backward over a batch of sequences, tokens per second.

and reports each as a fraction of its roofline:
- generation at batch B: tokens/s ÷ min(peak FLOP/s ÷ 2P, B × read bandwidth ÷ 4P),
  P = parameters (the tied embedding counted once, as the LM head it is at decode
  time), 2P FLOPs and 4P bytes (fp32 weights read once per decode step) per token;
  the compute bound (2P) is the large-batch limit, the bandwidth bound the batch-1 one;
- training: tokens/s × 6P ÷ peak FLOP/s (the usual 6P per trained token; a LoRA update
  computes no weight gradients of the frozen base, about 4P, also shown).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import machine_info  # noqa: E402
from ponder.models import cpu_matmul  # noqa: E402
from ponder.models.cpu_matmul import best_time  # noqa: E402
from ponder.rollout.hf import DECODERS  # noqa: E402

STORY_PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def matmul_flops(n: int, reps: int) -> dict[str, float]:
    """fp32 FLOP/s of an n × n matmul through each library torch ships: MKL's sgemm
    (torch.mm) and oneDNN (what ponder.models.cpu_matmul picks where it is faster; on
    AMD CPUs MKL runs its AVX2 path). The machine's peak is the better of the two."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    flops = {"blas": 2.0 * n**3 / best_time(lambda: torch.mm(a, b, out=out), reps)}
    if cpu_matmul.onednn_usable(a):
        bt = b.t()  # a @ b as a linear layer: weight = bᵀ
        flops["onednn"] = 2.0 * n**3 / best_time(lambda: cpu_matmul.onednn_linear(a, bt), reps)
    return flops


def bandwidth(mebibytes: int, reps: int) -> dict[str, float]:
    """Read (sum) and copy (read + write) bandwidth in bytes/s over a buffer far larger than cache."""
    source = torch.ones(mebibytes * 2**20 // 4)
    target = torch.empty_like(source)
    size = source.numel() * 4
    read = size / best_time(lambda: source.sum(), reps)
    copy = 2 * size / best_time(lambda: target.copy_(source), reps)
    return {"read_bytes_per_s": read, "copy_bytes_per_s": copy}


def parameter_count(model: Any) -> int:
    """Distinct parameters (a tied embedding / LM head matrix counted once)."""
    seen, total = set(), 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total


def rollout_throughput(policy: Any, batch: int, new_tokens: int, reps: int, decoder: str = "auto") -> dict[str, float]:
    """Sampled tokens per second of ponder's HFBackend for `batch` copies of one prompt."""
    from ponder.config import SamplingConfig
    from ponder.rollout import GenerationRequest, HFBackend

    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=new_tokens, max_total_tokens=4096,
                              decoder=decoder)
    backend = HFBackend(policy, sampling, seed=0, reuse_kv=True)
    text = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": STORY_PROMPT}], tokenize=False, add_generation_prompt=True
    )
    context = policy.tokenizer.encode(text, add_special_tokens=False)
    best = {"tokens_per_s": 0.0}
    backend.sampling_model()  # the sampling copy is built once per policy version, not per call
    for rep in range(reps + 1):
        requests = [GenerationRequest(f"r{rep}-{i}", context, new_tokens) for i in range(batch)]
        tick = time.perf_counter()
        generations = backend.generate(requests, stop_strings=[])
        seconds = time.perf_counter() - tick
        tokens = sum(len(g.token_ids) for g in generations)
        if rep > 0 and tokens / seconds > best["tokens_per_s"]:  # rep 0 warms up
            best = {"tokens_per_s": tokens / seconds, "tokens": float(tokens), "seconds": seconds}
    return best


def training_throughput(policy: Any, batch: int, length: int, reps: int) -> dict[str, float]:
    """Tokens per second of ponder's update pass (forward_policy + backward) under LoRA."""
    from ponder.config import LoraConfig
    from ponder.models import apply_lora
    from ponder.models.forward import forward_policy

    model = apply_lora(policy, LoraConfig(r=16, alpha=32)).model
    model.train()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.zeros(batch, length - 1)
    loss_mask[:, length // 4 :] = 1.0  # completions after a prompt, as in an RL batch

    def update() -> None:
        logprobs, _, _ = forward_policy(model, input_ids, attention_mask, 1.0, loss_mask=loss_mask)
        (-(logprobs * loss_mask).sum() / loss_mask.sum()).backward()
        model.zero_grad(set_to_none=True)

    seconds = best_time(update, reps)
    model.eval()
    return {"tokens_per_s": batch * length / seconds, "tokens": float(batch * length), "seconds": seconds}


def generation_rows(measured: dict[str, Any], params: int) -> list[dict[str, float]]:
    flops, read = measured["matmul_flops_per_s"], measured["bandwidth"]["read_bytes_per_s"]
    rows = []
    for batch, result in measured["rollout"].items():
        compute_limit = flops / (2 * params)
        bandwidth_limit = int(batch) * read / (4 * params)
        roof = min(compute_limit, bandwidth_limit)
        rows.append(
            {
                "batch": int(batch),
                "tokens_per_s": result["tokens_per_s"],
                "roofline_tokens_per_s": roof,
                "bound": "compute" if compute_limit <= bandwidth_limit else "bandwidth",
                "fraction_of_roofline": result["tokens_per_s"] / roof,
                "fraction_of_compute_roofline": result["tokens_per_s"] / compute_limit,
                "fraction_of_bandwidth_limit": result["tokens_per_s"] / bandwidth_limit,
            }
        )
    return rows


def report(measured: dict[str, Any]) -> str:
    params, flops = measured["params"], measured["matmul_flops_per_s"]
    bw = measured["bandwidth"]
    lines = [
        f"model: {measured['model']} ({params / 1e6:.1f} M parameters), fp32, {measured['threads']} threads",
        f"peak fp32 matmul: {flops / 1e9:.1f} GFLOP/s (n={measured['matmul_n']}; "
        + ", ".join(f"{lib} {v / 1e9:.1f}" for lib, v in measured["matmul_flops_by_library"].items())
        + f"; products through {cpu_matmul.kernel_choice()})",
        f"memory bandwidth: read {bw['read_bytes_per_s'] / 1e9:.2f} GB/s, "
        f"copy {bw['copy_bytes_per_s'] / 1e9:.2f} GB/s",
        "",
        "| generation batch | tokens/s | roofline tokens/s (bound) | of roofline "
        "| of compute roofline (2P/token) |"
        " of bandwidth limit (4P bytes/step) |",
        "|---|---|---|---|---|---|",
    ]
    for row in generation_rows(measured, params):
        lines.append(
            f"| {row['batch']} | {row['tokens_per_s']:.1f} "
            f"| {row['roofline_tokens_per_s']:.1f} ({row['bound']}) "
            f"| {row['fraction_of_roofline']:.1%} | {row['fraction_of_compute_roofline']:.1%} "
            f"| {row['fraction_of_bandwidth_limit']:.1%} |"
        )
    train = measured["training"]
    six, four = train["tokens_per_s"] * 6 * params / flops, train["tokens_per_s"] * 4 * params / flops
    lines += [
        "",
        f"training (LoRA update, batch {measured['train_batch']} × {measured['train_length']} tokens): "
        f"{train['tokens_per_s']:.1f} tokens/s = {six:.1%} of the compute roofline at 6P FLOPs/token "
        f"({four:.1%} at the 4P a LoRA update needs)",
    ]
    measured["training"].update(
        {"fraction_of_compute_roofline_6p": six, "fraction_of_compute_roofline_4p": four}
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batches", default="1,8,32,128", help="generation batch sizes, comma-separated")
    parser.add_argument("--decoder", default="auto", choices=DECODERS,
                        help="the hf backend's decoder: ponder's lean Llama forward (auto) or the transformers model's")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-length", type=int, default=256)
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument("--buffer-mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model and sizes: a script check, not a measurement"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.new_tokens, args.train_batch, args.train_length = (
            "tiny",
            "1,2",
            4,
            2,
            16,
        )
        args.matmul_n, args.buffer_mib, args.reps = 128, 8, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ponder.models import load_policy

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    measured: dict[str, Any] = {
        "command": sys.argv,
        "machine": machine_info(),
        "model": args.model,
        "threads": args.threads,
        "matmul_n": args.matmul_n,
        "train_batch": args.train_batch,
        "train_length": args.train_length,
        "decoder": args.decoder,
    }
    with torch.no_grad():
        measured["matmul_flops_by_library"] = matmul_flops(args.matmul_n, args.reps)
        measured["matmul_flops_per_s"] = max(measured["matmul_flops_by_library"].values())
        measured["bandwidth"] = bandwidth(args.buffer_mib, args.reps)
    policy = load_policy(args.model, "float32", "cpu")
    measured["params"] = parameter_count(policy.model)
    measured["rollout"] = {str(b): rollout_throughput(policy, b, args.new_tokens, args.reps, args.decoder)
                          for b in batches}
    measured["training"] = training_throughput(policy, args.train_batch, args.train_length, args.reps)
    print(report(measured))
    measured["generation"] = generation_rows(measured, measured["params"])
    if args.out:
        args.out.write_text(json.dumps(measured, indent=2))
        print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
