"""Self-refine: the improvement counts by hand, the revision prompt, and a run on the
tiny model with the policy as its own critic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ponder.config import load_recipe
from ponder.eval.refine import refine, refinement_stats, revised_task
from ponder.types import Task, Trajectory, Turn


def test_refinement_stats_by_hand():
    scores = {"a": [0.0, 1.0, 1.0], "b": [1.0, 0.0], "c": [0.0, 0.0], "d": [1.0, 1.0]}
    stats = refinement_stats(scores)
    # revisions: a 0→1 (up), a 1→1, b 1→0 (down), c 0→0, d 1→1: 5 in all
    assert stats["refine/revisions"] == 5.0
    assert stats["refine/monotone_improvement_rate"] == pytest.approx(1 / 5)
    assert stats["refine/regression_rate"] == pytest.approx(1 / 5)
    assert stats["refine/accuracy_before"] == 0.5
    assert stats["refine/accuracy_after_last"] == 0.5  # a and d
    assert stats["refine/accuracy_after_best"] == 0.75  # a, b (its first answer), d


def test_revised_task_carries_attempt_and_critique_and_keeps_the_id():
    task = Task("t", "What is 7 + 5?", ["12"])
    previous = Trajectory("t", [1], turns=[Turn(0, "<answer>13</answer>")])
    revised = revised_task(task, previous, " 7 + 5 is 12, not 13. ")
    assert revised.id == "t" and revised.answers == ["12"]
    assert revised.question.startswith("What is 7 + 5?\n\nA previous attempt:\n<answer>13</answer>\n\n")
    assert "Feedback on it:\n7 + 5 is 12, not 13.\n\nSolve the problem again" in revised.question


TINY = ["model.name=tiny", "env.kind=math", "env.options.n_train=4", "env.options.n_eval=3",
        "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=1", "lora.r=4"]  # fmt: skip


def test_refine_on_the_tiny_model_with_itself_as_critic():
    from ponder.models import tiny_policy
    from ponder.wiring import policy_completion

    policy = tiny_policy()
    critiques = []

    def critic(messages):
        critiques.append(messages[0]["content"])
        return policy_completion(policy, 8)(messages)

    result = refine(load_recipe(None, TINY), policy, 2, critic, episodes=3)
    # the random model is never right: every revision ties at 0, so each task is revised once
    assert result.scores == {f"math-eval-{i:04d}": [0.0, 0.0] for i in range(3)}
    assert len(critiques) == 3 and all(c.startswith("Check this solution") for c in critiques)
    assert len(result.trajectories) == 2 and len(result.critiques) == 1
    stats = refinement_stats(result.scores)
    assert stats["refine/monotone_improvement_rate"] == 0.0 and stats["refine/revisions"] == 3.0


def test_refine_cli_writes_results(tmp_path):
    out = tmp_path / "refine"
    run = subprocess.run([sys.executable, "-m", "ponder.cli", "refine", "--recipe", "recipes/math.yaml", "--episodes",
                          "2", "--rounds", "1", "--critic-tokens", "4", "--out", str(out), *TINY],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "refine/monotone_improvement_rate" in run.stdout
    saved = json.loads((out / "results.json").read_text())
    assert saved["stats"]["refine/revisions"] == 2.0 and (out / "round-1.parquet").is_file()
