"""ponder's decode on a GPU against the GPU's rooflines, all measured in one run.

    python -m bench.gpu_decode --model DIR [--batches 1 256] [--new-tokens 128]
        [--decoders transformers auto] [--out gpu_decode.json]

DIR is a model directory (bench.gpu_model builds a randomly initialised one of
Qwen2.5-1.5B's shape). Measures, on the GPU, in bfloat16:
- HBM bandwidth: the best of several device-to-device copies of a 2 GiB buffer,
  bytes read plus bytes written;
- bf16 matmul throughput: the best of several 8192³ products;
- ponder's rollout decode (`HFBackend.generate`, the `hf` backend, KV cache) at
  each batch size, with each decoder (`rollout.sampling.decoder`: `transformers`
  is the transformers model's eager forward, `auto` the lean decoder's steps
  replayed from CUDA graphs, `compiled` those steps compiled by torch.compile
  before capture), the decoders alternating: sampled tokens per second after a
  warm-up call of the same shape (its time, compilation included, is reported);
- the sampler-trainer mismatch of each decoder: mean and max |Δ logprob| between
  the logprobs recorded while sampling and the transformers model's forward pass
  (what the trainer computes) over the same tokens;
- a profile of one batch-1 decode step per decoder: CUDA kernel time against wall
  time and the number of kernels launched (why batch 1 is or is not at its roofline);

and reports each decode rate as a fraction of its rooflines: bandwidth,
B × bandwidth ÷ (bytes of weights read per step), and compute, peak FLOP/s ÷ 2P
per token (P = parameters, the tied embedding counted once as the LM head).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def _best_cuda_time(fn: Any, reps: int) -> float:
    """The shortest of `reps` timed calls, in seconds (CUDA events, after one warm-up)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return best


