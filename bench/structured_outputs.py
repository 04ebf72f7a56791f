"""The OpenAI API's structured-output promises, kept by `ponder serve` on a real model:
starts `ponder serve` on 127.0.0.1 and sends, with the real `openai` client, --requests
forced tool choices (required and named, strict tools, varied schemas: nested objects,
enums, arrays, required fields, bounded numbers) and --requests `response_format:
json_schema` requests, greedy and at temperature 1; counts the replies that are valid
calls (of the named tool, with schema-valid arguments) and valid JSON, and checks that
streamed and whole greedy replies agree.

    .venv/bin/python bench/structured_outputs.py --requests 100 --out runs/bench/structured.json
    .venv/bin/python bench/structured_outputs.py --smoke     # the tiny model, a few requests

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
    """One forced tool choice; None when the reply keeps its promise, else why not."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"tool number {i}",
                                               "parameters": object_schema(rng), "strict": True}}
             for i in range(rng.randint(1, 3))]  # fmt: skip
    named = rng.random() < 0.5
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


def run(client: openai.OpenAI, model: str, requests: int) -> dict:
    results: dict = {}
    for kind, case in (("tool_choice", tool_case), ("response_format", json_case)):
        for temperature in (0.0, 1.0):
            rng, failures, start = random.Random(f"{kind}{temperature}"), [], time.perf_counter()
            for seed in range(requests):
                try:
                    problem = case(client, model, rng, temperature, seed)
                except openai.UnprocessableEntityError as err:  # max_tokens ran out first
                    problem = str(err.body.get("message", err))[:200]
                if problem is not None:
                    failures.append({"seed": seed, "problem": problem})
            name = f"{kind} at temperature {temperature:g}"
            results[name] = {"requests": requests, "valid": requests - len(failures), "failures": failures,
                             "seconds": time.perf_counter() - start}  # fmt: skip
            print(f"{name}: {requests - len(failures)}/{requests} valid "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    rng = random.Random("stream")
    agree = sum(stream_agrees(client, model, rng) for _ in range(max(2, requests // 10)))
    results["stream equals whole (greedy)"] = {"requests": max(2, requests // 10), "agree": agree}
    print(f"streamed and whole greedy calls agree: {agree}/{max(2, requests // 10)}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=100, help="per kind and temperature")
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
        results = run(client, args.model, args.requests)
    finally:
        process.terminate()
        process.wait(30)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, **results}, indent=2))
    return 0 if all(r.get("valid", r.get("agree")) == r["requests"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
