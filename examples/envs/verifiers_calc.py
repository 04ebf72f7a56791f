"""A multi-turn verifiers environment, written with verifiers' own SDK: arithmetic with a
calculator tool.

`load_environment` returns a `vf.ToolEnv` whose `calculate` tool the model calls
(`<tool_call>{"name": "calculate", "arguments": {"expression": "17*6"}}</tool_call>`);
verifiers' own `env_response` runs each call and answers with its result, and the
episode ends when the model answers without a call (or after `max_turns`). The rubric
pays the right number in the final answer and, as a weight-0 metric, counts the calls.
`env.options.env_id: examples.envs.verifiers_calc`, from the repository root.
"""

from __future__ import annotations

import ast
import operator

import verifiers as vf
from datasets import Dataset

from examples.envs.verifiers_arith import problems

SYSTEM = "Solve the problem. Use the calculator if you like, then give only the number in <answer></answer>."
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression of whole numbers with +, - and *.

    Args:
        expression: The expression, e.g. "17*6-3".
    """

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            return BINARY[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only whole numbers with +, - and *")

    return str(value(ast.parse(expression, mode="eval").body))


def load_environment(n_train: int = 32, n_eval: int = 8, seed: int = 1, max_turns: int = 3) -> vf.ToolEnv:
    rows = problems(seed, n_train + n_eval)
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer], parser=parser)
    return vf.ToolEnv(tools=[calculate], max_turns=max_turns, dataset=Dataset.from_list(rows[:n_train]),
                      eval_dataset=Dataset.from_list(rows[n_train:]), system_prompt=SYSTEM, parser=parser,
                      rubric=rubric)  # fmt: skip
