"""The OpenAI-SDK math agent as a standalone script, trained through ponder's gateway
as a command run once per episode (a program in any language works the same way):

    ponder train --recipe recipes/gateway_math.yaml --out runs/gateway-command \
        env.options.agent=null 'env.options.command=[python, examples/agents/openai_command.py]'

It reads what the gateway sets: OPENAI_BASE_URL and OPENAI_API_KEY (which the openai
client picks up by itself), PONDER_MODEL and PONDER_TASK (the task as JSON), and prints
its reward as the last line (a JSON object of named numbers).
"""

from __future__ import annotations

import json
import os
import sys

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mathtools import calculate, score  # noqa: E402 - the script runs from anywhere

SYSTEM = ("Solve the math problem. Use the calculator tool for arithmetic. "
          "End with the final answer as: Answer: NUMBER")  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as (12 + 7) * 3.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}}]  # fmt: skip


def main() -> None:
    task = json.loads(os.environ["PONDER_TASK"])
    client = openai.OpenAI(max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    text = ""
    for _ in range(3):
        message = client.chat.completions.create(model=os.environ.get("PONDER_MODEL", "policy"),
                                                 messages=messages, tools=TOOLS).choices[0].message  # fmt: skip
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
    print(json.dumps(score(text, task["answers"])))


if __name__ == "__main__":
    main()
