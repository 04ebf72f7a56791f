"""A LangChain tool-calling agent for math word problems, trained unchanged through
ponder's gateway: `ChatOpenAI(...).bind_tools([calculator])` and LangChain's own
messages, nothing of ponder.

    ponder train --recipe recipes/gateway_math.yaml --out runs/gateway-langchain \
        env.options.agent=examples.agents.langchain_agent:run
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from examples.agents.mathtools import calculate, score

SYSTEM = ("Solve the math problem. Use the calculator tool for arithmetic. "
          "End with the final answer as: Answer: NUMBER")  # fmt: skip
MAX_TURNS = 3


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as (12 + 7) * 3."""
    return calculate(expression)


async def run(task: dict, base_url: str, api_key: str, tool_choice: str | None = None) -> dict[str, float]:
    model = ChatOpenAI(model="policy", base_url=base_url, api_key=api_key, max_retries=0)
    agent = model.bind_tools([calculator], tool_choice=tool_choice)  # e.g. "calculator": every turn a call
    messages = [SystemMessage(SYSTEM), HumanMessage(task["question"])]
    reply = None
    for _ in range(MAX_TURNS):
        reply = await agent.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(calculator.invoke(call["args"])), tool_call_id=call["id"]))
    return score(str(reply.content) if reply is not None else "", task["answers"])
