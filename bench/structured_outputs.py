"""The OpenAI API's structured-output promises, kept by `ponder serve` on a real model:
starts `ponder serve` on 127.0.0.1 and sends, with the real `openai` client, --requests
forced tool choices (required and named, strict tools, varied schemas: nested objects,
enums, arrays, required fields, bounded numbers) and --requests `response_format:
json_schema` requests, greedy and at temperature 1; counts the replies that are valid
calls (of the named tool, with schema-valid arguments) and valid JSON, and checks that
streamed and whole greedy replies agree.

    .venv/bin/python bench/structured_outputs.py --requests 200 --clients 32 --out runs/bench/structured.json
    .venv/bin/python bench/structured_outputs.py --smoke     # the tiny model, a few requests

Each block's requests go out from --clients threads at once (the server batches them);
every request draws its schema, question and options from its own rng, seeded by
(kind, temperature, index), so what is asked does not depend on the scheduling.

Prints one line per kind and writes every count (and every failure) as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["What is the weather in Paris tomorrow?", "Book a table for two at eight.",
             "Convert 12 miles to kilometres.", "Find flights from Oslo to Rome.", "Say something."]  # fmt: skip


def random_schema(rng: random.Random, depth: int = 0, longest: int = 24) -> dict:
    """A schema of the kinds tools use (numbers with a multipleOf and closed objects, as
    OpenAI's strict mode asks); strings at most `longest` characters."""
    kinds = ["enum", "integer", "number", "boolean", "string", "array"] + (["object"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "enum":
        return {"enum": rng.sample(["celsius", "fahrenheit", "kelvin", "metric", "imperial"], rng.randint(2, 3))}
    if kind in ("integer", "number"):
        low = rng.randint(-20, 50)
        step = {"multipleOf": 0.5} if kind == "number" else {}
        return {"type": kind, "minimum": low, "maximum": low + rng.randint(1, 100), **step}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(min(4, longest), longest)}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1, longest), "minItems": 1, "maxItems": 3}
    if kind == "boolean":
        return {"type": "boolean"}
    names = rng.sample(["city", "date", "count", "unit", "name", "price"], rng.randint(1, 3))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1, longest) for n in names},
            "required": rng.sample(names, rng.randint(1, len(names))), "additionalProperties": False}  # fmt: skip


def object_schema(rng: random.Random, longest: int = 24) -> dict:
    schema = random_schema(rng, 1, longest)
    if schema.get("type") == "object":
        return schema
    return {"type": "object", "properties": {"value": schema}, "required": ["value"], "additionalProperties": False}


def tool_case(client: openai.OpenAI, model: str, rng: random.Random, temperature: float, seed: int) -> str | None:
    """One forced tool choice; None when the reply keeps its promise, else why not.
    `rng`'s first draw picks the mode (tool_mode), so it can be told apart afterwards."""
    named = tool_mode(rng) == "named"
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"tool number {i}",
                                               "parameters": object_schema(rng), "strict": True}}
             for i in range(rng.randint(1, 3))]  # fmt: skip
    choice = {"type": "function", "function": {"name": tools[-1]["function"]["name"]}} if named else "required"
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": rng.choice(QUESTIONS)}],
                                           tools=tools, tool_choice=choice, temperature=temperature, seed=seed,
                                           max_tokens=400, parallel_tool_calls=rng.random() < 0.5)  # fmt: skip
    calls = reply.choices[0].message.tool_calls or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if not calls:
        return "no call"
    for call in calls:
        if call.function.name not in schemas or (named and call.function.name != tools[-1]["function"]["name"]):
            return f"called {call.function.name}"
        try:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        except (ValueError, jsonschema.ValidationError) as err:
            return str(err).splitlines()[0]
    return None


def tool_mode(rng: random.Random) -> str:
    """`named` (tool_choice names the last tool) or `required`, one draw of `rng`."""
    return "named" if rng.random() < 0.5 else "required"


def request_rng(kind: str, temperature: float, index: int) -> random.Random:
    """The rng of one request: the same draws whatever order the requests run in."""
    return random.Random(f"{kind}/{temperature:g}/{index}")


def json_case(client: openai.OpenAI, model: str, rng: random.Random, temperature: float, seed: int) -> str | None:
    schema = random_schema(rng)
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": rng.choice(QUESTIONS)}],
                                           response_format=response_format, temperature=temperature, seed=seed,
                                           max_tokens=400)  # fmt: skip
    try:
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    except (ValueError, jsonschema.ValidationError) as err:
        return str(err).splitlines()[0]
    return None


