"""`ponder warmup`: one SFT warm-up for several recipes, on the tiny model (math and
search-QA), and an RL run (`ponder demo --sft-from`) that starts from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from ponder.cli import main
from ponder.config import load_recipe, to_dict
from ponder.models.adapters import saved_weights
from ponder.jobs.demo import load_sft_run, run_demo
from ponder.jobs.shared_warmup import shared_sft

from .test_demo import TINY as QA

MATH = ["model.name=tiny", "env.kind=math", "env.max_turns=1", "env.options={n_train: 8, n_eval: 2, seed: 1}",
        "rollout.sampling.max_new_tokens_per_turn=64", "rollout.batch_size=8", "lora.r=4", "sft.steps=3",
        "sft.batch_size=2", "sft.examples=4", "algo.micro_batch_size=2"]  # fmt: skip


def _write(path: Path, overrides: list[str]) -> str:
    path.write_text(yaml.safe_dump(to_dict(load_recipe(None, overrides))))
    return str(path)


def test_shared_sft_sums_the_steps_and_names_a_disagreeing_key(tmp_path):
    where = {"qa": "qa.yaml", "math": "math.yaml"}
    recipes = {"qa": load_recipe(None, QA), "math": load_recipe(None, MATH)}
    config = shared_sft(recipes, where)
    assert (config.steps, config.batch_size, config.lr) == (2 + 3, 2, recipes["qa"].sft.lr)
    recipes["math"].sft.lr = 1e-3
    with pytest.raises(ValueError, match=r"math\.yaml: key 'sft\.lr'"):
        shared_sft(recipes, where)
    recipes["math"] = load_recipe(None, [*MATH, "lora.base_matmul_dtype=bfloat16"])
    assert shared_sft(recipes, where).steps == 5  # a precision, not the adapter: the first recipe's is used
    recipes["math"] = load_recipe(None, [*MATH, "lora.r=8"])
    with pytest.raises(ValueError, match=r"math\.yaml: section 'lora'"):
        shared_sft(recipes, where)


def test_warmup_trains_one_adapter_that_each_recipe_starts_rl_from(tmp_path):
    recipes = [_write(tmp_path / "qa.yaml", QA), _write(tmp_path / "math.yaml", MATH)]
    out = tmp_path / "shared"
    assert main(["warmup", "--recipe", recipes[0], "--recipe", recipes[1], "--out", str(out)]) == 0
    summary = json.loads((out / "warmup.json").read_text())
    assert summary["sft"]["steps"] == 5 and summary["micro_batch_size"] == 2
    assert summary["demonstrations"]["qa"] == 4 and summary["demonstrations"]["math"] > 0
    lines = (out / "sft" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5]
    shared = saved_weights(out / "sft")
    assert any(bool(v.any()) for k, v in shared.items() if "lora_B" in k)  # trained: a fresh B is zero
    for name in ("qa", "math"):
        copied = saved_weights(out / name / "sft")
        assert all(torch.equal(copied[k], shared[k]) for k in shared)
        as_run = load_recipe(out / name / "recipe.yaml")
        assert (as_run.sft.steps, as_run.env.kind) == (5, "search_qa" if name == "qa" else "math")
    # RL from the shared warm-up: its evaluations run again (it has none), RL continues its adapter
    qa = load_recipe(out / "qa" / "recipe.yaml")
    rl = run_demo(qa, tmp_path / "rl", say=lambda _: None, sft_from=out / "qa")
    assert set(rl["stages"]) == {"oracle", "base", "sft", "rl"} and rl["sft_from"] == str(out / "qa")
    assert "sft" not in rl["timing_s"]  # not trained again
    # a run from that RL run's warm-up finds the weights its --sft-from pointed to
    assert load_sft_run(tmp_path / "rl", qa).weights == out / "qa" / "sft"
    after = saved_weights(tmp_path / "rl" / "rl" / "checkpoints" / "step-000001")
    assert set(after) == set(shared)
    for key in (k for k in shared if "lora_B" in k):  # near the warm-up's B, far from a fresh (zero) B
        assert (after[key] - shared[key]).abs().max() < shared[key].abs().max() / 2


def test_bad_warmup_input_is_one_line_and_leaves_nothing(tmp_path, capsys):
    qa = _write(tmp_path / "qa.yaml", QA)
    out = tmp_path / "shared"
    assert main(["warmup", "--recipe", qa, "--out", str(out)]) == 2
    assert "two or more" in capsys.readouterr().err
    other = _write(tmp_path / "math.yaml", [*MATH, "sft.batch_size=4"])
    assert main(["warmup", "--recipe", qa, "--recipe", other, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "math.yaml" in err and "sft.batch_size" in err
    assert not out.exists()
