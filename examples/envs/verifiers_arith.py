"""A verifiers environment, written with verifiers' own SDK: one-turn arithmetic.

`load_environment` returns a `vf.SingleTurnEnv` over a small dataset built in code
(`question`, `answer`, `info` columns; train and eval questions never overlap), with a
rubric of an async correctness check and the XML parser's format reward. Nothing here
knows ponder: `env.kind: verifiers` with `env.options.env_id: examples.envs.verifiers_arith`
loads it as verifiers would (`vf.load_environment`), from the repository root.
recipes/verifiers_arith.yaml trains on it.
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

SYSTEM = "Compute the result. Write only the number inside <answer></answer>, e.g. <answer>42</answer>."
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def problems(seed: int, count: int) -> list[dict[str, str]]:
    """`count` distinct problems `a op b` with their answers, drawn with `seed`."""
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        a, b, op = rng.randint(2, 19), rng.randint(2, 9), rng.choice(sorted(OPERATIONS))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(OPERATIONS[op](a, b)),
                     "info": {"operation": op}})  # fmt: skip
    return rows


def load_environment(n_train: int = 64, n_eval: int = 16, seed: int = 0) -> vf.SingleTurnEnv:
    rows = problems(seed, n_train + n_eval)
    parser = vf.XMLParser(["answer"], answer_field="answer")

    async def correct_answer(completion, answer, parser) -> float:  # verifiers awaits async reward functions
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.1], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows[:n_train]), eval_dataset=Dataset.from_list(rows[n_train:]),
                            system_prompt=SYSTEM, parser=parser, rubric=rubric)  # fmt: skip
