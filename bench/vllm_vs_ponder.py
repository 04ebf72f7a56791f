"""Rollout throughput: ponder's CPU decoder (the `hf` backend) against vLLM-CPU (the
`vllm` backend, a server ponder starts in .venv-vllm), same model, same prompts, same
sampling, batch by batch with the two systems alternating so a change in machine load
hits both. Generated tokens / wall seconds of `backend.generate`, the call the rollout
engine makes (vLLM's figure includes its HTTP round trip).

    .venv/bin/python bench/vllm_vs_ponder.py --batches 1 8 32 --new-tokens 64 --repeats 2 \
        [--ponder-dtypes float32 bfloat16] [--vllm-dtypes float32 bfloat16] [--load 2]

ponder samples in each dtype asked for (`rollout.sampling.dtype`: bfloat16 keeps the
matrices in bf16, its fastest where the CPU has bf16 instructions); vLLM-CPU in each
dtype asked for (one server per dtype; `--vllm-dtypes` with no value: ponder alone,
no .venv-vllm needed). Then, for each system, the gap between its sampling log-probs
and the fp32 trainer's on the tokens it sampled (`--gap-batch` episodes): the mean
|Δ logprob|, the largest, and the k3 KL(sampler ‖ trainer), as the RL update logs it.

--load N measures each system twice: on the idle machine, then beside a competing job
of N busy processes (one session of its own, at this process's priority, like another
user's job; started --settle seconds before, so the load average printed has seen it),
and prints each system's slowdown and the threads ponder's decoder chose. Each round
also reads the kernel's scheduler accounting (/proc/PID/task/TID/schedstat) of the
system it measures (ponder: this process; vLLM: the server's process group): CPU
seconds on a core and seconds waiting for one, per generated token, so a slowdown
under load reads as more work per token (shared caches, memory bandwidth, spinning)
or as time in the run queue (the scheduler's share).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ponder.algos import sampler_mismatch
from ponder.config import RolloutConfig, SamplingConfig
from ponder.models import load_policy
from ponder.models.cpu_threads import last_decision
from ponder.models.forward import forward_policy
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


def schedstat(backend) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting in a run queue) summed over the threads of
    the processes that do `backend`'s work: this process, or the vLLM server's group."""
    server = getattr(backend, "server", None)
    pids = [os.getpid()] if server is None else _group(os.getpgid(server.process.pid))
    run = wait = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                on_cpu, queued, _ = (task / "schedstat").read_text().split()
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue  # a thread that ended meanwhile
            run, wait = run + int(on_cpu), wait + int(queued)
    return run / 1e9, wait / 1e9


def _group(pgid: int) -> list[int]:
    """The processes of process group `pgid` (field 5 of /proc/PID/stat)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def tokens_per_s(backend, contexts: list[list[int]], new_tokens: int, round_index: int) -> dict[str, float]:
    """Generated tokens / wall second of one `generate` call, with its CPU and
    run-queue milliseconds per token."""
    # fresh keys each round: no KV reuse across rounds for ponder (vLLM's prefix cache stays on, its default)
    requests = [GenerationRequest(f"r{round_index}-{i}", c, new_tokens) for i, c in enumerate(contexts)]
    run, wait = schedstat(backend)
    start = time.perf_counter()
    generations = backend.generate(requests, [])
    elapsed = time.perf_counter() - start
    run_after, wait_after = schedstat(backend)
    tokens = sum(len(g.token_ids) for g in generations)
    return {"tok/s": tokens / elapsed, "cpu ms/tok": 1e3 * (run_after - run) / tokens,
            "wait ms/tok": 1e3 * (wait_after - wait) / tokens}  # fmt: skip


SPIN = """
import multiprocessing, sys
def spin():
    while True:
        pass
for _ in range(int(sys.argv[1]) - 1):
    multiprocessing.Process(target=spin, daemon=True).start()
spin()
"""


def competing_load(processes: int) -> subprocess.Popen:
    """N busy processes in one new session (its own scheduler group, as a job started
    from another shell has), at this process's priority."""
    return subprocess.Popen([sys.executable, "-c", SPIN, str(processes)], start_new_session=True)


def sweep(systems: dict, tokenizer, args: argparse.Namespace, label: str) -> list[dict]:
    """Each batch size, the systems alternating, median tokens/s of args.repeats rounds."""
    results = []
    for batch in args.batches:
        contexts = prompts(tokenizer, batch)
        runs: dict[str, list[dict]] = {name: [] for name in systems}
        threads = []  # what ponder's decoder chose (ponder.models.cpu_threads)
        for round_index in range(args.repeats):
            for name, backend in systems.items():
                time.sleep(args.pause)  # vLLM's engine polls a core for ~1 s after it answers
                runs[name].append(tokens_per_s(backend, contexts, args.new_tokens, round_index))
                threads += [last_decision()] if name.startswith("ponder") else []
        row = {"batch": batch, "load": label, "ponder threads": threads}
        for name, rounds in runs.items():  # medians over the rounds (each round kept in the JSON)
            row[f"{name} rounds"] = rounds
            for key in rounds[0]:
                row[name if key == "tok/s" else f"{name} {key}"] = statistics.median(r[key] for r in rounds)
        cells = "  ".join(f"{name} {row[name]:7.1f}" for name in systems)
        ratios = ratio_cells(row, list(systems))
        print(f"{label} batch {batch:>3}: {cells} tok/s  {ratios}  threads {threads}", flush=True)
        accounting = "  ".join(f"{name} {row[f'{name} cpu ms/tok']:.1f} + {row[f'{name} wait ms/tok']:.1f}"
                               for name in systems)  # fmt: skip
        print(f"{'':>{len(label)}} cpu + run-queue ms/token: {accounting}", flush=True)
        results.append(row)
    return results