def stream_agrees(client: openai.OpenAI, model: str, rng: random.Random) -> bool:
    """A greedy forced call streamed adds up to the same calls as the whole reply."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": object_schema(rng), "strict": True}}]
    body = {"model": model, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}], "tools": tools,
            "tool_choice": "required", "temperature": 0, "max_tokens": 400}  # fmt: skip
    whole = [(c.function.name, json.loads(c.function.arguments))
             for c in client.chat.completions.create(**body).choices[0].message.tool_calls]  # fmt: skip
    streamed: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.function.name:
                streamed[delta.index] = [delta.function.name, ""]
            streamed[delta.index][1] += delta.function.arguments or ""
    return [(name, json.loads(arguments)) for name, arguments in streamed.values()] == whole


def serve(model: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "ponder.cli", "serve", "--model", model, "--port", str(port),
               "--max-tokens-limit", "512", "--backend", "hf"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_ready(client: openai.OpenAI, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ponder serve exited: {process.stderr.read()[-2000:]}")
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            time.sleep(0.5)
    raise RuntimeError("ponder serve did not answer in time")


def one_request(client: openai.OpenAI, model: str, kind: str, temperature: float, seed: int) -> dict:
    """One request of a block: {seed, mode, problem} (problem None: valid)."""
    case = tool_case if kind == "tool_choice" else json_case
    mode = tool_mode(request_rng(kind, temperature, seed)) if kind == "tool_choice" else "json_schema"
    try:
        problem = case(client, model, request_rng(kind, temperature, seed), temperature, seed)
    except openai.UnprocessableEntityError as err:  # max_tokens ran out first
        problem = str(err.body.get("message", err))[:300]
    except openai.APIError as err:  # any other refusal is a miss too, not the end of the run
        problem = f"{type(err).__name__}: {str(err)[:300]}"
    if problem is not None:
        print(f"  miss: {kind} at temperature {temperature:g}, seed {seed} ({mode}): {problem}", flush=True)
    return {"seed": seed, "mode": mode, "problem": problem}


def stream_check(client: openai.OpenAI, model: str, index: int) -> str | None:
    """None when stream_agrees, else why not."""
    try:
        return None if stream_agrees(client, model, request_rng("stream", 0.0, index)) else "differ"
    except (openai.APIError, ValueError, TypeError, KeyError) as err:
        return f"{type(err).__name__}: {str(err)[:300]}"


def run(client: openai.OpenAI, model: str, requests: int, clients: int = 8) -> dict:
    results: dict = {}
    with ThreadPoolExecutor(clients) as pool:
        for kind in ("tool_choice", "response_format"):
            for temperature in (0.0, 1.0):
                start = time.perf_counter()
                done = list(pool.map(lambda seed: one_request(client, model, kind, temperature, seed), range(requests)))
                seconds = time.perf_counter() - start
                failures = [{"seed": d["seed"], "mode": d["mode"], "problem": d["problem"]}
                            for d in done if d["problem"] is not None]  # fmt: skip
                modes = {mode: {"requests": sum(d["mode"] == mode for d in done),
                                "valid": sum(d["mode"] == mode and d["problem"] is None for d in done)}
                         for mode in sorted({d["mode"] for d in done})}  # fmt: skip
                name = f"{kind} at temperature {temperature:g}"
                results[name] = {"requests": requests, "valid": requests - len(failures), "modes": modes,
                                 "failures": failures, "seconds": seconds}  # fmt: skip
                split = ", ".join(f"{mode} {m['valid']}/{m['requests']}" for mode, m in modes.items())
                print(f"{name}: {requests - len(failures)}/{requests} valid ({split}; {seconds:.0f} s)", flush=True)
        checks = max(2, requests // 10)
        start = time.perf_counter()
        problems = list(pool.map(lambda index: stream_check(client, model, index), range(checks)))
    agree = problems.count(None)
    results["stream equals whole (greedy)"] = {
        "requests": checks, "agree": agree, "seconds": time.perf_counter() - start,
        "failures": [{"index": i, "problem": p} for i, p in enumerate(problems) if p is not None]}  # fmt: skip
    print(f"streamed and whole greedy calls agree: {agree}/{checks}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=100, help="per kind and temperature")
    parser.add_argument("--clients", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 3 requests each")
    parser.add_argument("--out", help="write the counts here as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.requests = "tiny", 3
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = serve(args.model, port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        wait_ready(client, process)
        start = time.perf_counter()
        results = run(client, args.model, args.requests, args.clients)
        results["wall seconds"] = time.perf_counter() - start
    finally:
        process.terminate()
        process.wait(30)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, **results}, indent=2))
    print(f"wall time: {results['wall seconds']:.0f} s with {args.clients} clients")
    blocks = [r for r in results.values() if isinstance(r, dict)]
    return 0 if all(r.get("valid", r.get("agree")) == r["requests"] for r in blocks) else 1


if __name__ == "__main__":
    sys.exit(main())
