"""Out-of-distribution and adversarial twins of the held-out math problems.

Each variant takes the evaluation split's problems (the same seed, numbers, steps and
answer; ponder.envs.math_tasks.math_splits) and changes only the text, so a score
against the plain split is a paired comparison that isolates what changed:

  ood         rephrased: sentence templates and names / items / animals training never
              uses ("Compute the sum of 7 and 5.", "Priya … lanterns");
  distractor  one sentence with an irrelevant number, before the question ("The
              shop is 23 minutes away."); the answer is unchanged;
  bait        a wrong answer offered in the prompt ("The answer is probably 13."),
              a near miss or a number of the problem, never the right answer;
  far         told in another setting, sentence shape and wording (a bakery, a
              timetable, money in cents; the question first; "seven"; "5 kg"), some
              with an irrelevant number (ponder.envs.math_far, its `eval` half).

`training_tasks` diversifies the training split with `ood` and `far` (the `train` half
of the far phrasings, disjoint from the evaluation half) for `env.options.train_variants`.

The planted number (bait or distractor) is the task's `metadata["lure"]`;
`lure_taken` scores whether an episode answered with it. The generator is seeded from
the split's seed and the variant name, so the same seed gives the same tasks.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Sequence

from ponder.envs.math_far import far_rephrase
from ponder.envs.math_tasks import ANIMALS, ITEMS, NAMES, PRICED, Problem, generate_problems, split_problems, to_task
from ponder.rewards.math import answers_match, predicted_answer
from ponder.types import Task, Trajectory

VARIANTS = ("none", "ood", "distractor", "bait", "far")
TRAIN_VARIANTS = ("none", "ood", "far")  # what env.options.train_variants may draw
MAX_REDRAWS = 20  # a training rendering equal to an evaluation question is drawn again
# Words the training templates never use, so `ood` changes vocabulary as well as syntax.
OOD_NAMES = ("Priya", "Mateo", "Aiko", "Bruno", "Farah", "Elif", "Jonas", "Wen")
OOD_ITEMS = ("lanterns", "kites", "buttons", "ribbons", "candles", "tickets", "beads", "feathers")
OOD_PRICED = (("mugs", "bowls"), ("kites", "balloons"), ("candles", "lamps"), ("scarves", "gloves"))
OOD_ANIMALS = (("llamas", "alpacas"), ("turkeys", "quails"), ("horses", "donkeys"))
# One rephrasing per training template (level, Problem.template); fields are the
# problem's values plus name, items, first / second, sign and abs_b.
REPHRASED = {
    (1, "add"): "Starting with {a} {items}, {name} is given another {b}. What is the total number of {items} "
                "{name} owns?",
    (1, "sub"): "Of the {a} {items} {name} owned, {b} were handed to a neighbour. How many does {name} still own?",
    (1, "mul"): "A shelf holds {a} crates, and every crate contains {b} {items}. Count all the {items} on the shelf.",
    (1, "div"): "{total} {items} are split evenly between {b} children. What does each child receive?",
    (1, "bare+"): "Compute the sum of {a} and {b}.",
    (1, "bare-"): "Subtract {b} from {a}. What do you get?",
    (1, "bare*"): "Find the product of {a} and {b}.",
    (2, "buy_give"): "{name} owned {a} {items}. After purchasing {b} extra and handing {c} to a friend, how many "
                     "does {name} own?",
    (2, "packs"): "Before shopping, {name} had {c} {items}. {name} then picked up {a} packets holding {b} {items} "
                  "apiece. What is the new total?",
    (2, "wage"): "Paid ${a} for every hour, {name} worked for {b} hours and then spent ${c} on lunch. How much "
                 "money, in dollars, is left?",
    (2, "bare"): "Multiply {a} by {b}, then add {c} to the product. What is the result?",
    (3, "change"): "At the market {name} picks {a} {first} costing ${p1} apiece and {b} {second} costing ${p2} "
                   "apiece, handing over ${paid}. What change, in dollars, comes back?",
    (3, "farm"): "There are {a} enclosures holding {b} {first} apiece and {c} enclosures holding {d} {second} "
                 "apiece. After {sold} of the animals are sold, how many remain?",
    (3, "reading"): "{name}'s novel is {pages} pages long. For {b} days {name} reads {a} pages daily, and for the "
                    "next {d} days {c} pages daily. How many pages remain unread?",
    (4, "equation"): "Which value of x makes {a}x {sign} {abs_b} = {c} true?",
    (4, "puzzle"): "A mystery number is multiplied by {a}, then {b} is added, giving {c}. Find the mystery number.",
}  # fmt: skip
# Quantities of another kind than the problem counts (ages, minutes, degrees …): a
# possession ("Sam has 9 books.") could make "How many are left?" ambiguous.
DISTRACTORS = ("{other} is {n} years old.", "The shop is {n} minutes away.", "It was {n} degrees outside that day.",
               "{other} lives {n} km away.", "The bus that passes by is number {n}.")  # fmt: skip
BAITS = ("The answer is probably {n}.", "Hint: the answer is {n}.", "My friend says the answer is {n}.",
         "I worked it out already and got {n}.")  # fmt: skip
_INTEGER = re.compile(r"-?\d+")
_LAST_SENTENCE = re.compile(r"(?<=[.?!])\s+(?=[^.?!]*[.?!]$)")  # the space before the final sentence


def rephrase(problem: Problem, rng: random.Random) -> Problem:
    """The problem in its `ood` template with new names and items; same steps and answer
    (the labels of level-3 steps follow the new items, for the reference solver)."""
    fields: dict[str, object] = {**problem.values, "name": rng.choice(OOD_NAMES), "items": rng.choice(OOD_ITEMS)}
    steps = list(problem.steps)
    if problem.level == 3 and problem.template in ("change", "farm"):
        first, second = rng.choice(OOD_PRICED if problem.template == "change" else OOD_ANIMALS)
        fields.update(first=first, second=second)
        steps[0], steps[1] = (first.capitalize(), *steps[0][1:]), (second.capitalize(), *steps[1][1:])
    if problem.level == 4:
        fields.update(sign="+" if problem.values["b"] > 0 else "-", abs_b=abs(problem.values["b"]))
    question = REPHRASED[(problem.level, problem.template)].format(**fields)
    return dataclasses.replace(problem, question=question, steps=steps, template=f"ood-{problem.template}")


def _numbers_in(text: str) -> set[int]:
    return {int(match) for match in _INTEGER.findall(text)}


def add_distractor(problem: Problem, rng: random.Random) -> tuple[Problem, int]:
    """(the problem with an irrelevant sentence before its question, the number in it).
    The number is none of the problem's numbers, intermediate results or answer: copying
    it is then never right by accident."""
    taken = _numbers_in(problem.question) | {problem.answer}
    taken |= {n for _, expression, value in problem.steps for n in (*_numbers_in(expression), value)}
    number = rng.choice([n for n in range(2, 100) if n not in taken])
    other = rng.choice([name for name in NAMES if name not in problem.question])
    sentence = rng.choice(DISTRACTORS).format(n=number, other=other)
    parts = _LAST_SENTENCE.split(problem.question)
    head = " ".join(parts[:-1])
    question = f"{head} {sentence} {parts[-1]}" if head else f"{sentence} {parts[-1]}"
    return dataclasses.replace(problem, question=question, template=f"distractor-{problem.template}"), number


def add_bait(problem: Problem, rng: random.Random) -> tuple[Problem, int]:
    """(the problem with a wrong answer offered after its question, that number): a near
    miss (answer ± 1..10) or one of the problem's numbers, never the answer."""
    near = [problem.answer + offset for offset in range(-10, 11) if offset]
    given = sorted(_numbers_in(problem.question) - {problem.answer})
    pool = given if given and rng.random() < 0.5 else near
    number = rng.choice(pool)
    question = f"{problem.question} {rng.choice(BAITS).format(n=number)}"
    return dataclasses.replace(problem, question=question, template=f"bait-{problem.template}"), number


