"""The staged pipeline with the tiny model: every stage runs, a finished stage is
skipped on re-run, an interrupted stage resumes to the weights of an uninterrupted
run; preference sampling keeps only best > worst pairs."""

import json
import shutil
from dataclasses import replace

import pytest
import torch

from ponder.config import PipelineRecipe, load_recipe
from ponder.data import write_jsonl
from ponder.data.records import PreferencePair
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions
from ponder.models import tiny_policy
from ponder.models.adapters import saved_weights
from ponder.rewards.agent import AgentReward
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.retrieval import build_retriever
from ponder.train.dpo import best_worst_pairs, sample_preferences
from ponder.jobs.pipeline import check_pipeline, run_pipeline

TINY = [
    "model.name=tiny",
    "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12", "env.options.taskgen.n_eval=4",
    "env.max_turns=2", "env.options.max_obs_tokens=32", "env.options.retriever.topk=1",
    "rollout.batch_size=8", "rollout.sampling.max_new_tokens_per_turn=8", "rollout.sampling.max_total_tokens=1024",
    "eval.episodes=2", "eval.temperature=0",
    "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "sft.behaviour=search_once",
    "sft_trainer.steps=2", "sft_trainer.batch_size=2", "sft_trainer.micro_batch_size=1", "sft_trainer.save_every=1",
    "data.max_examples=4", "data.eval_fraction=0.25",
    "selection.strategy=diversity", "selection.target_size=2", "selection.embedder=hashing",
    "continual.replay_capacity=4", "continual.ewc_lambda=1.0", "continual.fisher_examples=2",
    "dpo.steps=2", "dpo.batch_size=2", "dpo.micro_batch_size=2", "dpo.save_every=1",
    "lora.r=4", "lora.alpha=8", "algo.micro_batch_size=2",
    "pipeline.stages=[warmup, sft, dpo, eval]",
]  # fmt: skip


@pytest.fixture(scope="module")
def preference_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefs") / "prefs.jsonl"
    prompt = [{"role": "user", "content": "In which city was Ann born?"}]
    pairs = [
        PreferencePair(prompt, [{"role": "assistant", "content": "<answer>Oslo</answer>"}],
                       [{"role": "assistant", "content": "<answer>no idea</answer>"}], id=f"p{i}")
        for i in range(3)
    ]  # fmt: skip
    write_jsonl(path, pairs)
    return path


def _recipe(extra=()):
    return load_recipe(None, TINY + list(extra), cls=PipelineRecipe)


def test_pipeline_runs_skips_and_resumes(tmp_path, preference_file):
    recipe = _recipe([f"data.preference_path={preference_file}"])
    said = []
    stages = run_pipeline(recipe, tmp_path, say=said.append)
    assert [name for name, _ in stages] == ["base", "warmup", "sft", "dpo"]
    for _, metrics in stages:
        assert {"tool_selection_acc", "plan_success", "step_efficiency", "success", "agent_reward"} <= set(
            metrics
        )
    sft_report = json.loads((tmp_path / "02-sft" / "done.json").read_text())
    assert sft_report["selection"]["kept"] == 2 and sft_report["last"]["sft/replayed"] == 1.0
    assert sft_report["last"]["sft/ewc_penalty"] >= 0.0 and "sft/eval_loss" in sft_report["last"]
    assert "| dpo |" in (tmp_path / "04-eval" / "table.md").read_text()
    # the warm-up's examples and the DPO pairs are data others can read: TRL's formats
    import datasets

    examples = datasets.load_dataset("json", data_files=str(tmp_path / "01-warmup" / "examples.jsonl"))["train"]
    assert examples[0]["messages"][0]["role"] == "system" and examples[0]["messages"][-1]["role"] == "assistant"
    pairs = datasets.load_dataset("json", data_files=str(tmp_path / "03-dpo" / "pairs.jsonl"))["train"]
    assert {"prompt", "chosen", "rejected"} <= set(pairs.column_names) and len(pairs) > 0
    assert not list(tmp_path.glob("*/*.pt"))  # no pickles besides checkpoints' resume state
    uninterrupted = saved_weights(tmp_path / "02-sft")

    # Re-run: every stage is skipped.
    said.clear()
    assert [n for n, _ in run_pipeline(recipe, tmp_path, say=said.append)] == ["base", "warmup", "sft", "dpo"]
    assert all(line.endswith("done, skipped") for line in said)

    # Interrupt the SFT stage after step 1: drop its marker, weights and later stages.
    (tmp_path / "02-sft" / "done.json").unlink()
    (tmp_path / "02-sft" / "ponder.json").unlink()
    (tmp_path / "02-sft" / "adapter_model.safetensors").unlink()
    (tmp_path / "02-sft" / "checkpoints" / "latest").write_text("step-000001\n")
    for later in ("03-dpo", "04-eval"):
        shutil.rmtree(tmp_path / later)
    run_pipeline(recipe, tmp_path, say=said.append)
    resumed = json.loads((tmp_path / "02-sft" / "done.json").read_text())
    assert resumed["resumed_from"] == 1
    again = saved_weights(tmp_path / "02-sft")
    assert again.keys() == uninterrupted.keys()
    assert all(torch.allclose(again[k], uninterrupted[k], atol=1e-6) for k in again)


