"""Seeded "write a Python function" problems with hidden unit tests, graded by difficulty.

Each family is a grid of problem specs (its parameters: a divisor, a shift, a base,
a separator …); a spec carries the function's name and signature, what it must do,
the reference solution as code, and how to draw test inputs. Expected outputs are
computed by running the reference solution here (it is ponder's own code, never the
model's), so the tests and the oracle cannot disagree.

Splits are disjoint by spec: each family's specs are shuffled with the seed and a
share of them is held out for evaluation, so no evaluation problem statement is
ever trained on (the drawn test inputs differ too). Problems come round-robin over
the families, so every split mixes them evenly. Nothing is downloaded and nothing
comes from HumanEval or MBPP.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ponder.types import Task

Args = list  # one test's positional arguments
WORDS = (
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean", "maple", "robot", "candle", "forest",
    "sugar", "planet", "window", "garden", "silver", "rocket", "pencil", "orange", "kitten", "bridge", "mirror",
    "ladder", "cactus", "violin", "desert", "island", "hammer", "pepper",
)  # fmt: skip
DIFFICULTIES = ("easy", "medium", "hard")
# Test inputs drawn per wanted test before the generator settles for fewer distinct ones.
MAX_DRAWS_PER_TEST = 40


@dataclass(frozen=True)
class Spec:
    """One problem before its tests are drawn."""

    family: str
    difficulty: str
    function: str
    signature: str  # the parameter list, e.g. "nums"
    description: str  # what the function returns, completing "that …"
    reference: str  # the reference solution (source of a function named `function`)
    draw: Callable[[random.Random], Args]  # one random test's arguments
    edges: tuple[Args, ...] = ()  # arguments every task of the spec is tested on


def _ints(rng: random.Random, low: int, high: int, max_len: int, min_len: int = 0) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(min_len, max_len))]


def _phrase(rng: random.Random, max_words: int = 4, punctuation: bool = True) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, max_words))]
    words = [w.capitalize() if rng.random() < 0.3 else w for w in words]
    text = " ".join(words)
    return text + rng.choice((".", "!", "?", ",")) if punctuation and rng.random() < 0.5 else text


def _sum_divisible() -> list[Spec]:
    specs = []
    for k in range(2, 10):
        for keep in (True, False):
            name = "sum_divisible" if keep else "sum_not_divisible"
            what, test = ("divisible", "==") if keep else ("not divisible", "!=")
            code = f"def {name}(nums):\n    return sum(x for x in nums if x % {k} {test} 0)\n"
            description = f"returns the sum of the integers in the list `nums` that are {what} by {k}"
            draw = (lambda k: lambda rng: [_mixed_multiples(rng, k)])(k)
            edges = ([[]], [[k, k + 1, -k]])
            specs.append(Spec("sum_divisible", "easy", name, "nums", description, code, draw, edges))
    return specs


def _count_letters() -> list[Spec]:
    pick = random.Random(1234)  # a fixed grid: the task seed must not change which specs exist
    consonants = "bcdfghklmnprst"
    sets = ["aeiou", "aeiouy"] + ["".join(sorted(pick.sample(consonants, pick.randint(2, 4)))) for _ in range(22)]
    specs = []
    for letters in dict.fromkeys(sets):
        shown = ", ".join(f"'{c}'" for c in letters)
        code = f'def count_letters(text):\n    return sum(1 for c in text.lower() if c in "{letters}")\n'
        description = f"returns how many characters of the string `text` are one of the letters {shown} (any case)"
        specs.append(Spec("count_letters", "easy", "count_letters", "text", description, code,
                          lambda rng: [_phrase(rng)], ([""],)))  # fmt: skip
    return specs


def _clamp() -> list[Spec]:
    specs = []
    for low in (-10, -5, 0, 1, 5, 10):
        for width in (5, 10, 20, 50):
            high = low + width
            code = f"def clamp(x):\n    return max({low}, min({high}, x))\n"
            description = (f"returns the integer `x` limited to the range from {low} to {high}: {low} when x is "
                           f"smaller, {high} when x is larger, otherwise x itself")  # fmt: skip
            draw = (lambda lo, hi: lambda rng: [rng.randint(lo - 30, hi + 30)])(low, high)
            specs.append(Spec("clamp", "easy", "clamp", "x", description, code, draw, ([low], [high])))
    return specs


def _fizzbuzz() -> list[Spec]:
    specs = []
    pairs = [(a, b) for a in range(2, 8) for b in range(a + 1, 8)]
    for first, second in (("Fizz", "Buzz"), ("Ping", "Pong"), ("Tik", "Tok"), ("Zig", "Zag")):
        for a, b in pairs:
            code = (f'def fizzbuzz(n):\n    out = ""\n    if n % {a} == 0:\n        out += "{first}"\n'
                    f'    if n % {b} == 0:\n        out += "{second}"\n    return out or str(n)\n')  # fmt: skip
            description = (f"returns '{first}{second}' if the integer `n` is divisible by both {a} and {b}, "
                           f"'{first}' if only by {a}, '{second}' if only by {b}, "
                           "and otherwise n as a string")  # fmt: skip
            specs.append(Spec("fizzbuzz", "medium", "fizzbuzz", "n", description, code,
                              lambda rng: [rng.randint(1, 100)], ([a], [b], [a * b], [1])))  # fmt: skip
    return specs


def _running() -> list[Spec]:
    specs = []
    for op in ("max", "min", "sum"):
        for window in (None, 2, 3, 4):
            if window is None:
                name, start, span = f"running_{op}", "0", f"nums[0] to nums[i] (the running {op})"
            else:
                name, start = f"window_{op}", f"max(0, i - {window - 1})"
                span = f"the last {window} items up to and including nums[i] (fewer at the start)"
            code = f"def {name}(nums):\n    return [{op}(nums[{start}:i + 1]) for i in range(len(nums))]\n"
            description = f"returns a list as long as the integer list `nums` whose item i is the {op} of {span}"
            difficulty = "medium" if window is None else "hard"
            draw = lambda rng: [_ints(rng, -9, 30, 7, 1)]  # noqa: E731
            specs.append(Spec("running", difficulty, name, "nums", description, code, draw, ([[]], [[5]])))
    return specs


def _dedupe() -> list[Spec]:
    specs = []
    for keep in (1, 2, 3):
        for fold in (False, True):
            for last in (False, True):
                key = ".lower()" if fold else ""
                loop = "reversed(items)" if last else "items"
                code = (f"def dedupe(items):\n    out = []\n    for x in {loop}:\n"
                        f"        if sum(1 for y in out if y{key} == x{key}) < {keep}:\n            out.append(x)\n"
                        f"    return out{'[::-1]' if last else ''}\n")  # fmt: skip
                end = "last" if last else "first"
                which, occurrences = (end, "occurrence") if keep == 1 else (f"{end} {keep}", "occurrences")
                same = "; strings that differ only in case count as the same item" if fold else ""
                description = (f"returns the list `items` (of strings) without repeats beyond the {which} "
                               f"{occurrences} of each item, in their original order{same}")  # fmt: skip
                difficulty = "medium" if keep == 1 and not fold and not last else "hard"
                specs.append(Spec("dedupe", difficulty, "dedupe", "items", description, code, _items, ([[]],)))
    return specs


def _items(rng: random.Random) -> Args:
    """Strings from a pool of three, some upper-cased, so repeats (and case-only repeats) are common."""
    pool = [rng.choice(WORDS[:8]) for _ in range(3)]
    picked = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
    return [[w.upper() if rng.random() < 0.25 else w for w in picked]]


def _mixed_multiples(rng: random.Random, k: int) -> list[int]:
    """About half multiples of k, so both kinds of item are common."""
    size = rng.randint(1, 7)
    return [k * rng.randint(-4, 12) if rng.random() < 0.5 else rng.randint(-20, 60) for _ in range(size)]


def _caesar() -> list[Spec]:
    specs = []
    for k in range(1, 26):
        for backward in (False, True):
            for upper in (False, True):
                shift = -k if backward else k
                lines = ["def caesar(text):", '    out = ""', "    for c in text:", '        if "a" <= c <= "z":',
                         f"            c = chr((ord(c) - 97 + {shift}) % 26 + 97)"]  # fmt: skip
                if upper:
                    lines += ['        elif "A" <= c <= "Z":',
                              f"            c = chr((ord(c) - 65 + {shift}) % 26 + 65)"]  # fmt: skip
                lines += ["        out += c", "    return out"]
                which = "letter (lower or upper case, keeping its case)" if upper else "lowercase letter"
                direction = "back" if backward else "forward"
                description = (f"returns the string `text` with each {which} shifted {k} places {direction} in "
                               "the alphabet, wrapping around, and every other character unchanged")  # fmt: skip
                specs.append(Spec("caesar", "hard", "caesar", "text", description, "\n".join(lines) + "\n",
                                  lambda rng: [_phrase(rng, 3)], (["xyz abc"],)))  # fmt: skip
    return specs


def _digit_sum() -> list[Spec]:
    specs = []
    for base in range(2, 11):
        for power in (1, 2, 3):
            term = f"n % {base}" if power == 1 else f"(n % {base}) ** {power}"
            code = (f"def digit_sum(n):\n    total = 0\n    while n > 0:\n        total += {term}\n"
                    f"        n //= {base}\n    return total\n")  # fmt: skip
            raised = "" if power == 1 else f", each digit raised to the power {power}"
            description = f"returns the sum of the digits of the integer `n` >= 0 written in base {base}{raised}"
            difficulty = "easy" if base == 10 and power == 1 else "medium"
            specs.append(Spec("digit_sum", difficulty, "digit_sum", "n", description, code,
                              lambda rng: [rng.randint(0, 10 ** rng.randint(1, 5))], ([0], [base])))  # fmt: skip
    return specs


_PALINDROME_MODES = {
    "case": ("ignoring case", "t = text.lower()", ""),
    "spaces": ("ignoring case and spaces", 't = text.lower().replace(" ", "")', " "),
    "letters": ("ignoring case and every character that is not a letter",
                't = "".join(c for c in text.lower() if c.isalpha())', " ,.!-1"),
    "alnum": ("ignoring case and every character that is not a letter or a digit",
              't = "".join(c for c in text.lower() if c.isalnum())', " ,.!-"),
}  # fmt: skip


def _palindrome() -> list[Spec]:
    specs = []
    for mode, (ignoring, line, noise) in _PALINDROME_MODES.items():
        code = f"def is_palindrome(text):\n    {line}\n    return t == t[::-1]\n"
        description = f"returns True when the string `text` reads the same backwards as forwards, {ignoring}"
        draw = (lambda m, n: lambda rng: [_palindrome_text(rng, m, n)])(mode, noise)
        specs.append(Spec("is_palindrome", "easy" if mode == "case" else "medium", "is_palindrome", "text",
                          description, code, draw, ([""],)))  # fmt: skip
    code = "def is_palindrome(text):\n    w = text.lower().split()\n    return w == w[::-1]\n"
    description = ("returns True when the words of the string `text` (split on spaces) read the same in "
                   "reverse order, ignoring case")  # fmt: skip
    specs.append(Spec("is_palindrome", "medium", "is_palindrome", "text", description, code, _word_palindrome,
                      ([""],)))  # fmt: skip
    return specs


def _palindrome_text(rng: random.Random, mode: str, noise: str) -> str:
    """Half palindromes (once `mode` ignores what it should), half not; mixed case."""
    alphabet = "abcdefgh" + ("12" if mode == "alnum" else "")
    half = [rng.choice(alphabet) for _ in range(rng.randint(1, 4))]
    chars = half + ([rng.choice(alphabet)] if rng.random() < 0.5 else []) + half[::-1]
    if rng.random() < 0.5:
        chars[rng.randrange(len(chars))] = rng.choice("xyz")  # most likely no longer a palindrome
    for _ in range(rng.randint(0, 2) if noise else 0):
        chars.insert(rng.randint(0, len(chars)), rng.choice(noise))
    return "".join(c.upper() if rng.random() < 0.3 else c for c in chars)


def _word_palindrome(rng: random.Random) -> Args:
    half = [rng.choice(WORDS[:6]) for _ in range(rng.randint(1, 2))]
    words = half + ([rng.choice(WORDS[:6])] if rng.random() < 0.5 else []) + half[::-1]
    if rng.random() < 0.5:
        words[rng.randrange(len(words))] = rng.choice(WORDS[6:9])
    return [" ".join(w.capitalize() if rng.random() < 0.3 else w for w in words)]


def _reverse_words() -> list[Spec]:
    specs = []
    modes = {"order": ("the order of the words reversed", "'{s}'.join(text.split('{s}')[::-1])"),
             "letters": ("the letters of each word reversed, the words staying in place",
                         "'{s}'.join(w[::-1] for w in text.split('{s}'))"),
             "both": ("both the order of the words and the letters of each word reversed",
                      "'{s}'.join(w[::-1] for w in text.split('{s}')[::-1])")}  # fmt: skip
    for separator in (" ", ",", "-", "_", "/"):
        for mode, (what, body) in modes.items():
            code = f"def reverse_words(text):\n    return {body.format(s=separator)}\n"
            description = f"takes a string `text` of words separated by '{separator}' and returns it with {what}"
            draw = (lambda s: lambda rng: [s.join(rng.sample(WORDS, rng.randint(1, 5)))])(separator)
            specs.append(Spec("reverse_words", "easy" if mode == "order" else "medium", "reverse_words", "text",
                              description, code, draw, ([""],)))  # fmt: skip
    return specs


FAMILIES: dict[str, Callable[[], list[Spec]]] = {
    "sum_divisible": _sum_divisible,
    "count_letters": _count_letters,
    "clamp": _clamp,
    "fizzbuzz": _fizzbuzz,
    "running": _running,
    "dedupe": _dedupe,
    "caesar": _caesar,
    "digit_sum": _digit_sum,
    "is_palindrome": _palindrome,
    "reverse_words": _reverse_words,
}


def reference_function(spec: Spec) -> Callable[..., object]:
    """The spec's reference solution as a callable (ponder's own code, run in-process)."""
    namespace: dict[str, object] = {}
    exec(compile(spec.reference, f"<reference {spec.function}>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace[spec.function]  # type: ignore[return-value]


def draw_tests(spec: Spec, rng: random.Random, n_tests: int, n_examples: int) -> list[dict[str, object]]:
    """Up to n_tests distinct {"args", "expected"} pairs: n_examples random ones first
    (the examples shown in the question), then the spec's edge cases, then more random
    ones (fewer when the spec's inputs run out)."""
    drawn: dict[str, Args] = {}
    for _ in range(n_examples * MAX_DRAWS_PER_TEST):
        if len(drawn) >= n_examples:
            break
        args = spec.draw(rng)
        drawn.setdefault(json.dumps(args), args)
    for args in spec.edges[: max(0, n_tests - len(drawn))]:
        drawn.setdefault(json.dumps(args), args)
    for _ in range(n_tests * MAX_DRAWS_PER_TEST):
        if len(drawn) >= n_tests:
            break
        args = spec.draw(rng)
        drawn.setdefault(json.dumps(args), args)
    solve = reference_function(spec)
    tests = []
    for args in drawn.values():
        expected = solve(*json.loads(json.dumps(args)))  # a fresh copy: the reference may not mutate the test
        tests.append({"args": args, "expected": json.loads(json.dumps(expected))})
    return tests


def call_text(function: str, args: Args) -> str:
    """`f(1, 'a')`: a call as Python source."""
    return f"{function}({', '.join(repr(a) for a in args)})"


def question_text(spec: Spec, examples: list[dict[str, object]]) -> str:
    shown = "\n".join(f"{call_text(spec.function, t['args'])} == {t['expected']!r}" for t in examples)
    head = f"Write a Python function `{spec.function}({spec.signature})` that {spec.description}."
    return f"{head}\nExamples:\n{shown}"


def to_task(task_id: str, spec: Spec, rng: random.Random, n_tests: int, n_examples: int, kind_by: str) -> Task:
    """A Task whose metadata holds what the environment checks: the function name, the
    tests (the first `examples` of them shown in the question) and the reference code."""
    tests = draw_tests(spec, rng, n_tests, n_examples)
    examples = min(n_examples, len(tests))
    metadata = {"family": spec.family, "difficulty": spec.difficulty, "function": spec.function,
                "signature": spec.signature, "tests": tests, "examples": examples,
                "reference": spec.reference, "needs_search": False}  # fmt: skip
    kind = spec.family if kind_by == "family" else spec.difficulty
    return Task(task_id, question_text(spec, tests[:examples]), [spec.reference], kind=kind, metadata=metadata)


@dataclass(frozen=True)
class TaskConfig:
    """What the generator draws: see `code_splits`."""

    seed: int = 0
    n_train: int = 256
    n_eval: int = 64
    families: Sequence[str] = ()
    n_tests: int = 8
    n_examples: int = 2
    kind_by: str = "family"


def held_out_specs(config: TaskConfig) -> tuple[dict[str, list[Spec]], dict[str, list[Spec]]]:
    """(train, eval) specs per family: each family's grid shuffled with the seed, a
    share of it (at least one spec, never all) held out for evaluation."""
    names = list(config.families) or list(FAMILIES)
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(f"code families {unknown}: unknown; valid: {', '.join(FAMILIES)}")
    share = config.n_eval / max(1, config.n_train + config.n_eval)
    train, evaluation = {}, {}
    for name in names:
        specs = FAMILIES[name]()
        random.Random(f"{config.seed}:{name}").shuffle(specs)
        cut = min(len(specs) - 1, max(1, round(share * len(specs))))
        evaluation[name], train[name] = specs[:cut], specs[cut:]
    return train, evaluation


def _draw_split(split: str, specs: dict[str, list[Spec]], count: int, config: TaskConfig, salt: int) -> list[Task]:
    """`count` tasks round-robin over the families, each cycling through its specs."""
    rng = random.Random(config.seed * 1_000_003 + salt)
    names = list(specs)
    tasks = []
    for index in range(count):
        family = names[index % len(names)]
        spec = specs[family][(index // len(names)) % len(specs[family])]
        task_id = f"code-{split}-{index:04d}"
        tasks.append(to_task(task_id, spec, rng, config.n_tests, config.n_examples, config.kind_by))
    return tasks


def code_splits(config: TaskConfig) -> tuple[list[Task], list[Task]]:
    """(train, eval) tasks, deterministic in config.seed; no problem statement (family
    and parameters) is in both splits."""
    if config.n_examples < 0 or config.n_tests < max(1, config.n_examples):
        raise ValueError(f"code tasks: want n_tests >= n_examples >= 0 and n_tests >= 1, got {config.n_tests} "
                         f"and {config.n_examples}")  # fmt: skip
    if config.kind_by not in ("family", "difficulty"):
        raise ValueError(f"code tasks: kind_by must be 'family' or 'difficulty', got {config.kind_by!r}")
    train_specs, eval_specs = held_out_specs(config)
    evaluation = _draw_split("eval", eval_specs, config.n_eval, config, salt=1)
    train = _draw_split("train", train_specs, config.n_train, config, salt=2)
    return train, evaluation