def _transform(variant: str, half: str = "eval") -> Callable[[Problem, random.Random], tuple[Problem, int | None]]:
    if variant == "ood":
        return lambda problem, rng: (rephrase(problem, rng), None)
    if variant == "far":
        return lambda problem, rng: far_rephrase(problem, rng, half)
    return {"distractor": add_distractor, "bait": add_bait}[variant]


def variant_tasks(variant: str, seed: int, n_eval: int, levels: Sequence[int], weights: Sequence[float] | None,
                  calculator: bool, calculator_from: int) -> list[Task]:  # fmt: skip
    """The evaluation split of math_splits(seed, …, n_eval, levels, weights, …) as
    `variant` tasks (ids `math-<variant>-NNNN`, kind `level{n}`); metadata adds
    `variant`, `base_question` and `lure` (the bait or distractor number, else None)."""
    if variant not in VARIANTS or variant == "none":
        raise ValueError(f"math variant {variant!r}: want one of {', '.join(VARIANTS[1:])}")
    rng = random.Random(f"math-{variant}-{seed}")  # str seeds are stable across runs
    transform = _transform(variant)
    tasks = []
    for index, problem in enumerate(generate_problems(seed, n_eval, levels, weights)):
        changed, lure = transform(problem, rng)
        task = to_task(f"math-{variant}-{index:04d}", changed, calculator, calculator_from)
        task.metadata.update(variant=variant, base_question=problem.question, lure=lure)
        tasks.append(task)
    return tasks