def machine_peaks(reps: int = 10) -> dict[str, float]:
    """Measured HBM bandwidth (bytes/s, read + written) and bf16 matmul FLOP/s."""
    src = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    seconds = _best_cuda_time(lambda: dst.copy_(src), reps)
    bandwidth = 2 * src.numel() * src.element_size() / seconds
    del src, dst
    n = 8192
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    flops = 2 * n**3 / _best_cuda_time(lambda: a @ b, reps)
    return {"hbm_bytes_per_s": bandwidth, "bf16_flops": flops, "device_name": torch.cuda.get_device_name()}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_rate(backend: Any, batch: int, prompt_len: int, new_tokens: int, seed: int) -> dict[str, float]:
    """Sampled tokens per second of one `generate` call of `batch` rows."""
    from ponder.rollout.backend import GenerationRequest

    gen = torch.Generator().manual_seed(seed)
    vocab = backend.policy.model.config.vocab_size
    prompts = torch.randint(300, vocab, (batch, prompt_len), generator=gen).tolist()
    requests = [GenerationRequest(f"r{seed}-{i}", ids, new_tokens) for i, ids in enumerate(prompts)]
    _sync()
    tick = time.perf_counter()
    out = backend.generate(requests, [])
    _sync()
    seconds = time.perf_counter() - tick
    tokens = sum(len(g.token_ids) for g in out)
    return {"batch": batch, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def mismatch(backend: Any, batch: int, prompt_len: int, new_tokens: int) -> dict[str, float]:
    """|Δ logprob| between sampling and the transformers forward pass on the same tokens."""
    from ponder.models.logprobs import token_logprobs
    from ponder.rollout.backend import GenerationRequest

    gen = torch.Generator().manual_seed(7)
    vocab = backend.policy.model.config.vocab_size
    prompts = torch.randint(300, vocab, (batch, prompt_len), generator=gen).tolist()
    out = backend.generate([GenerationRequest(f"m{i}", ids, new_tokens) for i, ids in enumerate(prompts)], [])
    deltas = []
    with torch.no_grad():
        for ids, g in zip(prompts, out):
            full = torch.tensor([ids + g.token_ids], device=backend.policy.device)
            trainer = token_logprobs(backend.policy.model, full, torch.ones_like(full))[0, len(ids) - 1 :]
            deltas.append((trainer.float().cpu() - torch.tensor(g.logprobs)).abs())
    delta = torch.cat(deltas)
    return {"mean_abs_dlogprob": delta.mean().item(), "max_abs_dlogprob": delta.max().item()}


def step_profile(backend: Any, prompt_len: int, new: int = 32) -> dict[str, Any]:
    """One batch-1 generate under torch.profiler: kernel time against wall time per
    token, and the kernels that took the most GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run = decode_rate(backend, 1, prompt_len, new, seed=99)
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name[:60], []).append(e.device_time)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]
    tokens = run["tokens"]
    return {"wall_s_per_token": run["seconds"] / tokens, "kernel_s_per_token": sum(e.device_time for e in events) / 1e6 / tokens,
            "kernels_per_token": len(events) / tokens,
            "top_kernels_us_per_token": {name: [round(sum(t) / tokens, 1), round(len(t) / tokens, 1)] for name, t in top}}  # fmt: skip


def rooflines(params: int, weight_bytes: int, peaks: dict[str, float], batch: int) -> dict[str, float]:
    """Tokens/s bounds at `batch`: weights read once per step; 2P FLOPs per token."""
    bandwidth_bound = batch * peaks["hbm_bytes_per_s"] / weight_bytes
    compute_bound = peaks["bf16_flops"] / (2 * params)
    return {"bandwidth_bound": bandwidth_bound, "compute_bound": compute_bound}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model directory (bench.gpu_model)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--decoders", nargs="+", default=["transformers", "auto", "compiled"],
                        help="rollout.sampling.decoder values to compare, alternating")  # fmt: skip
    parser.add_argument("--device", default="cuda", help="cpu only checks the script (no rooflines)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_decode needs a CUDA GPU (or --device cpu to check the script)")
    from ponder.config import SamplingConfig
    from ponder.models import load_policy
    from ponder.rollout.hf import HFBackend

    peaks = machine_peaks() if args.device == "cuda" else {"hbm_bytes_per_s": 1.0, "bf16_flops": 1.0}
    print(f"machine: {json.dumps(peaks)}", flush=True)
    policy = load_policy(args.model, "bfloat16" if args.device == "cuda" else "float32", args.device)
    params = sum(p.numel() for p in policy.model.parameters())  # tied embedding counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    backends = {}
    for decoder in args.decoders:
        sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=args.new_tokens,
                                  max_total_tokens=args.prompt_len + args.new_tokens, decoder=decoder)  # fmt: skip
        backends[decoder] = HFBackend(policy, sampling, seed=0, reuse_kv=False)
    result: dict[str, Any] = {"command": sys.argv, "machine": peaks, "parameters": params, "rows": []}
    for batch in args.batches:
        for decoder, backend in backends.items():
            # warm-up of the same shape: kernels chosen and compiled, memory pooled
            warm = decode_rate(backend, batch, args.prompt_len, args.new_tokens, seed=1)
            row = {"decoder": decoder, **decode_rate(backend, batch, args.prompt_len, args.new_tokens, seed=2)}
            row["warmup_seconds"] = warm["seconds"]
            row.update(rooflines(params, weight_bytes, peaks, batch))
            row["of_bandwidth_bound"] = row["tokens_per_s"] / row["bandwidth_bound"]
            row["of_compute_bound"] = row["tokens_per_s"] / row["compute_bound"]
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            if args.out:  # as it goes: a later failure keeps the rows measured
                args.out.write_text(json.dumps(result, indent=1))
    for decoder, backend in backends.items():
        result[f"mismatch_{decoder}"] = mismatch(backend, 8, args.prompt_len, 32)
        result[f"profile_batch1_{decoder}"] = step_profile(backend, args.prompt_len)
        print(f"{decoder}: mismatch {json.dumps(result[f'mismatch_{decoder}'])} "
              f"profile {json.dumps(result[f'profile_batch1_{decoder}'])}", flush=True)  # fmt: skip
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
