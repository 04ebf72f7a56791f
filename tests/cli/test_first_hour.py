"""A new user's first hour (issue 20): what ponder trains runs everywhere, runs are
never silently mixed, and commands do what they say. Tiny model throughout."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ponder.cli import main, parse_args
from ponder.config import load_recipe
from ponder.models import load_policy, tiny_policy
from ponder.models.adapters import find_trained
from ponder.types import load_trajectories

TINY = [
    "model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
    "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "train.save_every=1", "lora.r=4",
]  # fmt: skip
GRPO = "recipes/search_qa_grpo.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("first-hour") / "run"
    assert main(["train", "--recipe", GRPO, "--out", str(run_dir), *TINY]) == 0
    return run_dir


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(1, 9).unsqueeze(0)).logits


def _error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_every_saved_adapter_loads_with_peft(run):
    from peft import PeftModel

    merged = load_policy(str(run))  # the run directory stands for its latest checkpoint
    assert find_trained(run) == run / "checkpoints" / "step-000002"
    for directory in (run / "sft", run / "checkpoints" / "step-000002"):
        assert (directory / "adapter_config.json").is_file()
        peft_model = PeftModel.from_pretrained(tiny_policy().model, str(directory))
        ours = load_policy(str(directory))
        assert torch.allclose(_logits(peft_model), _logits(ours.model), atol=1e-5)
    # training moved the weights: the run is not the base model
    assert not torch.allclose(_logits(merged.model), _logits(tiny_policy().model), atol=1e-4)


def test_export_writes_a_standalone_model_and_an_adapter(run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    expected = _logits(load_policy(str(run)).model)
    assert main(["export", str(run), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    standalone = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(_logits(standalone), expected, atol=1e-5)
    assert main(["export", str(run), "--out", str(tmp_path / "adapter")]) == 0
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    adapted = PeftModel.from_pretrained(tiny_policy().model, str(tmp_path / "adapter"))
    assert torch.allclose(_logits(adapted), expected, atol=1e-5)
    assert main(["export", str(run), "--out", str(tmp_path / "adapter")]) == 2  # never over an export


def test_eval_and_train_start_from_a_run_directory(run, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run), "--episodes", "2", "--out", str(out), *TINY[8:11]]) == 0
    assert json.loads((out / "metrics.json").read_text())["model"] == str(run)
    again = tmp_path / "again"
    assert main(["train", "--recipe", GRPO, "--model", str(run), "--out", str(again), *TINY, "sft.steps=0"]) == 0
    manifest = json.loads((again / "checkpoints" / "step-000002" / "ponder.json").read_text())
    assert manifest["base_model"] == "tiny" and len(manifest["stack"]) == 1  # the first run's adapter beneath


def test_resume_without_a_checkpoint_fails(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty"), "train.steps=3"]) == 2
    assert "nothing to resume" in _error(capsys)
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_second_run_into_the_same_directory_is_refused(run, tmp_path, capsys):
    before = (run / "metrics.jsonl").read_text()
    assert main(["train", "--recipe", GRPO, "--out", str(run), *TINY]) == 2
    assert "already holds a run; pass --resume to continue it, --overwrite" in _error(capsys)
    assert (run / "metrics.jsonl").read_text() == before
    out = tmp_path / "eval"
    args = ["eval", "--model", "tiny", "--episodes", "1", "--out", str(out), *TINY[8:11]]
    assert main(args) == 0 and main(args) == 2
    assert main([*args, "--overwrite"]) == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["eval", "--model", "tiny", "--out", str(tmp_path / "mine"), "--overwrite"]) == 2
    assert "not a ponder run directory" in _error(capsys)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_pipeline_refuses_an_existing_run_unless_resumed(tmp_path, capsys):
    out = tmp_path / "p"
    out.mkdir()
    (out / "recipe.yaml").write_text("x: 1\n")
    args = ["pipeline", "run", "recipes/pipeline_search_qa.yaml", "--out", str(out), "model.name=tiny"]
    assert main(args) == 2
    assert "--resume to continue it" in _error(capsys)
    assert main([*args, "--resume"]) == 2  # a different recipe started it
    assert "different recipe" in _error(capsys)


def test_eval_temperature_zero_is_greedy(tmp_path):
    def actions(seed: int) -> list[str]:
        out = tmp_path / f"seed{seed}"
        args = ["eval", "--model", "tiny", "--episodes", "2", "--out", str(out), "eval.temperature=0",
                f"rollout.seed={seed}", "rollout.sampling.temperature=1.0", *TINY[7:11]]  # fmt: skip
        assert main(args) == 0
        return [turn.action for t in load_trajectories(out / "trajectories.parquet") for turn in t.turns]

    assert actions(0) == actions(1)


def test_overrides_are_taken_anywhere_on_the_line():
    args = parse_args(["pipeline", "run", "R.yaml", "--out", "D", "model.name=tiny", "--resume", "a.b=1"])
    assert (args.recipe, args.out, args.resume, args.overrides) == ("R.yaml", "D", True, ["model.name=tiny", "a.b=1"])
    with pytest.raises(SystemExit):
        parse_args(["eval", "--bogus"])


def test_hub_downloads_are_not_switched_off(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    main(["gain", "/nonexistent"])
    assert "HF_HUB_OFFLINE" not in os.environ


def test_shipped_recipes_resolve_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_recipe("recipes/demo.yaml").eval.episodes == 100
    assert load_recipe("search_qa_grpo.yaml").algo.advantage == "grpo"


def test_no_library_progress_bars_or_warnings(run, tmp_path):
    import subprocess
    import sys

    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--merge"]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ponder.cli", "eval", "--model", str(tmp_path / "hf"), "--episodes", "1",
               "--out", str(tmp_path / "e"), *TINY[8:11]]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]
    assert "Loading weights" not in done.stderr and "Warning" not in done.stderr, done.stderr[-1000:]
