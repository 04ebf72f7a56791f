"""Built-in tools: calculator, echo, Python execution, file reading, corpus search.

Every tool here bounds its own work (expression size, process limits, bytes read) and
reports bad input as an exception with a one-line message, which the registry turns
into an error observation. Tools that need settings are built by `make_*` factories.
Because they bound themselves, they run in the caller's process (isolation "thread")
even in a registry that forks a process per call for other tools.
"""

from __future__ import annotations

import ast
import math
import operator
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ponder.tools.base import Tool, tool
from ponder.tools.retrieval.corpus import Retriever, format_hits
from ponder.tools.sandbox import run_python
from ponder.types import ToolSpec

_MAX_EXPRESSION_CHARS = 500
_MAX_POWER_EXPONENT = 1000
_MAX_INT_BITS = 4096  # keeps big-integer arithmetic (and its printing) instant
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "round": round, "min": min, "max": max,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log10": math.log10, "log2": math.log2,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "floor": math.floor, "ceil": math.ceil, "factorial": math.factorial,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalculatorError(ValueError):
    """An expression the calculator will not evaluate; one line."""


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression, from its syntax tree (never `eval`).

    Allowed: numbers, + - * / // % **, parentheses, the functions in `_FUNCTIONS` and
    the constants pi, e, tau. Anything else (names, attributes, calls of other
    functions, comprehensions, strings) is refused. Exponents above 1000 and integers
    above 4096 bits are refused too, so `9**9**9` cannot hang the tool.
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression ({exc.msg})") from exc
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {_MAX_POWER_EXPONENT}")
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and left.bit_length() * abs(right) > _MAX_INT_BITS:
            raise CalculatorError("result too large")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        except OverflowError as exc:
            raise CalculatorError("result too large") from exc
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes positional arguments only")
        arguments = [_evaluate(argument) for argument in node.args]
        if node.func.id == "factorial" and arguments and arguments[0] > 500:
            raise CalculatorError("factorial argument larger than 500")
        try:
            return _checked(_FUNCTIONS[node.func.id](*arguments))
        except (ValueError, TypeError, OverflowError) as exc:
            raise CalculatorError(f"{node.func.id}: {exc}") from exc
    raise CalculatorError(f"'{ast.unparse(node)}' is not allowed (numbers, + - * / // % **, math functions only)")


def _checked(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise CalculatorError("result too large")
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    return value


@tool(isolation="thread")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "2 * (3 + 4) ** 2" or "sqrt(2) * pi".

    Args:
        expression: Numbers, + - * / // % **, parentheses, and sqrt, exp, log, sin, cos, tan, floor, ceil, abs, round, min, max, factorial, pi, e.
    """
    value = evaluate_expression(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


@tool(isolation="thread")
def echo(text: str) -> str:
    """Return the text unchanged (useful to check that tool calling works).

    Args:
        text: The text to send back.
    """
    return text


def make_python_tool(timeout_s: float = 5.0, memory_mb: int = 256, max_output_chars: int = 4000) -> Tool:
    """A `python` tool: run code in a separate, limited process (see ponder.tools.sandbox)."""

    def python(code: str) -> str:
        """Run Python code in a fresh sandboxed process and return its exit code, stdout and stderr. Print what you want to see.

        Args:
            code: A complete Python program.
        """
        return run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars).render()

    # The sandbox enforces the limit itself; the registry's limit is only a backstop.
    return tool(python, timeout_s=timeout_s + 5.0, isolation="thread")


def make_read_file_tool(root: str | os.PathLike[str], max_bytes: int = 100_000) -> Tool:
    """A `read_file` tool that reads UTF-8 text under `root` only (symlinks resolved first)."""
    allowed = Path(root).resolve()
    if not allowed.is_dir():
        raise ValueError(f"{root}: the allowed folder does not exist")

    def read_file(path: str) -> str:
        """Read a text file from the allowed folder.

        Args:
            path: The file's path, relative to the allowed folder.
        """
        target = (allowed / path).resolve()
        if target != allowed and allowed not in target.parents:
            raise PermissionError(f"{path} is outside the allowed folder")
        if not target.is_file():
            raise FileNotFoundError(f"{path} is not a file in the allowed folder")
        with open(target, "rb") as handle:
            data = handle.read(max_bytes + 1)
        text = data[:max_bytes].decode("utf-8", errors="replace")
        return text + (f"\n…[cut at {max_bytes} bytes]" if len(data) > max_bytes else "")

    return tool(read_file, isolation="thread")


# The arguments of every search tool: one free-text query.
QUERY_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "what to look for"}},
    "required": ["query"],
    "additionalProperties": False,
}


def make_corpus_search_tool(retriever: Retriever, topk: int = 3, name: str = "search") -> Tool:
    """A search tool over a local corpus (any Retriever: BM25, dense, hybrid, HTTP);
    retrieval failures raise, and the registry turns them into an error observation."""

    def run(query: str) -> str:
        hits = retriever.search([query], topk)[0]
        return format_hits(hits) if hits else "no results"

    description = "Search the local document collection and return the best-matching passages."
    spec = ToolSpec(name=name, description=description, parameters=dict(QUERY_PARAMETERS))
    return Tool(spec, run, isolation="thread")
