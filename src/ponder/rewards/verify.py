"""Verifying a final answer: extract it from the response, compare it with the gold.

Both halves are pure functions registered by name (the one registry idiom), so a
recipe picks them (`env.options.extract`, `env.options.compare` of `verified_qa`) and
a user adds one by import path with the same signature:

    extractor(text, options) -> str | None     # the answer the text gives, None if none
    comparator(predicted, gold, options) -> bool

Extractors: `boxed` (the last `\\boxed{…}`, braces balanced), `gsm8k` (what follows
the last `####`: the number it starts with, else the rest of its line), `answer_is`
(the same after the last "the answer is", up to the end of its sentence),
`answer_tag` (the last `<answer>…</answer>`), `last_number` (the last number
written), `regex` (the last match of `options.pattern`: its group `answer`, else its
first group, else all of it), `json` (field `options.field`, `a.b` for a nested
one, of the last JSON object in the text that has it) and `whole` (the whole text,
stripped). A chain of them is tried in order; the first
answer found is the one.

Comparators: `exact` (equal after stripping), `numeric` (both numbers, as exact
rationals: "1,000", "$1000" and "1000.0" are one number, "3/4" and "0.75" too;
within `options.tolerance` of the gold, relative to max(1, |gold|)), `normalized`
(SQuAD's normalisation: case, punctuation, articles and spacing ignored) and `auto`
(numeric when both sides are numbers, else normalized).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ponder.plugins import import_object
from ponder.registry import Registry
from ponder.rewards.math import last_boxed, last_number, parse_number
from ponder.rewards.qa import normalize_answer
from ponder.types import Task, Trajectory


@dataclass(frozen=True)
class VerifyOptions:
    """How answers are verified (verified_qa's env.options of the same names).

    extract: extractor names or import paths, tried in order on the response.
    compare: a comparator name or import path.
    gold_extract: the extractor chain applied to each gold answer first (`whole`: the
        gold as written; `gsm8k` for a GSM8K-style solution ending `#### 42`).
    pattern: the `regex` extractor's pattern. field: the `json` extractor's field.
    tolerance: `numeric`'s tolerance, relative to max(1, |gold|) (0 = exactly equal).
    """

    extract: tuple[str, ...] = ("boxed", "gsm8k", "answer_is", "last_number")
    compare: str = "auto"
    gold_extract: tuple[str, ...] = ("whole",)
    pattern: str = ""
    field: str = "answer"
    tolerance: float = 1e-6


Extractor = Callable[[str, VerifyOptions], "str | None"]
Comparator = Callable[[str, str, VerifyOptions], bool]
EXTRACTORS: Registry[Extractor] = Registry("answer extractor")
COMPARATORS: Registry[Comparator] = Registry("answer comparator")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?[ \t]*([^\n]*)", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_LEADING_NUMBER = re.compile(r"\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?(?:\s?/\s?\d+)?)")
_WRAPPERS = "*$ \t`"


def _cleaned(answer: str | None) -> str | None:
    """An extracted answer without the trailing full stop and emphasis around it; None if empty."""
    if answer is None:
        return None
    stripped = answer.strip().strip(_WRAPPERS).rstrip(".").strip().strip(_WRAPPERS)
    return stripped or None


@EXTRACTORS.register("boxed")
def boxed(text: str, options: VerifyOptions) -> str | None:
    """The content of the last `\\boxed{…}` (None when there is none or it is unclosed)."""
    return _cleaned(last_boxed(text))


@EXTRACTORS.register("gsm8k")
def gsm8k(text: str, options: VerifyOptions) -> str | None:
    """What follows the last `####`: the number it starts with ("#### 18 dollars" → "18"),
    else the rest of its line."""
    found = _GSM8K.findall(text)
    return _leading_number(found[-1]) if found else None


@EXTRACTORS.register("answer_is")
def answer_is(text: str, options: VerifyOptions) -> str | None:
    """What follows the last "the answer is" (or "answer is:"): the number it starts
    with ("18 dollars." → "18"), else the rest of its sentence ("Paris.")."""
    found = _ANSWER_IS.findall(text)
    if not found:
        return None
    return _leading_number(_SENTENCE_END.split(found[-1], maxsplit=1)[0])


def _leading_number(text: str) -> str | None:
    """The number `text` starts with (after an optional "$"), else `text` cleaned."""
    number = _LEADING_NUMBER.match(text)
    return number.group(1) if number is not None else _cleaned(text)


@EXTRACTORS.register("answer_tag")
def answer_tag(text: str, options: VerifyOptions) -> str | None:
    """The content of the last `<answer>…</answer>`."""
    found = _ANSWER_TAG.findall(text)
    return _cleaned(found[-1]) if found else None


@EXTRACTORS.register("last_number")
def last_number_text(text: str, options: VerifyOptions) -> str | None:
    """The last number in the text, written plainly ("1,000.0" → "1000", "0.75" → "3/4"), None if none."""
    value = last_number(text)
    return None if value is None else _number_text(value)


@EXTRACTORS.register("regex")
def regex(text: str, options: VerifyOptions) -> str | None:
    """The last match of options.pattern: its group `answer`, else group 1, else the match."""
    matches = list(re.finditer(options.pattern, text))
    if not matches:
        return None
    last = matches[-1]
    if "answer" in last.re.groupindex:
        return _cleaned(last.group("answer"))
    return _cleaned(last.group(1) if last.re.groups else last.group(0))


@EXTRACTORS.register("json")
def json_field(text: str, options: VerifyOptions) -> str | None:
    """options.field (`a.b`: nested) of the last JSON object in the text that has it."""
    decoder = json.JSONDecoder()
    for start in reversed([index for index, char in enumerate(text) if char == "{"]):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        for part in options.field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str):
            return _cleaned(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(int(value)) if float(value).is_integer() else str(value)
    return None


@EXTRACTORS.register("whole")
def whole(text: str, options: VerifyOptions) -> str | None:
    """The whole text, stripped (None when empty)."""
    return text.strip() or None


def _number_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


@COMPARATORS.register("exact")
def exact(predicted: str, gold: str, options: VerifyOptions) -> bool:
    """Equal after stripping surrounding whitespace."""
    return predicted.strip() == gold.strip()


@COMPARATORS.register("numeric")
def numeric(predicted: str, gold: str, options: VerifyOptions) -> bool:
    """Both numbers, |predicted - gold| <= tolerance x max(1, |gold|)."""
    left, right = parse_number(predicted), parse_number(gold)
    if left is None or right is None:
        return False
    return abs(left - right) <= Fraction(options.tolerance) * max(1, abs(right))


@COMPARATORS.register("normalized")
def normalized(predicted: str, gold: str, options: VerifyOptions) -> bool:
    """Equal after SQuAD's normalisation (case, punctuation, articles, spacing)."""
    return normalize_answer(predicted) == normalize_answer(gold)


@COMPARATORS.register("auto")
def auto(predicted: str, gold: str, options: VerifyOptions) -> bool:
    """`numeric` when both sides are numbers, else `normalized`."""
    if parse_number(predicted) is not None and parse_number(gold) is not None:
        return numeric(predicted, gold, options)
    return normalized(predicted, gold, options)


def resolve(registry: Registry[Any], name: str, where: str) -> Any:
    """A registered extractor / comparator, or a user's by import path."""
    if name in registry:
        return registry.get(name)
    if ":" not in name:
        raise registry.error(name, where, also="'module:function'")
    found = import_object(name, where)
    if not callable(found):
        raise ValueError(f"{where} '{name}': not callable")
    return found


def extract(text: str, chain: tuple[str, ...], options: VerifyOptions) -> str | None:
    """The first answer one of the `chain` of extractors finds in `text`."""
    for name in chain:
        found = resolve(EXTRACTORS, name, "env.options.extract")(text, options)
        if found is not None:
            return found
    return None


def is_match(predicted: str | None, golds: list[str], options: VerifyOptions) -> bool:
    """True when `predicted` matches one of the gold answers (each through gold_extract)."""
    if predicted is None:
        return False
    compare = resolve(COMPARATORS, options.compare, "env.options.compare")
    for gold in golds:
        target = extract(gold, options.gold_extract, options)
        if target is not None and bool(compare(predicted, target, options)):
            return True
    return False


def response_text(trajectory: Trajectory) -> str:
    """What the policy wrote: its actions, one per line (observations never count)."""
    return "\n".join(turn.action for turn in trajectory.turns)


@dataclass(frozen=True)
class VerifiedAnswer:
    """Reward `correct`: 1.0 when the response's answer matches a gold answer, else 0.0;
    None when the task has no gold answer (unscorable, left out of baselines)."""

    options: VerifyOptions = field(default_factory=VerifyOptions)

    def __call__(self, trajectory: Trajectory, task: Task) -> float | None:
        if not task.answers:
            return None
        predicted = extract(response_text(trajectory), self.options.extract, self.options)
        return float(is_match(predicted, task.answers, self.options))


@dataclass(frozen=True)
class AnswerFound:
    """Reward `extracted`: 1.0 when the extractor chain finds an answer in the response."""

    options: VerifyOptions = field(default_factory=VerifyOptions)

    def __call__(self, trajectory: Trajectory, task: Task) -> float:
        return float(extract(response_text(trajectory), self.options.extract, self.options) is not None)
