"""A smolagents `ToolCallingAgent` for math word problems, trained unchanged through
ponder's gateway: its own calculator as a smolagents `Tool`, `OpenAIServerModel`
pointed at the session's base_url, the answer through smolagents' `final_answer`.

    ponder train --recipe recipes/gateway_math.yaml --out runs/gateway-smolagents \
        env.options.agent=examples.agents.smolagents_agent:run \
        env.options.teacher=examples.agents.smolagents_agent:demonstration

smolagents' own system prompt is ~900 tokens of worked examples; a 135M model reads a
short one better, so the program sets its own (as any smolagents user may).
"""

from __future__ import annotations

import json

from smolagents import OpenAIServerModel, Tool, ToolCallingAgent
from smolagents.agents import EMPTY_PROMPT_TEMPLATES

from examples.agents.mathtools import calculate

SYSTEM = ("Solve the math problem. Use the calculator tool for arithmetic, then give the result with the "
          "final_answer tool.")  # fmt: skip
MAX_STEPS = 3


class Calculator(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression such as (12 + 7) * 3."
    inputs = {"expression": {"type": "string", "description": "the expression"}}
    output_type = "string"

    def forward(self, expression: str) -> str:
        return calculate(expression)


def run(task: dict, base_url: str, api_key: str) -> dict[str, float]:
    model = OpenAIServerModel(model_id="policy", api_base=base_url, api_key=api_key, client_kwargs={"max_retries": 0})
    templates = {**EMPTY_PROMPT_TEMPLATES, "system_prompt": SYSTEM}
    agent = ToolCallingAgent(tools=[Calculator()], model=model, prompt_templates=templates, max_steps=MAX_STEPS,
                             verbosity_level=0)  # fmt: skip
    answer = str(agent.run(task["question"])).strip()
    number = answer.replace(",", "").removesuffix(".0")
    return {"correct": float(number in task["answers"]), "format": 0.1 * float(number.lstrip("-").isdigit())}


def demonstration(task: dict) -> list[str]:
    """The reference solver's replies in this program's format: the calculator call,
    then the final_answer call."""
    from examples.agents.mathtools import demonstration as calculator_turns

    first = calculator_turns(task)[0]
    final = {"name": "final_answer", "arguments": {"answer": task["answers"][0]}}
    return [first, f"<tool_call>\n{json.dumps(final)}\n</tool_call>"]
