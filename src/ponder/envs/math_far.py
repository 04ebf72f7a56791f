"""The `far` math phrasings: the held-out problems told in settings, sentence shapes and
words that no training template uses.

Each (level, template) of ponder.envs.math_tasks has phrasings in two disjoint halves:
`eval` (the `far` evaluation variant) and `train` (what `env.options.train_variants:
[far]` draws for training tasks), so an evaluation on `far` stays out of distribution
even when training is diversified with `far`. A phrasing changes
  - the setting: a bakery, a train timetable, a garden, a library, money in cents,
    distances, time, a water tank …;
  - the sentence shape: the question first, the passive voice, several sentences;
  - the numbers: those from 0 to 12 are written in words half the time ("seven");
  - the units: kg, km, litres, minutes, hours, cents, euros;
and a share of problems gets an irrelevant sentence with a number (its `lure`).
The arithmetic is the problem's own: the same values, steps and answer (a level-3
step's label follows the new items).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import NamedTuple

from ponder.envs.math_tasks import Problem

HALVES = ("train", "eval")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve")  # fmt: skip
SPOKEN_SHARE = 0.5  # of the numbers 0 to 12 in a question, written in words
DISTRACTOR_SHARE = 0.4  # of far questions, with an irrelevant sentence holding a number
# Names neither the training templates nor `ood` use, one set per half.
FAR_NAMES = {"train": ("Hiroshi", "Marta", "Kwame", "Ingrid", "Pablo", "Leila"),
             "eval": ("Anouk", "Tomasz", "Chiara", "Oluwaseun", "Sven", "Imani")}  # fmt: skip
# Quantities of another kind than the problem's (a year, a platform, a song): never
# something the question counts. No number words here: the lure is the digits.
FAR_DISTRACTORS = {
    "train": ("The bakery's oven was installed {n} years ago.", "Platform {n} is closed for repairs today.",
              "The garden gate was painted {n} days ago.", "Bus route {n} stops outside."),
    "eval": ("The library's clock tower has {n} steps.", "A radio in the corner plays song number {n}.",
             "The forecast promised a {n} per cent chance of rain.", "Locker {n} in the hallway is jammed."),
}  # fmt: skip


class Phrasing(NamedTuple):
    """A far question: `text` with the problem's values ({a}: maybe in words, {a_n}:
    always digits), {name}, and for level 3 {first} / {second} drawn from `pairs`."""

    text: str
    pairs: tuple[tuple[str, str], ...] = ()


_P = Phrasing
TRAIN: dict[tuple[int, str], tuple[Phrasing, ...]] = {
    (1, "add"): (_P("How many kilograms of flour does the bakery use altogether, if {a} kg go into bread and "
                    "another {b} kg into cakes?"),
                 _P("{name} cycled {a} km before lunch. After lunch, {b} km were added to the trip. Find the "
                    "full distance in km.")),
    (1, "sub"): (_P("The library owned {a} atlases until {b} of them were lost in a flood. How many atlases "
                    "does it own now?"),
                 _P("What weight, in kg, remains in a sack of {a} kg of rice once {b} kg have been scooped out?")),
    (1, "mul"): (_P("Each tray in the bakery oven takes {b} rolls, and {a} trays are baked. How many rolls come "
                    "out?"),
                 _P("For how many hours in all does a lamp burn, when it is lit for {b} hours on each of {a} "
                    "evenings?")),
    (1, "div"): (_P("A baker divides {total} kg of dough into {b} equal batches. How many kg does one batch "
                    "weigh?"),
                 _P("What does one share come to, in cents, when {total} cents are split fairly among {b} "
                    "cousins?")),
    (1, "bare+"): (_P("A thermometer shows {a} degrees at dawn and climbs {b} degrees by noon. What is the noon "
                      "reading?"),
                   _P("Which floor is reached by a lift that starts on floor {a} and rises {b} floors?")),
    (1, "bare-"): (_P("A lift on floor {a} goes down {b} floors. On which floor does it stop?"),
                   _P("The temperature was {a} degrees; overnight it dropped by {b} degrees. What was the new "
                      "temperature?")),
    (1, "bare*"): (_P("A crate weighs {a} kg. What do {b} such crates weigh together, in kg?"),
                   _P("How many seats are in a hall with {b} rows of {a} seats?")),
    (2, "buy_give"): (_P("A library's reading room had {a} visitors. Later {b} people came in and {c} went home. "
                         "Count the visitors in the room at the end."),
                      _P("How many plants remain in {name}'s greenhouse, given that it held {a}, {b} were added "
                         "in spring and {c} were given to neighbours?")),
    (2, "packs"): (_P("{name} bought {a} bags of flour weighing {b} kg each, adding them to {c} kg already in the "
                      "pantry. How many kg of flour is in the pantry?"),
                   _P("What is the number of tulips in a garden where {a} rows of {b} tulips were planted next to "
                      "{c} tulips that were already growing?")),
    (2, "wage"): (_P("{name} is paid {a} cents for every letter delivered. After delivering {b} letters, {c} cents "
                     "are spent on a snack. How many cents are left over?"),
                  _P("A baker earns {a} euros per hour over a shift of {b} hours and pays {c} euros for the bus "
                     "home. How many euros does the baker keep?")),
    (2, "bare"): (_P("A tank holds {c} litres. A hose then adds {a} litres per minute for {b} minutes. How many "
                     "litres does the tank hold at the end?"),
                  _P("How many minutes does {name} spend practising, counting {b} sessions of {a} minutes plus a "
                     "warm-up of {c} minutes?")),
    (3, "change"): (_P("In the bakery {name} chooses {a} {first} priced {p1} euros per piece and {b} {second} "
                       "priced {p2} euros per piece, paying {paid} euros. How many euros are given back?",
                       (("bagels", "tarts"), ("muffins", "pies"), ("scones", "buns"))),
                    _P("How many cents should come back when {paid} cents are handed over for {a} {first} ({p1} "
                       "cents per item) and {b} {second} ({p2} cents per item)?",
                       (("erasers", "rulers"), ("postcards", "badges"), ("lollipops", "pretzels")))),
    (3, "farm"): (_P("A bakery packs {a} boxes of {b} {first} and {c} boxes of {d} {second}. Once {sold} of these "
                     "pastries are sold, how many are still unsold?",
                     (("scones", "eclairs"), ("doughnuts", "strudels"), ("bagels", "brioches"))),
                  _P("How many seedlings does a nursery still have, if it grew {a} trays of {b} {first} and {c} "
                     "trays of {d} {second}, and {sold} seedlings were then bought?",
                     (("peppers", "lettuces"), ("tomatoes", "cucumbers"), ("pansies", "daisies")))),
    (3, "reading"): (_P("A cyclist must cover {pages} km. For {b} days the cyclist rides {a} km a day, then for {d} "
                        "days {c} km a day. How many km of the route remain?"),
                     _P("What length of fabric, in metres, is left on a {pages} metre roll after {b} curtains of "
                        "{a} metres and {d} tablecloths of {c} metres are cut from it?")),
    (4, "equation"): (_P("Find the unknown n when {a} times n {plus_minus} {abs_b} gives {c}."),
                      _P("If k is multiplied by {a} and {abs_b} is {added} afterwards, the outcome is {c}. "
                         "Determine k.")),
    (4, "puzzle"): (_P("{name} picks a secret number, multiplies by {a}, then adds {b} and gets {c}. Which secret "
                       "number was picked?"),
                    _P("Adding {b} to {a} times a hidden number gives {c}. Name the hidden number.")),
}  # fmt: skip
EVAL: dict[tuple[int, str], tuple[Phrasing, ...]] = {
    (1, "add"): (_P("A train waits {a} minutes at the first station and {b} minutes at the second. Altogether, "
                    "for how many minutes does it stand still?"),
                 _P("Seeds were sown by {name} in two rows: {a} in the front row and {b} in the back row. How many "
                    "seeds went into the ground?")),
    (1, "sub"): (_P("{name} had {a} cents in a coin jar and took out {b} cents for a stamp. Find how many cents "
                    "are still in the jar."),
                 _P("A hike covers {a} km. After {b} km, how much of the route, in km, is still ahead?")),
    (1, "mul"): (_P("A garden has {a} beds. On every bed, {b} kg of compost were spread. Give the weight of the "
                    "compost in kg."),
                 _P("{name} jogs {b} km on each of {a} mornings. What distance in km is covered over those "
                    "mornings?")),
    (1, "div"): (_P("{total} novels are to be placed on {b} shelves, the same number on each shelf. How many "
                    "novels go on one shelf?"),
                 _P("A journey of {total} km is driven in {b} stages of equal length. In km, how long is each "
                    "stage?")),
    (1, "bare+"): (_P("A team scores {a} points in the first half and {b} points in the second. What is its final "
                      "score?"),
                   _P("Start from {a}, then count on by {b}. Where does the counting stop?")),
    (1, "bare-"): (_P("Take {b} away from {a}: what number is left over?"),
                   _P("A candle {a} cm tall burns down by {b} cm. How tall, in cm, is it afterwards?")),
    (1, "bare*"): (_P("A stamp costs {a} cents. What do {b} stamps cost, in cents?"),
                   _P("A ferry makes a crossing of {a} km, {b} times in a week. How many km is that in the "
                      "week?")),
    (2, "buy_give"): (_P("The bakery had {a} croissants on the counter. {b} more were baked, and then {c} were "
                         "sold. How many croissants are on the counter now?"),
                      _P("A train pulls out with {a} passengers. At the next stop {b} board and {c} get off. "
                         "Find the number of passengers on board.")),
    (2, "packs"): (_P("A shelf had {c} biographies. A delivery brought {a} cartons, each containing {b} "
                      "biographies, and all were put on the shelf. How many biographies are on the shelf?"),
                   _P("A train runs {a} trips of {b} km each, and before that it had travelled {c} km. In km, how "
                      "far has it travelled today?")),
    (2, "wage"): (_P("Over {b} hours a pump moves {a} litres each hour, but {c} litres leak away. How many litres "
                     "are kept?"),
                  _P("What remains of {name}'s pay, in euros, after working {b} days at {a} euros a day and "
                     "buying a ticket for {c} euros?")),
    (2, "bare"): (_P("A train timetable lists {a} departures an hour over {b} hours, plus {c} extra night trains. "
                     "How many departures are listed?"),
                  _P("The garden path gets {a} stones in each of {b} rows and {c} stones at the gate. Count the "
                     "stones.")),
    (3, "change"): (_P("{name} spends part of {paid} euros at a garden centre: {a} {first} cost {p1} euros each "
                       "and {b} {second} cost {p2} euros each. What is left of the money, in euros?",
                       (("ferns", "cacti"), ("tulips", "lilies"), ("shovels", "rakes"))),
                    _P("A library sells old books: {a} {first} for {p1} euros a copy and {b} {second} for {p2} "
                       "euros a copy. A reader pays with {paid} euros. Work out the change.",
                       (("atlases", "dictionaries"), ("novels", "biographies"), ("comics", "cookbooks")))),
    (3, "farm"): (_P("On {a} shelves stand {b} {first} per shelf, and on {c} shelves stand {d} {second} per shelf. "
                     "After {sold} volumes are lent out, how many stay on the shelves?",
                     (("atlases", "dictionaries"), ("novels", "biographies"), ("comics", "cookbooks"))),
                  _P("A warehouse stores {a} pallets carrying {b} {first} and {c} pallets carrying {d} {second}. "
                     "If {sold} items are shipped, what number of items is left in storage?",
                     (("kettles", "toasters"), ("lamps", "clocks"), ("drums", "flutes")))),
    (3, "reading"): (_P("{name}'s audiobook runs {pages} minutes. {name} listens {a} minutes each evening for {b} "
                        "evenings, and {c} minutes each morning for {d} mornings. How many minutes are still to be "
                        "heard?"),
                     _P("A water tank of {pages} litres supplies {a} litres daily for {b} days and afterwards {c} "
                        "litres daily over {d} days. How many litres are left in it?")),
    (4, "equation"): (_P("{c} is what you get from {a} lots of an unknown w, {plus_minus} {abs_b}. What is w?"),
                      _P("Tell me the value of m in the equation {c_n} = {a_n}m {sign} {abs_b_n}.")),
    (4, "puzzle"): (_P("What number y has the property that {a} times y, increased by {b}, equals {c}?"),
                    _P("The result is {c}. It was reached by taking an unknown value, scaling it by a factor of "
                       "{a} and adding {b}. What was the unknown value?")),
}  # fmt: skip
PHRASINGS = {"train": TRAIN, "eval": EVAL}
_SENTENCE_BREAK = re.compile(r"(?<=[.?!])\s+")
_INTEGER = re.compile(r"-?\d+")


def spoken(value: int, rng: random.Random) -> str:
    """`value` in words when it is 0 to 12 and the draw says so, else in digits."""
    return NUMBER_WORDS[value] if 0 <= value < len(NUMBER_WORDS) and rng.random() < SPOKEN_SHARE else str(value)


def _fields(problem: Problem, half: str, rng: random.Random) -> dict[str, object]:
    values = dict(problem.values)
    if problem.level == 4:
        b = values["b"]
        values["abs_b"] = abs(b)
        words = {"plus_minus": "plus" if b > 0 else "minus", "sign": "+" if b > 0 else "-",
                 "added": "added" if b > 0 else "subtracted"}  # fmt: skip
    else:
        words = {}
    fields: dict[str, object] = {"name": rng.choice(FAR_NAMES[half]), **words}
    for key, value in values.items():
        fields[key], fields[f"{key}_n"] = spoken(value, rng), str(value)
    return fields


def _with_distractor(question: str, taken: set[int], half: str, rng: random.Random) -> tuple[str, int]:
    number = rng.choice([n for n in range(2, 100) if n not in taken])
    sentences = _SENTENCE_BREAK.split(question)
    sentences.insert(rng.randint(0, len(sentences)), rng.choice(FAR_DISTRACTORS[half]).format(n=number))
    return " ".join(sentences), number


def far_rephrase(problem: Problem, rng: random.Random, half: str = "eval") -> tuple[Problem, int | None]:
    """(the problem in one of `half`'s far phrasings, the distractor's number or None).
    The steps and answer are the problem's; level-3 step labels follow the new items."""
    phrasing = rng.choice(PHRASINGS[half][(problem.level, problem.template)])
    fields = _fields(problem, half, rng)
    steps = list(problem.steps)
    if phrasing.pairs:
        first, second = rng.choice(phrasing.pairs)
        fields.update(first=first, second=second)
        steps[0], steps[1] = (first.capitalize(), *steps[0][1:]), (second.capitalize(), *steps[1][1:])
    question = phrasing.text.format(**fields)
    question = question[0].upper() + question[1:]  # "seven loaves …" opens a sentence
    lure = None
    if rng.random() < DISTRACTOR_SHARE:
        taken = {problem.answer, *problem.values.values()}
        taken |= {int(n) for _, expression, value in steps for n in (*_INTEGER.findall(expression), value)}
        question, lure = _with_distractor(question, taken, half, rng)
    return dataclasses.replace(problem, question=question, steps=steps, template=f"far-{problem.template}"), lure