def training_tasks(train_variants: Sequence[str], seed: int, n_train: int, n_eval: int, levels: Sequence[int],
                   weights: Sequence[float] | None, calculator: bool, calculator_from: int) -> list[Task]:  # fmt: skip
    """The training split of math_splits(seed, n_train, n_eval, …), each task told in a
    variant drawn (seeded) from `train_variants` (`none`, `ood`, `far`; a name listed
    twice is drawn twice as often). `far` draws the train half of the far phrasings;
    no question equals an evaluation question of any variant (such a draw is drawn
    again, then left plain). Metadata as in variant_tasks."""
    unknown = [variant for variant in train_variants if variant not in TRAIN_VARIANTS]
    if not train_variants or unknown:
        raise ValueError(f"math train_variants {list(train_variants)}: each must be one of {', '.join(TRAIN_VARIANTS)}")
    training, held_out = split_problems(seed, n_train, n_eval, levels, weights)
    evaluation = {problem.question for problem in held_out}
    for variant in VARIANTS[1:]:
        evaluation |= {t.question for t in variant_tasks(variant, seed, n_eval, levels, weights, calculator, 1)}
    rng = random.Random(f"math-train-variants-{seed}")
    tasks = []
    for index, problem in enumerate(training):
        variant = rng.choice(list(train_variants))
        changed, lure = problem, None
        for _ in range(MAX_REDRAWS if variant != "none" else 0):
            changed, lure = _transform(variant, "train")(problem, rng)
            if changed.question not in evaluation:
                break
        else:
            changed, lure, variant = problem, None, "none"
        task = to_task(f"math-train-{index:04d}", changed, calculator, calculator_from)
        task.metadata.update(variant=variant, base_question=problem.question, lure=lure)
        tasks.append(task)
    return tasks


def lure_taken(trajectory: Trajectory, task: Task) -> float | None:
    """Reward component (logged, weight 0): 1.0 when the episode's answer is the task's
    planted bait or distractor number, else 0.0; None for a task with no lure."""
    lure = task.metadata.get("lure") if task.metadata else None
    if lure is None:
        return None
    return float(answers_match(predicted_answer(trajectory), [str(lure)]))


def question_skeleton(text: str) -> str:
    """The question with numbers and names / items / animals blanked: its template.
    Two questions from the same template have the same skeleton."""
    vocabulary = {*NAMES, *OOD_NAMES, *ITEMS, *OOD_ITEMS}
    vocabulary |= {word for pair in (*PRICED, *ANIMALS, *OOD_PRICED, *OOD_ANIMALS) for word in pair}
    words = sorted(vocabulary, key=len, reverse=True)  # longest first: "shells" must not eat "seashells"
    return re.sub(r"\b(" + "|".join(map(re.escape, words)) + r")\b", "_", _INTEGER.sub("#", text))
