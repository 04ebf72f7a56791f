"""The bring-your-own-environment example (examples/guess_number) trains from its
recipe with one command, and its solver and reward are right by hand."""

from __future__ import annotations

import json

import pytest

from examples.guess_number.env import GuessNumber, binary_search, solved
from ponder.cli import main
from ponder.types import Task, Trajectory, Turn


def test_binary_search_by_hand():
    assert binary_search(5, 1, 32) == ["<guess>16</guess>", "<guess>8</guess>", "<guess>4</guess>",
                                       "<guess>6</guess>", "<guess>5</guess>"]  # fmt: skip
    assert binary_search(16, 1, 32) == ["<guess>16</guess>"]


def test_the_game_answers_and_charges_each_guess():
    game = GuessNumber(low=1, high=32, guess_cost=0.05, max_turns=3)
    game.reset(Task("t", "Guess my number.", ["20"]))
    assert game.step("<guess>16</guess>") == ("\nhigher\n", False, {"reward": -0.05})
    assert game.step("no guess here") == ("\nWrite your guess as <guess>N</guess>.\n", False, {"reward": -0.05})
    assert game.step("<guess>25</guess>") == (None, True, {"reward": -0.05, "stop_reason": "max_turns"})
    task = Task("t", "Guess my number.", ["20"])
    assert solved(Trajectory("t", [], turns=[Turn(0, "<guess>20</guess>")]), task) == 1.0
    assert solved(Trajectory("t", [], turns=[Turn(0, "<guess>21</guess>")]), task) == 0.0


def test_the_example_trains_with_one_command(tmp_path, capsys):
    out = tmp_path / "guess"
    code = main(["demo", "--recipe", "examples/guess_number/recipe.yaml", "--out", str(out), "model.name=tiny",
                 "sft.steps=2", "train.steps=1", "eval.episodes=4"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert set(stages) == {"oracle", "base", "sft", "rl"}
    # the oracle finds every held-out number by binary search: 4 in 3 guesses (16, 8, 4),
    # 8 in 2, 12 in 3 (16, 8, 12), 16 in 1
    assert stages["oracle"]["components"]["solved"] == 1.0
    assert stages["oracle"]["components"]["turn_rewards"] == pytest.approx(-0.05 * (3 + 2 + 3 + 1) / 4)
    assert any((out / "rl").rglob("adapter_config.json"))
