"""Seeded arithmetic and algebra word problems with exact answers, graded by difficulty,
and the reference solver that writes each one's worked solution.

Levels (the task's `kind` is `level{n}`, so evaluations break results down by it):
  1. one operation on small numbers ("Mia has 7 pens and buys 5 more …");
  2. two steps ("… buys 4 packs of 6 and already had 3 …");
  3. three steps over several quantities (change from a purchase, animals on a farm …);
  4. a linear equation a*x + b = c with an integer solution, bare or as a word puzzle.

Every problem carries its solution as steps `(label, expression, value)`: the
expressions are plain arithmetic the calculator evaluates, so a test can recompute
every step, and the reference solver turns them into the `oracle_actions`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ponder.types import Task

LEVELS = (1, 2, 3, 4)
NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi", "Ines", "Kofi", "Yuki", "Sam", "Nora",
         "Tariq")  # fmt: skip
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells", "coins", "stamps")
PRICED = (("pens", "notebooks"), ("apples", "melons"), ("cups", "plates"), ("stamps", "envelopes"),
          ("socks", "hats"))  # fmt: skip
ANIMALS = (("sheep", "goats"), ("hens", "ducks"), ("cows", "pigs"), ("rabbits", "geese"))
# Tasks drawn per unique question before the generator gives up (a tiny option space).
MAX_DRAWS_PER_TASK = 50


@dataclass
class Problem:
    """A question, its integer answer and the worked steps that reach it."""

    question: str
    answer: int
    steps: list[tuple[str, str, int]]  # (label, arithmetic expression, its value)
    template: str
    values: dict[str, int] = field(default_factory=dict)
    joiner: str = ": "  # between a step's label and its expression: "Pens: 4 * 3", "7x = 47 - 12"
    level: int = 0  # set by generate_problems


def _level1(rng: random.Random) -> Problem:
    name, items = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 12)
    form = rng.choice(("add", "sub", "mul", "div", "bare"))
    if form == "add":
        question = f"{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?"
        return Problem(question, a + b, [("Total", f"{a} + {b}", a + b)], form, {"a": a, "b": b})
    if form == "sub":
        a += b
        question = f"{name} has {a} {items} and gives {b} of them away. How many {items} are left?"
        return Problem(question, a - b, [("Left", f"{a} - {b}", a - b)], form, {"a": a, "b": b})
    if form == "mul":
        a = rng.randint(2, 9)
        question = f"There are {a} boxes with {b} {items} in each box. How many {items} are there in total?"
        return Problem(question, a * b, [("Total", f"{a} * {b}", a * b)], form, {"a": a, "b": b})
    if form == "div":
        share = rng.randint(2, 9)
        total = share * b
        question = f"{name} shares {total} {items} equally among {b} friends. How many {items} does each get?"
        return Problem(question, share, [("Each", f"{total} / {b}", share)], form, {"total": total, "b": b})
    op = rng.choice(("+", "-", "*"))
    a, b = (a + b, b) if op == "-" else (a, b)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    steps = [("", f"{a} {op} {b}", value)]
    return Problem(f"What is {a} {op} {b}?", value, steps, f"bare{op}", {"a": a, "b": b})


def _level2(rng: random.Random) -> Problem:
    name, items = rng.choice(NAMES), rng.choice(ITEMS)
    form = rng.choice(("buy_give", "packs", "wage", "bare"))
    if form == "buy_give":
        a, b = rng.randint(5, 30), rng.randint(2, 20)
        c = rng.randint(1, a + b - 1)
        question = f"{name} has {a} {items}, buys {b} more and then gives {c} away. How many are left?"
        steps = [("After buying", f"{a} + {b}", a + b), ("Left", f"{a + b} - {c}", a + b - c)]
        return Problem(question, a + b - c, steps, form, {"a": a, "b": b, "c": c})
    if form == "packs":
        a, b, c = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 20)
        question = (f"{name} buys {a} packs of {items} with {b} in each pack and already had {c}. "
                    f"How many {items} does {name} have now?")  # fmt: skip
        steps = [("Bought", f"{a} * {b}", a * b), ("Total", f"{a * b} + {c}", a * b + c)]
        return Problem(question, a * b + c, steps, form, {"a": a, "b": b, "c": c})
    if form == "wage":
        a, b = rng.randint(5, 15), rng.randint(2, 8)
        c = rng.randint(1, a * b - 1)
        question = f"{name} earns ${a} an hour, works {b} hours, then spends ${c}. How many dollars remain?"
        steps = [("Earned", f"{a} * {b}", a * b), ("Left", f"{a * b} - {c}", a * b - c)]
        return Problem(question, a * b - c, steps, form, {"a": a, "b": b, "c": c})
    a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 30)
    steps = [("", f"{a} * {b}", a * b), ("", f"{a * b} + {c}", a * b + c)]
    return Problem(f"What is {a} * {b} + {c}?", a * b + c, steps, "bare", {"a": a, "b": b, "c": c})


def _level3(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    form = rng.choice(("change", "farm", "reading"))
    if form == "change":
        (first, second), a, b = rng.choice(PRICED), rng.randint(2, 9), rng.randint(2, 9)
        p1, p2 = rng.randint(2, 12), rng.randint(2, 12)
        cost = a * p1 + b * p2
        paid = (cost // 10 + 1 + rng.randint(0, 5)) * 10
        question = (f"{name} buys {a} {first} at ${p1} each and {b} {second} at ${p2} each, and pays with "
                    f"${paid}. How many dollars of change does {name} get?")  # fmt: skip
        steps = [(first.capitalize(), f"{a} * {p1}", a * p1), (second.capitalize(), f"{b} * {p2}", b * p2),
                 ("Change", f"{paid} - {a * p1} - {b * p2}", paid - cost)]  # fmt: skip
        return Problem(question, paid - cost, steps, form, {"a": a, "p1": p1, "b": b, "p2": p2, "paid": paid})
    if form == "farm":
        (first, second), a, b = rng.choice(ANIMALS), rng.randint(2, 9), rng.randint(3, 15)
        c, d = rng.randint(2, 9), rng.randint(3, 15)
        sold = rng.randint(1, a * b + c * d - 1)
        question = (f"A farm has {a} pens with {b} {first} each and {c} pens with {d} {second} each. "
                    f"{sold} animals are sold. How many animals are left?")  # fmt: skip
        steps = [(first.capitalize(), f"{a} * {b}", a * b), (second.capitalize(), f"{c} * {d}", c * d),
                 ("Left", f"{a * b} + {c * d} - {sold}", a * b + c * d - sold)]  # fmt: skip
        values = {"a": a, "b": b, "c": c, "d": d, "sold": sold}
        return Problem(question, a * b + c * d - sold, steps, form, values)
    a, b, c, d = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
    pages = a * b + c * d + rng.randint(10, 200)
    question = (f"A book has {pages} pages. {name} reads {a} pages a day for {b} days, then {c} pages a day "
                f"for {d} days. How many pages are left to read?")  # fmt: skip
    steps = [("First", f"{a} * {b}", a * b), ("Then", f"{c} * {d}", c * d),
             ("Left", f"{pages} - {a * b} - {c * d}", pages - a * b - c * d)]  # fmt: skip
    values = {"a": a, "b": b, "c": c, "d": d, "pages": pages}
    return Problem(question, pages - a * b - c * d, steps, form, values)


def _level4(rng: random.Random) -> Problem:
    a, x = rng.randint(2, 12), rng.choice([v for v in range(-9, 21) if v != 0])
    b = rng.choice([v for v in range(-30, 31) if v != 0])
    c = a * x + b
    form = rng.choice(("equation", "puzzle")) if b > 0 and c > 0 else "equation"
    if form == "puzzle":
        question = (f"I think of a number, multiply it by {a} and add {b}. The result is {c}. "
                    "What is my number?")  # fmt: skip
    else:
        sign = "+" if b > 0 else "-"
        question = f"Solve for x: {a}x {sign} {abs(b)} = {c}."
    moved = f"{c} - {b}" if b > 0 else f"{c} + {-b}"
    steps = [(f"{a}x", moved, c - b), ("x", f"{c - b} / {a}", x)]
    return Problem(question, x, steps, form, {"a": a, "b": b, "c": c}, joiner=" = ")


GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: _level1, 2: _level2, 3: _level3, 4: _level4}
# The reference solver calls the calculator from this level up (when it is offered):
# three-term sums and the division that ends the algebra are where a small model slips.
CALCULATOR_FROM_LEVEL = 3


def worked_solution(problem: Problem, calculator: bool, calculator_from: int = CALCULATOR_FROM_LEVEL) -> list[str]:
    """The reference solver's assistant turns: the steps in <think>, then <answer>.

    With the calculator, levels from `calculator_from` hand the last step's
    expression to a <calculator> call and answer in a second turn, after the result;
    lower levels are short enough to do in the head, in one turn."""
    shown = [_step_text(problem.joiner, *step) for step in problem.steps]
    if not calculator or problem.level < calculator_from:
        return [f"<think>{' '.join(shown)}</think>\n<answer>{problem.answer}</answer>"]
    label, expression, _ = problem.steps[-1]
    think = " ".join(shown[:-1] + [f"{label}{problem.joiner}{expression}." if label else f"{expression}."])
    call = f"<think>{think}</think>\n<calculator>{expression}</calculator>"
    return [call, f"<answer>{problem.answer}</answer>"]


def _step_text(joiner: str, label: str, expression: str, value: int) -> str:
    return f"{label}{joiner}{expression} = {value}." if label else f"{expression} = {value}."


def gsm8k_row(problem: Problem) -> dict[str, str]:
    """The problem as a GSM8K-style row: `question`, and `answer` holding the worked
    steps, one per line, then `#### <answer>` (for verified_qa and data examples)."""
    steps = "\n".join(_step_text(problem.joiner, *step) for step in problem.steps)
    return {"question": problem.question, "answer": f"{steps}\n#### {problem.answer}"}


def generate_problems(seed: int, count: int, levels: Sequence[int], weights: Sequence[float] | None,
                      exclude: set[str] | None = None) -> list[Problem]:  # fmt: skip
    """`count` problems with distinct question texts (none in `exclude`), each level
    drawn with `weights`; deterministic in `seed`. Raises when the levels cannot give
    that many distinct questions."""
    unknown = [level for level in levels if level not in GENERATORS]
    if not levels or unknown:
        raise ValueError(f"math difficulties {list(levels)}: each must be one of {list(LEVELS)}")
    rng = random.Random(seed)
    seen = set(exclude or ())
    problems: list[Problem] = []
    for _ in range(count * MAX_DRAWS_PER_TASK):
        if len(problems) == count:
            return problems
        level = rng.choices(list(levels), weights=weights)[0]
        problem = GENERATORS[level](rng)
        problem.level = level
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    if len(problems) == count:
        return problems
    raise ValueError(f"math difficulties {list(levels)}: {len(problems)} distinct questions, not {count}")


def to_task(task_id: str, problem: Problem, calculator: bool, calculator_from: int = CALCULATOR_FROM_LEVEL) -> Task:
    """A Task with the problem's answer as its gold and its worked solution as the oracle."""
    level = problem.level
    metadata = {"level": level, "template": problem.template, "values": dict(problem.values),
                "steps": [list(step) for step in problem.steps], "needs_search": False}  # fmt: skip
    return Task(task_id, problem.question, [str(problem.answer)], kind=f"level{level}",
                oracle_actions=worked_solution(problem, calculator, calculator_from), metadata=metadata)  # fmt: skip


def split_problems(seed: int, n_train: int, n_eval: int, levels: Sequence[int],
                   weights: Sequence[float] | None) -> tuple[list[Problem], list[Problem]]:  # fmt: skip
    """(training, held-out) problems of math_splits, before they become tasks."""
    held_out = generate_problems(seed, n_eval, levels, weights)
    seen = {problem.question for problem in held_out}
    return generate_problems(seed + 1_000_003, n_train, levels, weights, exclude=seen), held_out


def math_splits(seed: int, n_train: int, n_eval: int, levels: Sequence[int], weights: Sequence[float] | None,
                calculator: bool, calculator_from: int = CALCULATOR_FROM_LEVEL) -> tuple[list[Task], list[Task]]:  # fmt: skip
    """(train, eval) tasks with no question text in both. Evaluation tasks are drawn
    first, so they stay the same when only n_train changes."""
    training, held_out = split_problems(seed, n_train, n_eval, levels, weights)
    evaluation = [to_task(f"math-eval-{i:04d}", p, calculator, calculator_from) for i, p in enumerate(held_out)]
    train = [to_task(f"math-train-{i:04d}", p, calculator, calculator_from) for i, p in enumerate(training)]
    return train, evaluation