def ratio_cells(row: dict, names: list[str]) -> str:
    """Adds ponder's best over vLLM's best (with both) or bf16 over fp32 (ponder alone)."""
    ponder = [n for n in names if n.startswith("ponder")]
    vllm = [n for n in names if n.startswith("vllm")]
    if vllm:
        row["ponder/best vllm"] = max(row[n] for n in ponder) / max(row[n] for n in vllm)
        return f"best ponder/best vLLM {row['ponder/best vllm']:.2f}"
    if {"ponder-float32", "ponder-bfloat16"} <= set(names):
        row["bf16/fp32"] = row["ponder-bfloat16"] / row["ponder-float32"]
        return f"ponder bf16/fp32 {row['bf16/fp32']:.2f}"
    return ""


def logprob_gap(backend, policy, contexts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """The sampler's log-probs of the tokens it sampled against the fp32 trainer's
    (`forward_policy`, the update's forward) on the same tokens."""
    requests = [GenerationRequest(f"gap-{i}", c, new_tokens) for i, c in enumerate(contexts)]
    generations = backend.generate(requests, [])
    width = max(len(c) + len(g.token_ids) for c, g in zip(contexts, generations))
    ids = torch.full((len(contexts), width), policy.tokenizer.pad_token_id)
    mask, sampled = torch.zeros(len(contexts), width, dtype=torch.long), torch.zeros(len(contexts), width - 1)
    policy_tokens = torch.zeros(len(contexts), width - 1)
    for row, (context, generation) in enumerate(zip(contexts, generations)):
        tokens = context + generation.token_ids
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        span = slice(len(context) - 1, len(tokens) - 1)  # position t predicts token t + 1
        sampled[row, span] = torch.tensor(generation.logprobs)
        policy_tokens[row, span] = 1
    with torch.no_grad():
        trainer, _, _ = forward_policy(policy.model, ids, mask, loss_mask=policy_tokens)
    gap = ((trainer - sampled).abs() * policy_tokens).max()
    return {**sampler_mismatch(trainer, sampled, policy_tokens), "max_abs": float(gap)}


def slowdowns(idle: list[dict], loaded: list[dict], names: list[str]) -> None:
    """Print idle / loaded tokens/s per system and batch size."""
    for quiet, busy in zip(idle, loaded):
        cells = "  ".join(f"{name} {quiet[name] / busy[name]:5.2f}x" for name in names)
        print(f"slowdown batch {quiet['batch']:>3}: {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds per batch size (median kept)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--ponder-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--vllm-dtypes", nargs="*", default=["float32"], choices=["float32", "bfloat16"],
                        help="vLLM-CPU servers to start (none: ponder alone)")
    parser.add_argument("--gap-batch", type=int, default=32, help="episodes for the log-prob gap (0: skip)")
    parser.add_argument("--load", type=int, default=0,
                        help="then measure again beside N busy processes (0: idle only)")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds the load runs before measuring")
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds between two systems' rounds (vLLM-CPU's engine polls a core for ~1 s "
                             "after each answer; ponder's thread count would see it)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    policy = load_policy("smollm2-135m")
    systems = {}
    for dtype in args.ponder_dtypes:
        sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=args.new_tokens,
                                  max_total_tokens=512, dtype=dtype)  # fmt: skip
        systems[f"ponder-{dtype}"] = HFBackend(policy, sampling, seed=0)
    rollout = RolloutConfig(sampling=sampling, vllm_python=args.vllm_python)
    for dtype in args.vllm_dtypes:  # the server's dtype is the policy's
        served = policy if dtype == "float32" else load_policy("smollm2-135m", dtype)
        systems[f"vllm-{dtype}"] = VLLMBackend(served, rollout, seed=0)
    for backend in systems.values():  # warm-up: packed weights, vLLM's first-request setup
        tokens_per_s(backend, prompts(policy.tokenizer, 2), 8, -1)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    results = sweep(systems, policy.tokenizer, args, "idle")
    if args.load:
        load = competing_load(args.load)
        try:
            time.sleep(args.settle)
            busy = os.getloadavg()[0]
            print(f"competing load of {args.load} processes; load average {busy:.2f}", flush=True)
            loaded = sweep(systems, policy.tokenizer, args, "loaded")
        finally:
            os.killpg(load.pid, 9)
            load.wait()
        slowdowns(results, loaded, list(systems))
        results += loaded
    gaps = {}
    for name, backend in systems.items() if args.gap_batch else ():
        gaps[name] = logprob_gap(backend, policy, prompts(policy.tokenizer, args.gap_batch), args.new_tokens)
        cells = "  ".join(f"{key} {value:.2e}" for key, value in gaps[name].items())
        print(f"log-prob gap to the fp32 trainer, {name}: {cells}", flush=True)
    for name, backend in systems.items():
        if name.startswith("vllm"):
            backend.server.close()
    if args.out:
        out = {"threads": torch.get_num_threads(), "results": results, "logprob_gap": gaps}
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
