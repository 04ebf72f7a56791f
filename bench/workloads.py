"""The two benchmark workloads, defined once for both systems.

single: "What is 47 + 38?" answered in one turn; reward 1 when the last number in
    the answer is right.
tool:   "What is 417 * 238 + 56?" with a `calculator` tool in the Hermes/Qwen2.5
    ChatML format (<tool_call>{json}</tool_call>, results in <tool_response> inside a
    user turn); reward 1 when the final answer's last number is right.

SmolLM2's own chat template has no tool support, so the tool workload gives both
systems chatml_tools.jinja (Qwen2.5's template, byte-identical to TRL's
`qwen2_5_chat_template`, which TRL knows how to parse responses for). ponder's
rollout engine renders prompts without a `tools=` argument, so the tool block is
put into the system message here; `tool_system_prompt` checks that the rendered
prompt is exactly the one `apply_chat_template(..., tools=[calculator])` gives.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from pathlib import Path
from typing import Any

from ponder.tools import ToolRegistry, run_tool_step
from ponder.tools.parsers import HermesParser
from ponder.types import Task, ToolResult, Turn

TOOL_TEMPLATE = (Path(__file__).parent / "chatml_tools.jinja").read_text()
SINGLE_SYSTEM = "Answer the arithmetic question. Reply with the number only."
TOOL_SYSTEM = "Use the calculator tool for arithmetic, then reply with the final number only."

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, with numbers, + - * / and parentheses, e.g. "12 * (3 + 4)".
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from err
    value = _evaluate(tree.body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        if abs(left) > 1e12 or abs(right) > 1e12:
            raise ValueError("numbers too large")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"unsupported element {type(node).__name__} in the expression")


def number_reward(text: str, answer: str) -> float:
    """1.0 when the last number in `text` equals `answer` numerically, else 0.0."""
    numbers = _NUMBER.findall(text or "")
    if not numbers:
        return 0.0
    return 1.0 if abs(float(numbers[-1]) - float(answer)) < 1e-9 else 0.0


def arithmetic_tasks(workload: str, n: int, seed: int) -> list[Task]:
    """n seeded tasks; tool tasks carry the oracle actions used for the SFT warm-up."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        if workload == "single":
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            tasks.append(
                Task(id=f"add-{i}", question=f"What is {a} + {b}?", answers=[str(a + b)], kind="single")
            )
            continue
        a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(10, 99)
        expression, answer = f"{a} * {b} + {c}", str(a * b + c)
        arguments = json.dumps({"expression": expression})
        call = f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
        tasks.append(
            Task(
                id=f"calc-{i}",
                question=f"What is {expression}?",
                answers=[answer],
                kind="tool",
                oracle_actions=[call, answer],
            )
        )
    return tasks


def task_messages(task: Task, system: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": task.question}]


def tool_system_prompt(tokenizer: Any, system: str = TOOL_SYSTEM) -> str:
    """The system message that, rendered without `tools=`, gives exactly the prompt
    `apply_chat_template(messages, tools=[calculator])` gives (what TRL renders)."""
    probe = [{"role": "system", "content": system}, {"role": "user", "content": "probe"}]
    with_tools = tokenizer.apply_chat_template(
        probe, tools=[calculator], tokenize=False, add_generation_prompt=True
    )
    head = "<|im_start|>system\n"
    if not with_tools.startswith(head):
        raise ValueError("the tool workload needs a ChatML template that opens with the system turn")
    content = with_tools[len(head) : with_tools.index("<|im_end|>")]
    probe[0]["content"] = content
    plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if plain != with_tools:
        raise ValueError("cannot reproduce the tools prompt through the system message with this template")
    return content


def tool_suffix(tokenizer: Any, results: list[ToolResult]) -> str:
    """The text after an assistant turn's end-of-turn token that shows `results` and
    opens the next assistant turn, cut from the chat template the way TRL's
    `_get_tool_suffix_ids` cuts it (so both systems append the same tokens)."""
    calls = [{"type": "function", "function": {"name": results[0].name, "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=False)
    eos = tokenizer.eos_token
    prefix = prefix[: prefix.rindex(eos) + len(eos)]
    messages = [{"role": "tool", "name": r.name, "content": _tool_content(r)} for r in results]
    full = tokenizer.apply_chat_template(dummy + messages, tokenize=False, add_generation_prompt=True)
    if not full.startswith(prefix):
        raise ValueError("the chat template does not preserve the prefix before tool messages")
    return full[len(prefix) :]


def _tool_content(result: ToolResult) -> str:
    # TRL shows str(return value), and str({"error": message}) when the tool raised.
    return str({"error": result.content}) if result.is_error else result.content


class SingleTurnEnv:
    """One answer per episode; the reward reads it."""

    stop_strings: list[str] = []

    def __init__(self, system: str = SINGLE_SYSTEM) -> None:
        self.system = system

    def reset(self, task: Task) -> list[dict[str, str]]:
        return task_messages(task, self.system)

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        return None, True, {"turn": Turn(index=0, action=action, answer=action), "stop_reason": "answer"}


class ToolUseEnv:
    """Hermes tool calls through ponder's shared tool step; an action without a call
    ends the episode (as TRL's tool loop does), as does the max_turns-th action."""

    stop_strings: list[str] = []

    def __init__(self, tokenizer: Any, system: str, max_turns: int) -> None:
        self.tokenizer, self.system, self.max_turns = tokenizer, system, max_turns
        self.parser = HermesParser()
        self.registry = ToolRegistry([calculator])
        self.turn_index = 0

    def reset(self, task: Task) -> list[dict[str, str]]:
        self.turn_index = 0
        return task_messages(task, self.system)

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        outcome = run_tool_step(action, self.parser, self.registry)
        parse = outcome.parse
        turn = outcome.turn(self.turn_index, action)
        self.turn_index += 1
        if not parse.calls:
            return (
                None,
                True,
                {"turn": turn, "stop_reason": "answer" if parse.answer is not None else "invalid"},
            )
        if self.turn_index >= self.max_turns:
            return None, True, {"turn": turn, "stop_reason": "max_turns"}
        turn.observation = tool_suffix(self.tokenizer, outcome.results)
        return turn.observation, False, {"turn": turn}


class EnvFactory:
    """A fresh environment per episode for `workload`."""

    def __init__(self, workload: str, tokenizer: Any, max_turns: int) -> None:
        self.workload, self.tokenizer, self.max_turns = workload, tokenizer, max_turns
        self.system = tool_system_prompt(tokenizer) if workload == "tool" else SINGLE_SYSTEM

    def __call__(self) -> SingleTurnEnv | ToolUseEnv:
        if self.workload == "single":
            return SingleTurnEnv(self.system)
        return ToolUseEnv(self.tokenizer, self.system, self.max_turns)


def episode_reward(trajectory: Any, task: Task) -> tuple[float, dict[str, float]]:
    """ponder's reward callable: number_reward on the last action's text."""
    text = trajectory.turns[-1].action if trajectory.turns else ""
    score = number_reward(text, task.answers[0])
    return score, {"correct": score}
