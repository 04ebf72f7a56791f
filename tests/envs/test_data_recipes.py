"""The data guide's examples and recipes: examples/data/write_files.py writes one task
set in three layouts (GSM8K-style JSONL, verl Parquet, TRL prompts); the three
verified_qa recipes read the same tasks from them, their oracles reach the ceiling
through the real engine and reward (the TRL-signature reward included), and each runs
one RL step of the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.wiring import build_env, build_reward

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"verified_qa": "gsm8k_style/{split}.jsonl", "verified_qa_verl": "verl/{split}.parquet",
           "verified_qa_trl": "trl/{split}.parquet"}  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory, example_script):
    out = tmp_path_factory.mktemp("data")
    written = example_script("data/write_files.py").write_files(out, seed=0, n_train=12, n_eval=6)
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(
        layout.format(split=split) for layout in RECIPES.values() for split in ("train", "eval"))
    return out


def _recipe(name, files, *overrides):
    paths = [f"env.{split}_tasks={files / RECIPES[name].format(split=split)}" for split in ("train", "eval")]
    return load_recipe(f"recipes/{name}.yaml", [*paths, *overrides])


def test_the_three_layouts_hold_the_same_tasks(files, monkeypatch):
    monkeypatch.chdir(ROOT)  # the TRL recipe's reward is found by import path from here
    seen = {}
    for name in RECIPES:
        spec = build_env(_recipe(name, files))
        env = spec.factory()
        seen[name] = [[(t.id, env.reset(t).messages, t.kind, t.oracle_actions) for t in split]
                      for split in (spec.train, spec.eval)]  # fmt: skip
    assert seen["verified_qa"] == seen["verified_qa_verl"] == seen["verified_qa_trl"]
    assert [len(split) for split in seen["verified_qa"]] == [12, 6]
    assert [t[0] for t in seen["verified_qa"][1]] == [f"eval-{i}" for i in range(6)]  # ids pair across runs


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipes_oracle_reaches_the_ceiling_and_a_wrong_answer_scores_zero(name, files, monkeypatch):
    monkeypatch.chdir(ROOT)
    recipe = _recipe(name, files)
    spec = build_env(recipe)
    reward = build_reward(recipe, spec)
    rollout = RolloutConfig(group_size=1, batch_size=6, sampling=SamplingConfig(max_new_tokens_per_turn=256))

    def rewards(replies):
        backend = ScriptedBackend(tiny_tokenizer(), {task.id: [replies(task)] for task in spec.eval})
        trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(spec.eval)
        score_trajectories(trajectories, {t.id: t for t in spec.eval}, reward)
        return [t.reward for t in trajectories]

    assert rewards(lambda task: task.oracle_actions[0]) == [1.0] * 6
    assert rewards(lambda task: "I think it is\n#### 100000") == [0.0] * 6


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_one_rl_step_of_the_tiny_model_on_each_recipe(name, files, tmp_path, monkeypatch):
    from ponder.jobs.parts import rl_trainer
    from ponder.runlog.metrics_log import read_metrics

    monkeypatch.chdir(ROOT)
    recipe = _recipe(name, files, "model.name=tiny", "train.steps=1", "train.tasks_per_step=2", "train.val_tasks=0",
                     "train.eval_every=0", "rollout.group_size=2", "rollout.batch_size=4",
                     "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2")  # fmt: skip
    rl_trainer(recipe, tmp_path).train()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1 and 0.0 <= record["reward/mean"] <= 1.0
    paid = "reward/gsm8k_accuracy" if name == "verified_qa_trl" else "reward/correct"
    assert record["reward/mean"] == pytest.approx(record[paid])


def test_the_demo_runs_on_a_recipe_and_its_episodes_export(files, tmp_path, monkeypatch):
    """base -> SFT -> RL through `ponder demo`'s own flow on the tiny model, then the
    run's episodes out as TRL conversations: the data guide's commands, small."""
    import datasets

    from ponder.jobs.demo import run_demo
    from ponder.jobs.export_data import export_data

    monkeypatch.chdir(ROOT)
    recipe = _recipe("verified_qa_trl", files, "model.name=tiny", "rollout.group_size=2", "rollout.batch_size=6",
                     "rollout.sampling.max_new_tokens_per_turn=64", "lora.r=4", "sft.steps=2", "sft.batch_size=2",
                     "sft.examples=4", "train.steps=1", "train.tasks_per_step=2", "train.val_tasks=0",
                     "train.eval_every=0", "train.save_every=1", "algo.micro_batch_size=4", "eval.episodes=6")  # fmt: skip
    results = run_demo(recipe, tmp_path / "demo", say=lambda _: None)
    assert set(results["stages"]) >= {"oracle", "base", "sft", "rl"}
    oracle = results["stages"]["oracle"]  # the file's solutions replayed: the ceiling
    assert oracle["reward"] == oracle["components"]["gsm8k_accuracy"] == oracle["components"]["correct"] == 1.0
    out = tmp_path / "oracle.parquet"
    rows = export_data(str(tmp_path / "demo"), "trl-messages", str(out), min_reward=1.0)
    exported = datasets.load_dataset("parquet", data_files=str(out), split="train").to_list()
    assert len(exported) == rows >= 6 and all(row["messages"][-1]["role"] == "assistant" for row in exported)
