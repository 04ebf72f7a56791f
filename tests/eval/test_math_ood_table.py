"""examples/math_ood/table.py: a variant's twin tasks are paired with the plain split's
by their number, and the paired difference and lure rate are the hand-computed ones."""

from pathlib import Path

import pytest

from ponder.types import Trajectory, save_trajectories


def _eval(path: Path, prefix: str, correct: list[float], lure: list[float] | None = None) -> Path:
    episodes = []
    for i, c in enumerate(correct):
        breakdown = {"correct": c, "format": 1.0, **({"lure_taken": lure[i]} if lure else {})}
        episodes.append(Trajectory(f"math-{prefix}-{i:04d}", [], reward=c, breakdown=breakdown))
    save_trajectories(episodes[::-1], path)  # order must not matter: paired by number
    return path


def test_pairs_twins_by_number_and_reports_the_paired_drop(tmp_path, capsys, example_script):
    plain = _eval(tmp_path / "plain.parquet", "eval", [1, 1, 0, 1])
    bait = _eval(tmp_path / "bait.parquet", "bait", [1, 0, 0, 0], lure=[0, 1, 0, 1])
    example_script('math_ood/table.py').main(str(plain), [str(bait)])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == "| plain | 0.750 | | | 1.000 |"
    # differences 0, -1, 0, -1: mean -0.5, sd 0.577, se 0.289; lure 2 of 4
    assert rows[3] == f"| {bait} | 0.250 | -0.500 (0.289) | 0.500 | 1.000 |"


def test_refuses_an_evaluation_of_other_tasks(tmp_path, example_script):
    plain = _eval(tmp_path / "plain.parquet", "eval", [1, 1, 0])
    other = _eval(tmp_path / "ood.parquet", "ood", [1, 0])
    with pytest.raises(SystemExit, match="not the twins"):
        example_script('math_ood/table.py').main(str(plain), [str(other)])
