"""examples/hacking/table.py: the verifier's paired change, the judge's mean, the
answered and paid-but-wrong shares are the hand-computed ones."""

from pathlib import Path

import pytest

from ponder.types import Trajectory, Turn, save_trajectories


def _eval(path: Path, rows: list[tuple[float, float, bool]]) -> Path:
    episodes = []
    for i, (correct, verbosity, answered) in enumerate(rows):
        turn = Turn(0, "<answer>12</answer>" if answered else "so so so")
        turn.answer = "12" if answered else None
        episodes.append(Trajectory(f"math-eval-{i:04d}", [1], turns=[turn], loss_mask=[1, 1],
                                   breakdown={"correct": correct, "verbosity": verbosity}))  # fmt: skip
    save_trajectories(episodes[::-1], path)  # paired by task id, not by order
    return path


def test_the_rows_are_the_hand_computed_ones(tmp_path, capsys, example_script):
    before = _eval(tmp_path / "before.parquet", [(1, 0.2, True), (1, 0.2, True), (0, 0.2, True),
                                                 (1, 0.2, True)])  # fmt: skip
    after = _eval(tmp_path / "after.parquet", [(1, 1.0, True), (0, 1.0, False), (0, 0.4, True),
                                               (0, 1.0, False)])  # fmt: skip
    example_script('hacking/table.py').main(str(before), [str(after)])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == f"| {before} | 0.750 |  | 0.20 | 1.00 | 0.00 | 0.00 | 2 |"
    # correct differences 0, -1, 0, -1: mean -0.5, se 0.289; judge mean 0.85; answered 2 of 4;
    # paid but wrong (judge >= 0.5, correct 0): tasks 1 and 3
    assert rows[3] == f"| {after} | 0.250 | -0.500 (0.289) | 0.85 | 0.50 | 0.50 | 0.00 | 2 |"


def test_refuses_an_evaluation_of_other_tasks(tmp_path, example_script):
    before = _eval(tmp_path / "before.parquet", [(1, 0.2, True)] * 3)
    other = _eval(tmp_path / "other.parquet", [(1, 0.2, True)] * 2)
    with pytest.raises(SystemExit, match="not the held-out tasks"):
        example_script('hacking/table.py').main(str(before), [str(other)])
