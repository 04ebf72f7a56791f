"""The same recipe and seed give bit-identical runs: `ponder train`, `ponder demo` and
`ponder pipeline run` twice on the tiny model, compared weight by weight and metric
by metric (wall-clock timings aside). And a resumed run refuses a changed recipe."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from ponder.cli import main

TINY = [
    "model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
    "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "train.save_every=1", "lora.r=4",
]  # fmt: skip
PIPELINE = [
    "model.name=tiny", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12", "env.options.taskgen.n_eval=4",
    "env.max_turns=2", "env.options.max_obs_tokens=32", "rollout.batch_size=8", "rollout.sampling.max_new_tokens_per_turn=8",
    "eval.episodes=2", "sft.steps=2", "sft.batch_size=2", "sft.examples=4",
    "sft_trainer.steps=2", "sft_trainer.batch_size=2", "sft_trainer.micro_batch_size=1", "data.max_examples=4",
    "train.steps=2", "train.tasks_per_step=2", "rollout.group_size=2", "algo.micro_batch_size=2",
    "lora.r=4", "lora.alpha=8", "pipeline.stages=[warmup, sft, rl, eval]",
]  # fmt: skip

TIMING = ("time/", "wall_s", "timing_s", "tokens_per_s", "generation_s", "env_s", "_s", "memory/")


def _untimed(value):
    """A JSON value without wall-clock fields (they differ between any two runs)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "time" and not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _weights(run: Path) -> dict[str, dict]:
    """Every adapter the run saved, by path relative to the run."""
    return {str(p.relative_to(run)): load_file(p) for p in sorted(run.rglob("adapter_model.safetensors"))}


def _metrics(run: Path) -> dict[str, list]:
    return {str(p.relative_to(run)): [_untimed(json.loads(line)) for line in p.read_text().splitlines()]
            for p in sorted(run.rglob("metrics.jsonl"))}  # fmt: skip


def _assert_identical(first: Path, second: Path) -> None:
    one, two = _weights(first), _weights(second)
    assert one and one.keys() == two.keys()
    for name in one:
        assert one[name].keys() == two[name].keys()
        for key in one[name]:
            assert one[name][key].equal(two[name][key]), f"{name}:{key} differs"
    assert _metrics(first) == _metrics(second) and _metrics(first)


def test_two_train_runs_are_bit_identical(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(run), *TINY]) == 0
    _assert_identical(*runs)


def test_two_demo_runs_are_bit_identical(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert main(["demo", "--quick", "--out", str(run), *TINY, "eval.episodes=2"]) == 0
    _assert_identical(*runs)
    results = [_untimed(json.loads((run / "results.json").read_text())) for run in runs]
    assert results[0] == results[1]


def test_two_pipeline_runs_are_bit_identical(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert main(["pipeline", "run", "recipes/pipeline_search_qa.yaml", "--out", str(run), *PIPELINE]) == 0
    _assert_identical(*runs)
    reports = [[_untimed(json.loads(p.read_text())) for p in sorted(run.glob("*/done.json"))] for run in runs]
    assert len(reports[0]) == 5 and reports[0] == reports[1]


def test_resume_refuses_a_changed_recipe_unless_allowed(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(run), *TINY]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.steps=3", "optim.lr=0.001"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--resume with a changed recipe: optim.lr: 1e-05 -> 0.001" in line or "optim.lr" in line
    assert "--allow-recipe-change" in line
    assert main(["train", "--resume", str(run), "train.steps=3", "optim.lr=0.001", "--allow-recipe-change"]) == 0


def test_a_bad_reward_fails_before_the_warm_up_writes_anything(tmp_path, capsys):
    out = tmp_path / "train"
    code = main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(out), *TINY,
                 "reward.terms={'no_such_pkg.rewards:f': 1.0}"])  # fmt: skip
    assert code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("ponder train: error: reward 'no_such_pkg.rewards:f': cannot import no_such_pkg.rewards")
    assert not out.exists()


def test_a_bad_task_file_leaves_no_half_made_run_directory(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n{"id": "b"}\n')
    for command in (["train", "--recipe", "recipes/search_qa_grpo.yaml"], ["demo", "--quick"]):
        out = tmp_path / command[0]
        code = main([*command, "--out", str(out), *TINY, f"env.train_tasks={tasks}", f"env.eval_tasks={tasks}"])
        assert code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"{tasks}:2: task 'b' has no 'question'")
        assert not out.exists()


def test_an_internal_error_is_one_line_with_the_traceback_in_a_file(tmp_path, capsys, monkeypatch):
    import ponder.cli.core

    def broken(args):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(ponder.cli.core, "cmd_plot", broken)
    monkeypatch.setenv("PONDER_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("PONDER_DEBUG", raising=False)
    assert main(["plot", str(tmp_path)]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("ponder plot: internal error: TypeError: unsupported operand (traceback in ")
    written = next(tmp_path.glob("plot-*.txt")).read_text()
    assert "Traceback" in written and 'raise TypeError("unsupported operand")' in written
