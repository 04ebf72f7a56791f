"""Latency of small retrieval requests while one large request is in flight.

Starts `ponder serve-retriever` (BM25) in its own process on 127.0.0.1 over a synthetic
corpus, then measures one-query requests: first alone, then back to back while another
client's request of `--large` queries is being answered. Before the server's global
search lock was removed, every small request waited for the whole large one.

    python bench/retrieval_server_load.py [--docs 50000] [--large 3000] [--rounds 3]
        [--server-arg=--max-queries=5000 ...] [--out FILE]

Prints p50/p99 in milliseconds as JSON; docs/results/safety.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def write_corpus(path: Path, docs: int, seed: int = 0) -> list[str]:
    """`docs` passages of 30 words from a 5000-word vocabulary; returns the vocabulary."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))
                  for _ in range(5000)]  # fmt: skip
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(docs):
            words = " ".join(rng.choice(vocabulary) for _ in range(30))
            handle.write(json.dumps({"id": str(index), "contents": words}) + "\n")
    return vocabulary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(corpus: Path, port: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "ponder.cli", "serve-retriever", "--corpus", str(corpus), "--port", str(port),
               *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the retrieval server did not start")


def percentiles(latencies_ms: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 1), "p99_ms": round(p99, 1),
            "max_ms": round(ordered[-1], 1)}  # fmt: skip


def small_request(client: httpx.Client, url: str, query: str) -> float:
    started = time.perf_counter()
    response = client.post(url, json={"queries": [query], "topk": 3})
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


def under_load(url: str, vocabulary: list[str], large: int, rounds: int, headers: dict) -> tuple[list[float], list[float]]:
    """(small-request latencies while a large request ran, the large requests' durations)."""
    rng = random.Random(1)
    small, large_ms = [], []
    with httpx.Client(timeout=600, headers=headers) as client:
        for _ in range(rounds):
            queries = [" ".join(rng.sample(vocabulary, 5)) for _ in range(large)]
            done = threading.Event()

            def post_large() -> None:
                started = time.perf_counter()
                with httpx.Client(timeout=600, headers=headers) as own:
                    own.post(url, json={"queries": queries, "topk": 3}).raise_for_status()
                large_ms.append((time.perf_counter() - started) * 1000)
                done.set()

            thread = threading.Thread(target=post_large)
            thread.start()
            time.sleep(0.1)  # the large request is being answered
            while not done.is_set():
                small.append(small_request(client, url, " ".join(rng.sample(vocabulary, 5))))
            thread.join()
    return small, large_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--large", type=int, default=3000, help="queries in the large request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server-arg", action="append", default=[], help="extra serve-retriever argument")
    parser.add_argument("--api-key", help="sent as a bearer token (when the server asks for one)")
    parser.add_argument("--out")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        vocabulary = write_corpus(corpus, args.docs)
        port = free_port()
        server = start_server(corpus, port, args.server_arg)
        try:
            url = f"http://127.0.0.1:{port}/retrieve"
            rng = random.Random(2)
            with httpx.Client(timeout=60, headers=headers) as client:
                alone = [small_request(client, url, " ".join(rng.sample(vocabulary, 5))) for _ in range(200)]
            small, large_ms = under_load(url, vocabulary, args.large, args.rounds, headers)
        finally:
            server.kill()
            server.wait()
    report = {
        "docs": args.docs, "large_queries": args.large, "server_args": args.server_arg,
        "small_alone": percentiles(alone), "small_during_large": percentiles(small),
        "large_request_ms": [round(ms) for ms in large_ms],
    }  # fmt: skip
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
