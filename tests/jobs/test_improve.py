"""RFT / STaR rounds on the tiny random model (math environment): the pieces on
hand-built episodes, and whole rounds whose verifier is a test component, so both the
kept-sample path and the rationalisation path run end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ponder.config import ImproveConfig, load_recipe
from ponder.jobs.improve import diversity, hinted, keep, pass_rates, run_improve
from ponder.runlog.metrics_log import read_metrics
from ponder.types import Task, Trajectory, Turn

TINY = ["model.name=tiny", "env.kind=math", "env.options.n_train=8", "env.options.n_eval=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "rollout.batch_size=8", "env.max_turns=1", "lora.r=4",
        "sft.steps=2", "sft.batch_size=2", "algo.micro_batch_size=2", "improve.tasks=3", "improve.samples=2",
        "improve.eval_episodes=2", "reward.terms.correct=0", "reward.terms.format=0"]  # fmt: skip


def hinted_only(trajectory, task):
    """A verifier that passes exactly the episodes whose prompt carried the hint."""
    return float("Hint" in task.question)


def any_output(trajectory, task):
    """A verifier every episode passes (the random model never answers right)."""
    return 1.0


def with_verifier(name: str, *overrides: str):
    """The tiny recipe with this module's `name` as a zero-weight component and the verifier."""
    recipe = load_recipe(None, TINY + list(overrides))
    path = f"tests.jobs.test_improve:{name}"
    recipe.reward.terms[path] = 0.0
    recipe.improve.verified = path
    return recipe


def ep(task_id: str, text: str, answer: str | None, verified: float) -> Trajectory:
    return Trajectory(task_id, [1], turns=[Turn(0, text, answer=answer)], breakdown={"correct": verified})


TASKS = {"a": Task("a", "What is 7 + 5?", ["12"]), "b": Task("b", "What is 2 * 3?", ["6"])}


def test_keep_drops_unverified_duplicates_and_guesses():
    worked = "<think>7 + 5 = 12.</think><answer>12</answer>"
    samples = [ep("a", worked, "12", 1.0), ep("a", worked, "12", 1.0), ep("a", "<answer>12</answer>", "12", 1.0),
               ep("a", "<answer>13</answer>", "13", 0.0), ep("b", "<think>2 * 3 = 6.</think><answer>6</answer>", "6", 1.0)]  # fmt: skip
    kept, dropped = keep(samples, TASKS, ImproveConfig(max_per_task=2))
    assert [t.task_id for t in kept] == ["a", "b"] and dropped == 1  # the duplicate skipped, the bare guess dropped
    kept, dropped = keep(samples, TASKS, ImproveConfig(max_per_task=2, drop_guesses=False))
    assert len(kept) == 3 and dropped == 0


def test_pass_rates_and_diversity_by_hand():
    samples = [ep("a", "x 1", "12", 1.0), ep("a", "x 2", "13", 0.0), ep("b", "y", "6", 0.0), ep("b", "y", "6", 0.0)]
    assert pass_rates(samples, "correct", 2) == {"samples/pass@1": 0.25, "samples/pass@2": 0.5}
    measured = diversity(samples)
    assert measured["diversity/distinct_answers"] == 0.75  # a: 2 of 2, b: 1 of 2
    assert measured["diversity/distinct_responses"] == 0.75
    assert measured["diversity/bigram_entropy"] == pytest.approx(1.0)  # bigrams (x,1), (x,2): one bit


def test_hint_names_the_answer():
    assert hinted(TASKS["a"], ImproveConfig().hint).question.endswith("(Hint: the answer is 12; show the steps that reach it.)")


def test_rounds_keep_verified_samples_and_train(tmp_path):
    recipe = with_verifier("any_output", "improve.rounds=2")
    records = run_improve(recipe, tmp_path, say=lambda line: None)
    assert [r["round"] for r in records] == [0, 1, 2]
    for record in records[1:]:
        assert record["samples/pass@1"] == 1.0 and record["data/kept"] == 6.0  # 3 tasks x 2 distinct samples
        assert record["data/rationalised"] == 0.0
        assert record["eval/accuracy"] == 1.0 and record["eval/accuracy_se"] == 0.0 and record["eval/episodes"] == 2
        assert record["sft/loss_first"] > 0
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    assert (tmp_path / "round-02" / "ponder.json").is_file()
    assert json.loads((tmp_path / "results.json").read_text())["rounds"][2]["data/kept"] == 6.0
    assert (tmp_path / "rounds.png").stat().st_size > 0
    assert "round" not in read_metrics(tmp_path)[0]  # the step is the round


def test_rounds_figure_shows_each_rounds_numbers(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from ponder.runlog import plot

    shown = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: shown.append(fig) or path)
    records = [{"round": 0, "eval/accuracy": 0.5, "eval/accuracy_se": 0.1},
               {"round": 1, "eval/accuracy": 0.75, "eval/accuracy_se": 0.05, "samples/pass@1": 0.4,
                "samples/pass@4": 0.9, "diversity/distinct_answers": 0.5}]  # fmt: skip
    plot.plot_rounds(records, tmp_path / "r.png")
    accuracy, pass_k, diverse = shown[0].axes
    assert list(accuracy.lines[0].get_ydata()) == [0.5, 0.75]
    lines = {line.get_label(): list(line.get_ydata()) for line in pass_k.lines}
    assert lines["pass@1"][1] == 0.4 and lines["pass@4"][1] == 0.9 and lines["pass@1"][0] != lines["pass@1"][0]  # NaN
    assert [line.get_label() for line in diverse.lines] == ["distinct_answers"]
    plt.close(shown[0])


def test_failed_tasks_are_rationalised_with_the_hint_and_trained_without_it(tmp_path):
    recipe = with_verifier("hinted_only", "improve.rounds=1")
    (_, record) = run_improve(recipe, tmp_path, say=lambda line: None)
    assert record["samples/pass@1"] == 0.0 and record["data/kept"] == 0.0
    assert record["data/rationalised"] == 3.0 and record["sft/loss_first"] > 0
    assert record["eval/accuracy"] == 0.0  # held-out prompts carry no hint


def test_replay_puts_the_hinted_answer_on_the_plain_prompt():
    from ponder.models import tiny_policy
    from ponder.jobs.improve import replay
    from ponder.wiring import build_env

    recipe = load_recipe(None, TINY)
    policy, spec = tiny_policy(), build_env(load_recipe(None, TINY))
    task = spec.train[0]
    done = ep(task.id, "<think>a step</think><answer>7</answer>", "7", 1.0)
    (replayed,) = replay(policy, [done], {task.id: task}, spec.factory, recipe)
    prompt = policy.tokenizer.decode(replayed.prompt_ids)
    assert task.question in prompt and "Hint" not in prompt
    assert replayed.turns[0].action == "<think>a step</think><answer>7</answer>"


def test_cli_refuses_bad_counts_with_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ponder.cli", "improve", "--recipe", "recipes/math.yaml", "--rounds", "0",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith("improve.rounds must be >= 1, got 0")
    assert not (tmp_path / "x").exists()
