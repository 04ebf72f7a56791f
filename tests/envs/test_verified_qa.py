"""The verified_qa environment: question → final answer from the user's own files
(ponder task file, verl Parquet, TRL dataset), verified by a chain of extractors and a
comparator; scripted replies through the real engine and reward; TRL-signature rewards
named in the recipe; bad options; one RL step of the tiny model."""

from __future__ import annotations

import json

import datasets
import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.verified_qa import INSTRUCTIONS, VerifiedQAEnv, opening_messages, verify_options
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import Task
from ponder.wiring import build_env, build_reward

ROWS = [
    {"question": "Mia has 7 pens and buys 5 more. How many pens does Mia have now?",
     "answer": "Total: 7 + 5 = 12.\n#### 12"},
    {"question": "What is 6 * 7?", "answer": "6 * 7 = 42.\n#### 42"},
]  # fmt: skip
GSM = ["env.kind=verified_qa", "env.columns={answers: answer, oracle_actions: answer}",
       "env.options={extract: gsm8k, gold_extract: gsm8k, compare: numeric}"]  # fmt: skip


@pytest.fixture
def gsm_file(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _run(spec, reward, replies):
    """Each task's scripted reply through the engine, scored by the recipe's reward."""
    tasks = spec.train
    backend = ScriptedBackend(tiny_tokenizer(), {task.id: [reply] for task, reply in zip(tasks, replies)})
    rollout = RolloutConfig(group_size=1, batch_size=4, sampling=SamplingConfig(max_new_tokens_per_turn=256))
    trajectories, _ = RolloutEngine(backend, spec.factory, rollout).run(tasks)
    score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
    return trajectories


def test_a_gsm8k_style_file_trains_through_the_verifier(gsm_file):
    recipe = load_recipe(None, [*GSM, f"env.train_tasks={gsm_file}"])
    spec = build_env(recipe)
    reward = build_reward(recipe, spec)
    assert reward.weights == {"correct": 1.0, "extracted": 0.0}
    assert [t.id for t in spec.train] == ["gsm-0", "gsm-1"] and spec.train[0].oracle_actions == [ROWS[0]["answer"]]
    env = spec.factory()
    assert env.reset(spec.train[0]).messages == [{"role": "system", "content": INSTRUCTIONS["gsm8k"]},
                                                 {"role": "user", "content": ROWS[0]["question"]}]  # fmt: skip
    # the oracle (the file's own solutions), a wrong answer, and no answer at all
    oracle = _run(spec, reward, [t.oracle_actions[0] for t in spec.train])
    assert [(t.reward, t.final_answer, t.stop_reason) for t in oracle] == [(1.0, "12", "answer"), (1.0, "42", "answer")]
    wrong = _run(spec, reward, ["7 + 5 = 13\n#### 13", "I do not know."])
    assert [(t.reward, t.breakdown["extracted"], t.stop_reason) for t in wrong] == [(0.0, 1.0, "answer"),
                                                                                    (0.0, 0.0, "done")]  # fmt: skip


def test_a_verl_parquet_file_opens_with_its_own_prompt(tmp_path):
    prompt = [{"role": "user", "content": "What is 6 * 7? Let's think step by step and output the final answer "
                                          "after \"####\"."}]  # fmt: skip
    rows = [{"data_source": "mine", "prompt": prompt, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "42"}, "extra_info": {"split": "train", "index": 0}}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    recipe = load_recipe(None, ["env.kind=verified_qa", f"env.train_tasks={tmp_path / 'train.parquet'}"])
    spec = build_env(recipe)
    assert spec.factory().reset(spec.train[0]).messages == prompt
    (episode,) = _run(spec, build_reward(recipe, spec), ["6 * 7 = 42\n#### 42"])
    assert episode.reward == 1.0 and episode.task_id == "train-0"


TRL_REWARDS = '''
def ends_with_solution(prompts, completions, solution, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip().endswith(s) else 0.0 for t, s in zip(texts, solution)]

def short(prompts, completions, **kwargs):
    return [0.5 if len(c) < 20 else 0.0 for c in completions]
'''


def test_trl_reward_functions_named_in_the_recipe(tmp_path, monkeypatch):
    (tmp_path / "my_trl_rewards.py").write_text(TRL_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": "What is 6 * 7?", "solution": "42"}, {"prompt": "What is 2 + 3?", "solution": "5"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "prompts.parquet"))
    funcs = "[my_trl_rewards:ends_with_solution, my_trl_rewards:short]"
    recipe = load_recipe(None, ["env.kind=verified_qa", f"env.train_tasks={tmp_path / 'prompts.parquet'}",
                                "env.columns={answers: solution}", f"env.options={{reward_funcs: {funcs}}}"])  # fmt: skip
    spec = build_env(recipe)
    reward = build_reward(recipe, spec)
    assert reward.weights == {"correct": 0.0, "extracted": 0.0, "ends_with_solution": 1.0, "short": 1.0}
    episodes = _run(spec, reward, ["So it is 42", "The sum of two and three is 6"])
    assert [t.reward for t in episodes] == [1.5, 0.0]
    assert [t.breakdown["correct"] for t in episodes] == [1.0, 0.0]  # the verifier is still logged


def test_openings_from_options_and_from_the_task():
    task = Task("t", "2+2?", ["4"], context="Some facts.")
    assert opening_messages(task, "", "{context}\n{question}") == [{"role": "user", "content": "Some facts.\n2+2?"}]
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert opening_messages(Task("t", "2+2?", ["4"], metadata={"messages": own}), "ignored", "{question}") == own
    env = VerifiedQAEnv()
    env.reset(task)
    observation, done, info = env.step("so \\boxed{4}")
    assert (observation, done, info["stop_reason"], info["turn"].answer) == (None, True, "answer", "4")
    assert env.stop_strings == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"extrct": "boxed"}, "env.options for verified_qa: unknown ['extrct']"),
        ({"extract": "boxd"}, "env.options.extract: unknown answer extractor 'boxd'"),
        ({"compare": "fuzzy"}, "env.options.compare: unknown answer comparator 'fuzzy'"),
        ({"extract": "regex"}, "the regex extractor needs a pattern"),
        ({"extract": "regex", "pattern": "(unclosed"}, "not a regular expression"),
        ({"extract": []}, "an extractor chain is a name or a list of names"),
        ({"tolerance": -1}, "tolerance for verified_qa: want >= 0"),
    ],
)
def test_bad_options_fail_when_the_env_is_built(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        verify_options(options)


def test_no_task_files_or_a_bad_template_is_refused(gsm_file):
    with pytest.raises(ValueError, match="env.kind verified_qa: give env.train_tasks and/or env.eval_tasks"):
        build_env(load_recipe(None, ["env.kind=verified_qa"]))
    with pytest.raises(ValueError, match="only {question} and {context} may be filled in"):
        build_env(load_recipe(None, [*GSM, f"env.train_tasks={gsm_file}", "env.options={template: '{q}'}"]))


def test_one_rl_step_of_the_tiny_model_on_verified_qa(gsm_file, tmp_path):
    from ponder.jobs.parts import rl_trainer
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe(None, [
        *GSM, "model.name=tiny", f"env.train_tasks={gsm_file}", f"env.eval_tasks={gsm_file}", "train.steps=1",
        "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2",
    ])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path / "run")
    trainer.train()
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1
    assert 0.0 <= record["reward/correct"] <= 1.0 and record["reward/mean"] == pytest.approx(record["reward/correct"])
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
