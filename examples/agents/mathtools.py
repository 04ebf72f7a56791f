"""The math example programs' own tools: a calculator and the answer's score (plain
Python, nothing of ponder)."""

from __future__ import annotations

import ast
import json
import operator
import re

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg}  # fmt: skip


def calculate(expression: str) -> str:
    """+ - * / and parentheses over numbers; anything else is an error message."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    try:
        result = value(ast.parse(expression[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as err:
        return f"error: {err}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def score(text: str, answers: list[str]) -> dict[str, float]:
    """correct: the answer line is right (1 / 0); format: there is one number in it (0.1)."""
    found = re.findall(r"Answer:\s*(-?\d+(?:\.\d+)?)", text or "")
    return {"correct": float(bool(found) and found[-1] in answers), "format": 0.1 * float(len(found) == 1)}


def demonstration(task: dict) -> list[str]:
    """The reference solver's replies for a math task, in the example programs' format:
    a calculator call with the solution's last expression (from the task's worked
    solution), then the answer line."""
    expressions = re.findall(r"<calculator>(.*?)</calculator>", " ".join(task.get("oracle_actions") or []))
    call = {"name": "calculator", "arguments": {"expression": expressions[-1] if expressions else task["answers"][0]}}
    return [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", f"Answer: {task['answers'][0]}"]  # the prompt's format