def test_bad_stage_lists_fail_before_loading_anything():
    with pytest.raises(ValueError, match="unknown \\['ppo'\\]"):
        check_pipeline(_recipe(["pipeline.stages=[sft, ppo]"]))
    with pytest.raises(ValueError, match="choose `dpo` or `rl`"):
        check_pipeline(_recipe(["pipeline.stages=[dpo, rl]"]))
    for override, message in [
        ("data.tool_style=chatml", "data.tool_style: unknown tool style 'chatml'; valid: hermes, inline, template"),
        ("selection.strategy=best",
         "selection.strategy: unknown selection strategy 'best'; valid: diversity, hybrid, loss_topk, none, random"),
        ("dpo.loss=kto", "dpo.loss: unknown preference loss 'kto'; valid: hinge, ipo, sigmoid"),
    ]:  # fmt: skip
        with pytest.raises(ValueError) as err:
            check_pipeline(_recipe([override]))
        assert str(err.value) == message


def test_sampled_preferences_keep_best_over_worst_only():
    recipe = _recipe()
    data = load_search_qa(SearchQAOptions.from_recipe(recipe))
    task = next(t for t in data.train if t.kind == "single_hop")
    tied = next(t for t in data.train if t.kind == "in_prompt")
    policy = tiny_policy()
    answer = task.oracle_actions[-1].split("<answer>")[1].split("</answer>")[0]
    scripts = {
        f"{task.id}#0": task.oracle_actions,
        f"{task.id}#1": ["<answer>wrong</answer>"],
        f"{tied.id}#0": ["<answer>x</answer>"],
        f"{tied.id}#1": ["<answer>x</answer>"],
    }
    factory = SearchQAEnvFactory.from_recipe(recipe, build_retriever("bm25", data.corpus), policy.tokenizer)

    def engine_for(samples):
        sampling = replace(recipe.rollout.sampling, max_new_tokens_per_turn=256)  # replay whole actions
        rollout = replace(recipe.rollout, batch_size=4, group_size=samples, sampling=sampling)
        return RolloutEngine(ScriptedBackend(policy.tokenizer, scripts), factory, rollout)

    reward = AgentReward.from_config(recipe.agent_reward)
    pairs, report = sample_preferences(
        policy, [task, tied], engine_for, reward, recipe.dpo.__class__(samples_per_prompt=2)
    )
    assert report["pairs"] == 1 and report["skipped"] == {"tied groups": 1}
    best, worst = pairs[0]
    assert best.final_answer == answer and worst.final_answer == "wrong" and best.reward > worst.reward
    assert best_worst_pairs([worst, worst]) == []


def test_rl_stage_trains_with_the_agent_reward(tmp_path):
    extra = ["pipeline.stages=[rl]", "pipeline.eval_before=false", "pipeline.eval_each=false", "train.steps=1",
             "train.tasks_per_step=2", "rollout.group_size=2", "train.save_every=1"]  # fmt: skip
    stages = run_pipeline(_recipe(extra), tmp_path, say=lambda _: None)
    assert stages == []  # no evaluation asked for
    report = json.loads((tmp_path / "00-rl" / "done.json").read_text())
    assert report == {"resumed_from": 0, "steps": 1, "wall_s": report["wall_s"]}
    logged = json.loads((tmp_path / "00-rl" / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/mean" in logged or any(key.startswith("reward") for key in logged)
    assert (tmp_path / "00-rl" / "adapter_model.safetensors").is_file()
