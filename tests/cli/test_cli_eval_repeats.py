"""`ponder eval --repeats N` on the tiny model: N evaluations of the same tasks over
sampling seeds seed, seed+1, …, each kept, and their spread beside one run's se."""

from __future__ import annotations

import json

from ponder.cli import main
from ponder.types import load_trajectories

TINY = ["--model", "tiny", "rollout.sampling.max_new_tokens_per_turn=8", "env.options.taskgen.n_eval=4"]


def test_repeats_sample_with_successive_seeds_and_report_the_spread(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["eval", "--episodes", "3", "--repeats", "3", "--out", str(out), *TINY, "eval.temperature=1.0",
            "rollout.seed=5"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "repeats.json").read_text())
    assert summary["seeds"] == [5, 6, 7]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["repeats"]["seeds"] == [5, 6, 7] and metrics["reward"] == summary["means"][0]
    episodes = [load_trajectories(out / "trajectories.parquet")]
    episodes += [load_trajectories(out / "repeats" / f"seed-{seed}" / "trajectories.parquet") for seed in (6, 7)]
    assert [[t.task_id for t in run] for run in episodes] == [[t.task_id for t in episodes[0]]] * 3  # same tasks
    assert len({tuple(tuple(t.response_ids) for t in run) for run in episodes}) > 1  # other samples
    for seed, run in zip((6, 7), episodes[1:]):
        saved = json.loads((out / "repeats" / f"seed-{seed}" / "metrics.json").read_text())
        assert saved["reward"] == summary["means"][seed - 5]
    printed = capsys.readouterr().out
    assert "reward over 3 sampling seeds" in printed and "spread (sd)" in printed
    assert f"spread {summary['std']:.3f}" in printed and "harness noise" in printed
    assert all(len(line) <= 80 for line in printed.splitlines())


def test_greedy_repeats_have_no_spread(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["eval", "--episodes", "2", "--repeats", "2", "--out", str(out), *TINY]) == 0
    summary = json.loads((out / "repeats.json").read_text())
    assert summary["std"] == 0.0 and summary["means"][0] == summary["means"][1]
    assert "the seed changes no episode" in capsys.readouterr().out


def test_zero_repeats_is_refused(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["eval", "--repeats", "0", "--out", str(out), *TINY]) == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
    assert not out.exists()
