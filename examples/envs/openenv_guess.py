"""An OpenEnv environment server, written with OpenEnv's own SDK: guess the number.

The game of examples/guess_number as an OpenEnv `Environment` served by
`openenv.core.env_server.create_app`: each WebSocket session is one game; `reset(split,
index)` picks the secret of a task, `step(GuessAction)` answers higher, lower or
correct with a reward (1 for finding it, -0.05 a guess) and `done`. Its tasks come
through OpenEnv's Task API: split `train` holds the numbers 1-32 that are not multiples
of 4, split `test` the multiples of 4, each task spec with the binary-search guesses
(`solution`) a ponder recipe may take as its reference solution.

Run it on 127.0.0.1 (recipes/openenv_guess.yaml starts it itself):

    python -m examples.envs.openenv_guess --port 8765
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

LOW, HIGH, GUESS_COST, MAX_GUESSES = 1, 32, 0.05, 6
NUMBER = re.compile(r"-?\d+")
RULES = (f"I am thinking of a whole number from {LOW} to {HIGH}. Find it in as few guesses as you can. "
         "Write one guess per turn as <guess>N</guess>; I answer higher, lower or correct.")  # fmt: skip


class GuessAction(Action):
    guess: str = Field(..., description="the guess: text with the number in it, e.g. <guess>16</guess>")


class GuessObservation(Observation):
    message: str = Field("", description="the rules, or the answer to the last guess")


def secrets(split: str) -> list[int]:
    numbers = range(LOW, HIGH + 1)
    return [n for n in numbers if (n % 4 == 0) == (split == "test")]


def binary_search(secret: int) -> list[str]:
    low, high, guesses = LOW, HIGH, []
    while True:
        guess = (low + high) // 2
        guesses.append(f"<guess>{guess}</guess>")
        if guess == secret:
            return guesses
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own game and nothing else

    def __init__(self) -> None:
        super().__init__()
        self._state, self.secret = State(), 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, split: str = "train",
              index: int = 0, **kwargs: Any) -> GuessObservation:  # fmt: skip
        self.secret = secrets(split)[index]
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=RULES)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        found = NUMBER.findall(action.guess)
        if not found:
            message = "Write your guess as <guess>N</guess>."
        else:
            guess = int(found[-1])
            message = "correct" if guess == self.secret else ("higher" if guess < self.secret else "lower")
        done = message == "correct" or self._state.step_count >= MAX_GUESSES
        reward = (1.0 if message == "correct" else 0.0) - GUESS_COST
        return GuessObservation(message=message, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state

    # OpenEnv's Task API: the splits and their tasks
    def list_splits(self) -> list[str]:
        return ["train", "test"]

    def num_tasks(self, split: str) -> int:
        return len(secrets(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return {"id": f"{split}-{index}", "index": index, "solution": binary_search(secrets(split)[index])}

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self.get_task(split, index) for index in range(self.num_tasks(split))]


app = create_app(GuessNumberEnvironment, GuessAction, GuessObservation, env_name="guess_number",
                 max_concurrent_envs=64)  # fmt: skip


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="the guess-the-number OpenEnv server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
