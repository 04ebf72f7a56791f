"""`ponder eval` end to end on the tiny model, and its bad-input contract: one line
naming the problem, exit code 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ponder.cli import main
from ponder.types import load_trajectories

TINY = ["--model", "tiny", "rollout.sampling.max_new_tokens_per_turn=8", "env.options.taskgen.n_eval=4"]


def test_eval_writes_trajectories_and_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["eval", "--recipe", "recipes/search_qa.yaml", "--episodes", "3", "--out", str(out), *TINY])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    trajectories = load_trajectories(out / "trajectories.parquet")
    assert metrics["episodes"] == 3 == len(trajectories)
    assert metrics["model"] == "tiny"
    assert metrics["turns"] == pytest.approx(sum(t.metrics["turns"] for t in trajectories) / 3)
    for trajectory in trajectories:
        trajectory.check()
        assert sum(trajectory.loss_mask) == trajectory.metrics["generated_tokens"] > 0
    table = capsys.readouterr().out
    assert "em" in table and "search" in table and "3 held-out tasks" in table


def _bad_input(args: list[str], tmp_path, capsys) -> str:
    out = tmp_path / "never"
    code = main(["eval", "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert not out.exists(), "bad input must not write anything"
    assert len(err) >= 1 and err[-1].startswith("ponder eval: error: ")
    return err[-1]


def test_unknown_recipe_key(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  sampling:\n    temprature: 0.5\n")
    message = _bad_input(["--recipe", str(recipe), "--model", "tiny"], tmp_path, capsys)
    assert str(recipe) in message and "rollout.sampling.temprature" in message


def test_missing_model_path(tmp_path, capsys):
    message = _bad_input(["--model", str(tmp_path / "no-such-model")], tmp_path, capsys)
    assert "no-such-model" in message


def test_garbage_model_config_is_an_input_error(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "hidden_size": "banana"}')
    message = _bad_input(["--model", str(model)], tmp_path, capsys)  # exit 2, not "internal error"
    assert str(model / "config.json") in message and "hidden_size" in message


def test_corrupt_corpus_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d1", "contents": "Paris is in France."}\n{"id": "d2", "contents": \n')
    message = _bad_input(["--model", "tiny", f"env.options.corpus={corpus}"], tmp_path, capsys)
    assert f"{corpus}:2" in message


def test_empty_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n")
    message = _bad_input(["--model", "tiny", f"env.options.corpus={corpus}"], tmp_path, capsys)
    assert str(corpus) in message and "empty" in message


def test_question_without_gold_answer(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "q1", "question": "Where?", "answers": ["Paris"]}\n{"id": "q2", "question": "Who?", "answers": []}\n'
    )
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d1", "contents": "Paris is in France."}\n')
    message = _bad_input(["--model", "tiny", f"env.options.tasks={tasks}", f"env.options.corpus={corpus}"], tmp_path, capsys)
    assert f"{tasks}:2" in message and "q2" in message


def test_console_script_help_lists_commands():
    result = subprocess.run(
        [sys.executable, "-m", "ponder.cli", "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    for command in ("eval", "serve-retriever", "gen-tasks"):
        assert command in result.stdout


def test_bad_input_exit_code_from_a_real_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ponder.cli", "eval", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("ponder eval: error: model")
    assert not (tmp_path / "o").exists()


def test_gen_tasks_writes_loadable_files(tmp_path):
    from ponder.envs.taskfile import load_tasks
    from ponder.tools.retrieval import load_corpus

    assert main(["gen-tasks", "--out", str(tmp_path), "env.options.taskgen.n_train=10", "env.options.taskgen.n_eval=5"]) == 0
    assert len(load_tasks(tmp_path / "eval.jsonl")) == 5
    assert len(load_tasks(tmp_path / "train.jsonl")) == 10
    assert len(load_corpus(tmp_path / "corpus.jsonl")) > 10


def test_eval_runs_the_held_out_evaluation_of_the_demo(tmp_path):
    """One episode per task at eval.temperature, eval.batch_size at a time, whatever the
    recipe's RL group size: the episodes the demo and the trainers score, token for token."""
    from ponder.config import load_recipe
    from ponder.eval import evaluate, held_out_recipe

    overrides = [*TINY[2:], "rollout.group_size=4", "rollout.batch_size=8", "eval.batch_size=3", "eval.temperature=1.0"]
    out = tmp_path / "run"
    assert main(["eval", "--model", "tiny", "--episodes", "4", "--out", str(out), *overrides]) == 0
    mine = load_trajectories(out / "trajectories.parquet")
    recipe = load_recipe(None, [*overrides, "model.name=tiny"])
    theirs = evaluate(held_out_recipe(recipe, 4)).trajectories
    assert len(mine) == 4 == len({t.task_id for t in mine})
    assert [t.task_id for t in mine] == [t.task_id for t in theirs]
    assert [t.response_ids for t in mine] == [t.response_ids for t in theirs]


def test_eval_samples_k_episodes_per_task(tmp_path):
    out = tmp_path / "run"
    assert main(["eval", "--model", "tiny", "--episodes", "2", "--samples", "3", "--out", str(out), *TINY[2:]]) == 0
    trajectories = load_trajectories(out / "trajectories.parquet")
    counts = {task: sum(t.task_id == task for t in trajectories) for task in {t.task_id for t in trajectories}}
    assert list(counts.values()) == [3, 3]


def test_eval_refuses_zero_samples(tmp_path, capsys):
    message = _bad_input(["--model", "tiny", "--samples", "0"], tmp_path, capsys)
    assert "--samples must be at least 1, got 0" in message


def test_eval_split_train_runs_the_training_tasks(tmp_path):
    from ponder.config import load_recipe
    from ponder.wiring import build_env

    out = tmp_path / "run"
    overrides = [*TINY[2:], "env.options.taskgen.n_train=6", "eval.split=train"]
    assert main(["eval", "--model", "tiny", "--episodes", "3", "--out", str(out), *overrides]) == 0
    spec = build_env(load_recipe(None, overrides))
    evaluated = [t.task_id for t in load_trajectories(out / "trajectories.parquet")]
    assert evaluated == [t.id for t in spec.train[:3]]
    assert not set(evaluated) & {t.id for t in spec.eval}


def test_eval_refuses_an_unknown_split(tmp_path, capsys):
    message = _bad_input(["--model", "tiny", "eval.split=test"], tmp_path, capsys)
    assert "eval.split: unknown 'test'; valid: eval, train" in message
