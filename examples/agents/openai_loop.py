"""A plain OpenAI-SDK tool loop for math word problems, trained unchanged through
ponder's gateway. Nothing here knows ponder: the program gets an OpenAI base_url and a
key, offers its own calculator as an OpenAI tool, loops until the model answers, and
scores its answer. ponder records every call's tokens and trains on them:

    ponder train --recipe recipes/gateway_math.yaml --out runs/gateway-math

The same function runs against any OpenAI-compatible server (`ponder serve`, vLLM,
a hosted model): `asyncio.run(run(task, "http://127.0.0.1:8000/v1", "KEY"))`.
"""

from __future__ import annotations

import json

import openai

from examples.agents.mathtools import calculate, score

SYSTEM = ("Solve the math problem. Use the calculator tool for arithmetic. "
          "End with the final answer as: Answer: NUMBER")  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as (12 + 7) * 3.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}}]  # fmt: skip
MAX_TURNS = 3


async def run(task: dict, base_url: str, api_key: str) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    text = ""
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        text = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return score(text, task["answers"])
