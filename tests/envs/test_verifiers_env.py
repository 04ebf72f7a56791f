"""env.kind verifiers on environments written with verifiers' own SDK (examples/envs):
the dataset becomes the tasks, verifiers' rollout loop runs with ponder's actions, the
rubric's scores are the reward, and one RL step trains on it."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("verifiers")

from ponder.config import EnvConfig, Recipe, RolloutConfig, SamplingConfig, load_recipe  # noqa: E402
from ponder.config.load import ConfigError  # noqa: E402
from ponder.envs.verifiers_env import INSTALL  # noqa: E402
from ponder.extras import MissingExtra  # noqa: E402
from ponder.models import tiny_tokenizer  # noqa: E402
from ponder.rewards import score_trajectories  # noqa: E402
from ponder.rollout import RolloutEngine, ScriptedBackend  # noqa: E402
from ponder.wiring import build_env, build_reward  # noqa: E402

ARITH = {"env_id": "examples.envs.verifiers_arith", "oracle": "<answer>{answer}</answer>"}
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "%s"}}</tool_call>'


def _built(options):
    recipe = Recipe(env=EnvConfig(kind="verifiers", options=options))
    tokenizer = tiny_tokenizer()
    return recipe, build_env(recipe, tokenizer), tokenizer


@pytest.fixture(scope="module")
def arith():
    recipe, spec, tokenizer = _built(ARITH)
    yield recipe, spec, tokenizer
    spec.close()


def test_the_dataset_and_rubric_become_tasks_and_reward_components(arith):
    _, spec, _ = arith
    assert len(spec.train) == 64 and len(spec.eval) == 16  # its dataset and eval_dataset
    assert not {t.question for t in spec.train} & {t.question for t in spec.eval}
    task = spec.train[0]
    assert task.id == "train-0" and task.question == "What is 14 * 8?" and task.answers == ["112"]
    assert task.oracle_actions == ["<answer>112</answer>"]
    assert task.metadata["verifiers"]["prompt"][1] == {"role": "user", "content": "What is 14 * 8?"}
    # the rubric's functions at the rubric's weights; SingleTurnEnv's turn count is a weight-0 metric
    assert spec.reward_weights == {"correct_answer": 1.0, "format_reward_func": 0.1, "num_turns": 0.0}


def test_rollouts_are_scored_by_the_rubric(arith):
    recipe, spec, tokenizer = arith
    tasks = spec.eval[:2]
    config = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=64))
    reward = build_reward(recipe, spec)

    def run(scripts):
        trajectories, _ = RolloutEngine(ScriptedBackend(tokenizer, scripts), spec.factory, config).run(tasks)
        score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
        return trajectories

    right = run({t.id: t.oracle_actions for t in tasks})
    wrong = run({t.id: ["The answer is 5."] for t in tasks})
    for trajectory in right:
        assert trajectory.stop_reason == "answer" and len(trajectory.turns) == 1
        assert trajectory.breakdown == {"correct_answer": 1.0, "format_reward_func": 1.0, "num_turns": 1.0}
        assert trajectory.reward == pytest.approx(1.1)
        assert trajectory.metrics["verifiers/reward"] == pytest.approx(1.1)  # verifiers' own total
    for trajectory in wrong:
        # no <answer> field: the XML parser's format score is its spacing credit alone, 0.2
        assert trajectory.breakdown["correct_answer"] == 0.0 and trajectory.breakdown["format_reward_func"] == 0.2
        assert trajectory.reward == pytest.approx(0.02)


def test_a_tool_env_answers_each_call_through_its_env_response():
    _, spec, tokenizer = _built({"env_id": "examples.envs.verifiers_calc", "env_args": {"max_turns": 4}})
    try:
        task = next(t for t in spec.train if t.question == "What is 6 + 3?")
        env = spec.factory()
        opening = env.reset(task)
        assert [tool.name for tool in opening.tools] == ["calculate"]
        assert "<tools>" in opening.messages[0]["content"] and opening.messages[1]["content"] == task.question
        observation, done, info = env.step(CALL % "6+3")
        assert not done and [c.name for c in info["turn"].tool_calls] == ["calculate"]
        # the tool's result, as the next chat turn of the tiny model's ChatML template
        assert observation == ("\n<|im_start|>tool\n<tool_response>\n9\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n")
        observation, done, info = env.step(CALL % "6/3")  # the tool raises: verifiers reports it to the model
        assert "only whole numbers" in observation and not done
        observation, done, info = env.step("<answer>9</answer>")
        assert done and observation is None and info["stop_reason"] == "answer"
        assert info["metrics"]["verifiers/correct_answer"] == 1.0
        assert info["metrics"]["verifiers/total_tool_calls"] == 2.0
        assert info["metrics"]["verifiers/calculate_calls"] == 2.0
        assert info["metrics"]["verifiers/num_turns"] == 3.0
        env.close()
        capped = spec.factory()  # the environment's own max_turns ends an episode that keeps calling
        capped.reset(task)
        for _ in range(3):
            assert not capped.step(CALL % "1+1")[1]
        assert capped.step(CALL % "1+1")[2]["stop_reason"] == "max_turns"
        cut = spec.factory()  # an episode ponder ends first is cancelled, never left waiting
        cut.reset(task)
        cut.close()
        assert cut.rollout.done()
    finally:
        spec.close()


def test_a_closed_factory_runs_episodes_again(arith):
    _, spec, _ = arith
    spec.factory()  # starts the event-loop thread
    spec.factory.close()  # as a trainer does when training ends
    env = spec.factory()  # the evaluation that follows
    env.reset(spec.eval[0])
    assert env.step(spec.eval[0].oracle_actions[0])[2]["metrics"]["verifiers/correct_answer"] == 1.0


def test_hostile_actions_never_raise(arith):
    _, spec, _ = arith
    for action in ["", "\udcff lone surrogate \x00 nul", "{" * 5000, "<answer></answer>" * 50]:
        env = spec.factory()
        env.reset(spec.eval[0])
        observation, done, info = env.step(action)
        assert observation is None and done and info["metrics"]["verifiers/correct_answer"] == 0.0


def test_bad_options_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="env_id is required"):
        _built({})
    with pytest.raises(ConfigError, match="unknown key 'env.options.envid'"):
        _built({"envid": "x"})
    with pytest.raises(ValueError, match="env.options.env_id 'no-such-env': Could not import 'no-such-env'"):
        _built({"env_id": "no-such-env"})
    with pytest.raises(ValueError, match=r"env.options.oracle '\{solution\}': KeyError 'solution'"):
        _built({**ARITH, "oracle": "{solution}"})
    (tmp_path / "vf_grouped.py").write_text(textwrap.dedent("""
        import verifiers as vf
        from datasets import Dataset

        def relative(completions, answers) -> list[float]:
            return [0.0 for _ in completions]

        def load_environment():
            rows = [{"question": "q", "answer": "a"}] * 4
            return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[relative]))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"\['relative'\] score a whole group of rollouts"):
        _built({"env_id": "vf-grouped"})
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if it were not installed
    with pytest.raises(MissingExtra) as missing:
        _built(ARITH)
    assert str(missing.value) == f"env.kind verifiers needs verifiers 0.3.1: {INSTALL}"


def test_one_rl_step_of_the_tiny_model_on_a_verifiers_env(tmp_path):
    from ponder.jobs.parts import rl_trainer
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe("recipes/verifiers_arith.yaml", [
        "model.name=tiny", "env.options.env_args={n_train: 8, n_eval: 2}", "train.steps=1", "train.tasks_per_step=2",
        "rollout.group_size=2", "rollout.batch_size=4", "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4",
        "algo.micro_batch_size=2", f"train.out={tmp_path}",
    ])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    assert all(task.id.startswith("train-") for task in trainer.sampler.tasks)
    trainer.train()
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1
    # 8 random tokens never hold the right number in <answer></answer>
    assert record["reward/correct_answer"] == 0.0
    assert 0.0 <= record["reward/format_reward_func"] <= 1.0
    assert record["reward/mean"] == pytest.approx(0.1 * record["reward/format_reward_func"])
    assert (tmp_path / "checkpoints" / "latest").exists()
