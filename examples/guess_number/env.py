"""A number-guessing game: a complete user environment for ponder, in one file.

The agent guesses a secret number; after each `<guess>N</guess>` the game answers
"higher", "lower" or "correct". Each guess costs a little (a per-turn reward),
finding the number pays 1. The reference solver (binary search) is the ceiling and
gives the SFT demonstrations. Nothing here is part of ponder: the recipe names this
file's builder by import path (`env.kind: examples.guess_number.env:build`), which
is all a user's own environment needs. See docs/guide/environments.md.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ponder.envs.base import EnvContext, EnvSpec, Opening
from ponder.types import Task, Trajectory

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")
RULES = (
    "I am thinking of a whole number from {low} to {high}. Find it in as few guesses as "
    "you can. Write one guess per turn as <guess>N</guess>; I answer higher, lower or correct."
)


class GuessNumber:
    """One game. `step` returns (observation, done, info) as the Env protocol says."""

    stop_strings = ["</guess>"]

    def __init__(self, low: int = 1, high: int = 32, guess_cost: float = 0.05, max_turns: int = 6) -> None:
        self.low, self.high, self.guess_cost, self.max_turns = low, high, guess_cost, max_turns
        self.secret, self.turns = 0, 0

    def reset(self, task: Task) -> Opening:
        self.secret, self.turns = int(task.answers[0]), 0
        rules = RULES.format(low=self.low, high=self.high)
        return Opening([{"role": "system", "content": rules}, {"role": "user", "content": task.question}])

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        self.turns += 1
        match = GUESS.search(action)
        if match is None:
            reply, done = "Write your guess as <guess>N</guess>.", False
        else:
            guess = int(match.group(1))
            reply = "correct" if guess == self.secret else ("higher" if guess < self.secret else "lower")
            done = reply == "correct"
        if done or self.turns >= self.max_turns:
            return None, True, {"reward": -self.guess_cost, "stop_reason": "answer" if done else "max_turns"}
        return f"\n{reply}\n", False, {"reward": -self.guess_cost}


def solved(trajectory: Trajectory, task: Task) -> float:
    """1 when the last guess was the secret."""
    last = trajectory.turns[-1].action if trajectory.turns else ""
    found = GUESS.findall(last)
    return float(bool(found) and int(found[-1]) == int(task.answers[0]))


def binary_search(secret: int, low: int, high: int) -> list[str]:
    """The reference solver's guesses: halve the range until the secret is hit."""
    actions = []
    while True:
        guess = (low + high) // 2
        actions.append(f"<guess>{guess}</guess>")
        if guess == secret:
            return actions
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def build(ctx: EnvContext) -> EnvSpec:
    """Options: low, high, guess_cost, max_turns (the game), n_train, seed.
    Every fourth secret is held out for evaluation, so evaluated games are new."""
    options = dict(ctx.options)
    n_train, seed = int(options.pop("n_train", 64)), int(options.pop("seed", 0))
    game = {"low": 1, "high": 32, **options}
    secrets = range(game["low"], game["high"] + 1)

    def task(index: int, secret: int, split: str) -> Task:
        actions = binary_search(secret, game["low"], game["high"])
        return Task(f"{split}-{index}", "Guess my number.", [str(secret)], kind="guess", oracle_actions=actions)

    held_out = [s for s in secrets if s % 4 == 0]
    rng = random.Random(seed)
    train = [task(i, rng.choice([s for s in secrets if s % 4]), "train") for i in range(n_train)]
    evaluation = [task(i, secret, "eval") for i, secret in enumerate(held_out)]
    return EnvSpec(lambda: GuessNumber(**game), train, evaluation,
                   rewards={"solved": solved}, reward_weights={"solved": 1.0, "turn_rewards": 1.0})  # fmt: skip
