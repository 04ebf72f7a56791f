"""The pure pieces of the per-user simulation (simulate.py): unit word problems, and three
simulated users, each a checker (does a reply satisfy me?) and a rewriter (the reply I
would have wanted). No model, no torch: tests/personal/test_simulate.py loads this file
by path.

The users' preferences conflict: each rewriter's reply satisfies its own user's checker
and fails the other two (a test checks it on every generated task).

- `one_line`: one line, at most 120 characters, stating a quantity (a digit).
  Rewrite: "120 km."
- `unit_words`: the task's unit written out ("kilometres" or "kilometers") and no unit
  abbreviation anywhere (ABBREVIATIONS, as a whole word). Rewrite: the working, then the
  answer with the unit in words, on two lines.
- `json`: the whole reply parses as a JSON object whose "answer" is a number (or a
  string with a digit). Rewrite: indented JSON with the unit's short code.

Preferences are about form, not arithmetic: a checker does not ask for the right number
(a 135M model's arithmetic is poor); a rewriter writes the task's known answer.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

# Each unit's abbreviation (as the questions write it) and its written-out forms; the
# rewrite uses the second (plural, British spelling), the checker accepts any.
UNIT_WORDS: dict[str, tuple[str, ...]] = {
    "km": ("kilometre", "kilometres", "kilometer", "kilometers"),
    "kg": ("kilogram", "kilograms", "kilogramme", "kilogrammes"),
    "L": ("litre", "litres", "liter", "liters"),
    "m": ("metre", "metres", "meter", "meters"),
    "min": ("minute", "minutes"),
    "g": ("gram", "grams", "gramme", "grammes"),
    "cm": ("centimetre", "centimetres", "centimeter", "centimeters"),
    "ml": ("millilitre", "millilitres", "milliliter", "milliliters"),
}
ABBREVIATIONS = ("km", "kg", "l", "m", "min", "mins", "g", "cm", "mm", "ml", "h", "hr", "hrs", "s", "sec",
                 "secs", "kph", "mph", "lb", "lbs", "oz", "ft", "mi")  # fmt: skip
# A whole word: not inside another word, not after an apostrophe ("it's") or a full stop ("e.g.").
_ABBREVIATION = re.compile(rf"(?<![A-Za-z'’.])(?:{'|'.join(ABBREVIATIONS)})(?![A-Za-z'’])", re.IGNORECASE)
MAX_ONE_LINE_CHARS = 120
OPERATORS: dict[str, Callable[[int, int], int]] = {"*": lambda a, b: a * b, "+": lambda a, b: a + b,
                                                   "-": lambda a, b: a - b}  # fmt: skip

# (question, operator, unit, range of a, range of b): the answer is `a op b` in `unit`.
TEMPLATES: tuple[tuple[str, str, str, tuple[int, int], tuple[int, int]], ...] = (
    ("A car travels {a} hours at {b} km per hour. How far does it go?", "*", "km", (2, 9), (20, 90)),
    ("A train covers {a} km in the morning and {b} km in the afternoon. How far does it travel in total?",
     "+", "km", (20, 200), (20, 200)),
    ("A bag of rice weighs {a} kg. How much do {b} bags weigh?", "*", "kg", (2, 25), (2, 9)),
    ("A parcel weighs {a} kg and its box weighs {b} kg. How much do they weigh together?", "+", "kg", (2, 40),
     (1, 9)),
    ("A tap fills {a} L of water per minute. How much water does it fill in {b} minutes?", "*", "L", (2, 15),
     (2, 12)),
    ("A bucket holds {a} L of water and {b} L spills out. How much water is left?", "-", "L", (10, 40),
     (1, 9)),
    ("A rope is {a} m long and {b} m is cut off. How long is the rope now?", "-", "m", (20, 90), (2, 19)),
    ("A runner runs {a} laps of {b} m each. How far does she run?", "*", "m", (2, 9), (100, 400)),
    ("One film lasts {a} min and a second film lasts {b} min. How long do both films last together?", "+",
     "min", (60, 140), (60, 140)),
    ("A letter weighs {a} g. How much do {b} letters weigh?", "*", "g", (5, 60), (2, 9)),
    ("A plant is {a} cm tall and grows {b} cm more. How tall is it now?", "+", "cm", (5, 80), (2, 30)),
    ("A cup holds {a} ml of tea. How much tea do {b} cups hold?", "*", "ml", (100, 350), (2, 6)),
)  # fmt: skip


@dataclass(frozen=True)
class UnitTask:
    """A question whose answer is a quantity: `answer` in `unit` (the abbreviation the
    question uses); `working` is the arithmetic ("3 * 40 = 120")."""

    id: str
    question: str
    answer: int
    unit: str
    working: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.question}]


def make_tasks(count: int, seed: int = 0) -> list[UnitTask]:
    """`count` distinct questions, the templates in turn, then shuffled (seeded)."""
    rng = random.Random(seed)
    tasks: list[UnitTask] = []
    seen: set[str] = set()
    draws = 0
    while len(tasks) < count:
        draws += 1
        if draws > 100 * count + 100:
            raise ValueError(f"cannot draw {count} distinct questions from the templates")
        question, op, unit, a_range, b_range = TEMPLATES[len(tasks) % len(TEMPLATES)]
        a, b = rng.randint(*a_range), rng.randint(*b_range)
        text = question.format(a=a, b=b)
        if text in seen:
            continue
        seen.add(text)
        answer = OPERATORS[op](a, b)
        tasks.append(UnitTask(f"task-{len(tasks)}", text, answer, unit, f"{a} {op} {b} = {answer}"))
    rng.shuffle(tasks)
    return tasks


def split_tasks(n_train: int, n_heldout: int, seed: int = 0) -> tuple[list[UnitTask], list[UnitTask]]:
    """Training prompts (the users' feedback) and held-out prompts (the measurement), disjoint."""
    tasks = make_tasks(n_train + n_heldout, seed)
    return tasks[:n_train], tasks[n_train:]


# --- the three users ------------------------------------------------------------------


def _has_quantity(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, str) and any(ch.isdigit() for ch in value)


def likes_one_line(reply: str, task: UnitTask) -> bool:
    text = reply.strip()
    return len(text.splitlines()) == 1 and len(text) <= MAX_ONE_LINE_CHARS and _has_quantity(text)


def has_abbreviation(reply: str) -> bool:
    return _ABBREVIATION.search(reply) is not None


def likes_unit_words(reply: str, task: UnitTask) -> bool:
    words = "|".join(UNIT_WORDS[task.unit])
    return re.search(rf"\b(?:{words})\b", reply, re.IGNORECASE) is not None and not has_abbreviation(reply)


def likes_json(reply: str, task: UnitTask) -> bool:
    try:
        value = json.loads(reply.strip())
    except ValueError:
        return False
    return isinstance(value, dict) and "answer" in value and _has_quantity(value["answer"])


def rewrite_one_line(task: UnitTask) -> str:
    return f"{task.answer} {task.unit}."


def rewrite_unit_words(task: UnitTask) -> str:
    return f"{task.working}.\nThe answer is {task.answer} {UNIT_WORDS[task.unit][1]}."


def rewrite_json(task: UnitTask) -> str:
    return json.dumps({"answer": task.answer, "unit": task.unit}, indent=2)


@dataclass(frozen=True)
class SimUser:
    """A simulated user: `likes(reply, task)` says whether a reply satisfies them,
    `rewrite(task)` is the reply they would have wanted."""

    name: str
    wants: str
    likes: Callable[[str, UnitTask], bool]
    rewrite: Callable[[UnitTask], str]


USERS: dict[str, SimUser] = {
    "one_line": SimUser("one_line", "the answer in one line (at most 120 characters)", likes_one_line,
                        rewrite_one_line),
    "unit_words": SimUser("unit_words", "the unit written out, no abbreviations", likes_unit_words,
                          rewrite_unit_words),
    "json": SimUser("json", 'a JSON object with an "answer" key', likes_json, rewrite_json),
}  # fmt: skip


def rate(flags: list[bool]) -> dict[str, float]:
    """The share of True in `flags` and its standard error sqrt(p(1-p)/n)."""
    n = len(flags)
    if n == 0:
        raise ValueError("a rate needs at least one reply")
    p = sum(flags) / n
    return {"rate": p, "se": math.sqrt(p * (1 - p) / n), "n": n}
