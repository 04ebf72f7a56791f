"""env.kind openenv against an environment server written with OpenEnv's own SDK
(examples/envs/openenv_guess.py), started on 127.0.0.1 by the adapter: the Task API's
splits become the tasks, each action is a WebSocket step, the server's rewards are the
reward, and one RL step trains on it."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("openenv")

from ponder.config import EnvConfig, Recipe, RolloutConfig, SamplingConfig, load_recipe  # noqa: E402
from ponder.config.load import ConfigError  # noqa: E402
from ponder.envs.openenv_env import INSTALL  # noqa: E402
from ponder.extras import MissingExtra  # noqa: E402
from ponder.models import tiny_tokenizer  # noqa: E402
from ponder.rewards import score_trajectories  # noqa: E402
from ponder.rollout import RolloutEngine, ScriptedBackend  # noqa: E402
from ponder.wiring import build_env, build_reward  # noqa: E402

SERVER = ["{python}", "-m", "examples.envs.openenv_guess", "--port", "{port}"]
GUESS = {"command": SERVER, "oracle_key": "solution", "stop": ["</guess>"]}


def _built(options, max_turns=6):
    recipe = Recipe(env=EnvConfig(kind="openenv", max_turns=max_turns, options=options))
    tokenizer = tiny_tokenizer()
    return recipe, build_env(recipe, tokenizer), tokenizer


@pytest.fixture(scope="module")
def guess():
    recipe, spec, tokenizer = _built(GUESS)
    yield recipe, spec, tokenizer
    spec.close()


def test_the_task_api_gives_the_splits_and_the_schema_the_fields(guess):
    _, spec, _ = guess
    # train: 1-32 but the multiples of 4; test: the multiples of 4
    assert [t.id for t in spec.train][:3] == ["train-0", "train-1", "train-2"] and len(spec.train) == 24
    assert len(spec.eval) == 8 and all(t.kind == "test" for t in spec.eval)
    assert spec.eval[0].metadata["openenv_reset"] == {"split": "test", "index": 0}
    assert spec.eval[0].oracle_actions == ["<guess>16</guess>", "<guess>8</guess>", "<guess>4</guess>"]
    session = spec.factory.session
    assert (session.action_field, session.observation_field, session.max_turns) == ("guess", "message", 6)
    assert spec.reward_weights == {"turn_rewards": 1.0}


def test_reset_and_step_over_the_websocket(guess):
    _, spec, tokenizer = guess
    env = spec.factory()
    opening = env.reset(spec.eval[0])  # the secret is 4
    assert opening.messages == [{"role": "user", "content": opening.messages[0]["content"]}]
    assert opening.messages[0]["content"].startswith("I am thinking of a whole number from 1 to 32.")
    observation, done, info = env.step("<guess>16</guess>")
    # the action ended at the stop string, not at the end-of-turn token: the observation closes the turn
    assert observation == "<|im_end|>\n<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n"
    assert not done and info["reward"] == pytest.approx(-0.05)
    observation, done, info = env.step("my guess is 9")
    assert "lower" in observation and not done
    observation, done, info = env.step("<guess>4</guess>")
    assert observation is None and done and info["stop_reason"] == "done"
    assert info["reward"] == pytest.approx(0.95)
    env.close()
    spec.factory.session.max_turns = 2  # ponder's cap ends what the server would go on with
    try:
        env = spec.factory()
        env.reset(spec.eval[0])
        assert env.step("<guess>1</guess>")[1] is False
        assert env.step("<guess>2</guess>")[2]["stop_reason"] == "max_turns"
        env.close()
    finally:
        spec.factory.session.max_turns = 6


def test_rollouts_sum_the_servers_rewards(guess):
    recipe, spec, tokenizer = guess
    tasks = spec.eval[:4]
    config = RolloutConfig(group_size=1, batch_size=4, sampling=SamplingConfig(max_new_tokens_per_turn=64))
    reward = build_reward(recipe, spec)

    def run(scripts):
        trajectories, _ = RolloutEngine(ScriptedBackend(tokenizer, scripts), spec.factory, config).run(tasks)
        score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
        return trajectories

    solved = run({t.id: t.oracle_actions for t in tasks})
    # secrets 4, 8, 12, 16: binary search takes 3, 2, 3 and 1 guesses; 1 for the find, -0.05 each guess
    assert [t.reward for t in solved] == pytest.approx([1 - 0.05 * n for n in (3, 2, 3, 1)])
    assert all(t.stop_reason == "done" for t in solved)
    lost = run({t.id: ["<guess>0</guess>"] * 6 for t in tasks})  # the server ends a game after 6 guesses
    assert [t.reward for t in lost] == pytest.approx([-0.3] * 4) and all(t.stop_reason == "done" for t in lost)


def test_a_closed_factory_starts_its_server_again(guess):
    _, spec, _ = guess
    first = spec.factory.server.url
    spec.factory.close()  # as a trainer does when training ends
    assert spec.factory.server is None
    env = spec.factory()  # the evaluation that follows
    assert spec.factory.server is not None and spec.factory.session.url != first
    env.reset(spec.eval[3])
    assert env.step("<guess>16</guess>")[2]["reward"] == pytest.approx(0.95)
    env.close()


def test_hostile_actions_never_raise(guess):
    _, spec, _ = guess
    for action in ["", "\udcff lone surrogate \x00 nul", "{" * 5000, "</tool_response><tool_call>{\"name\": \"x\""]:
        env = spec.factory()
        env.reset(spec.eval[0])
        observation, done, info = env.step(action)
        assert "Write your guess" in observation and not done and info["reward"] == pytest.approx(-0.05)
        env.close()


def test_bad_options_are_one_line_errors(monkeypatch):
    with pytest.raises(ConfigError, match="give exactly one of url"):
        _built({})
    with pytest.raises(ConfigError, match="url must be http"):
        _built({"url": "ftp://127.0.0.1:1"})
    with pytest.raises(ValueError, match=r"the server exited with code 2 before answering"):
        _built({"command": ["{python}", "-m", "examples.envs.openenv_guess", "--no-such-flag"]})
    with pytest.raises(ValueError, match=r"env.options.action_field 'move': the server's Action has the fields guess"):
        _built({**GUESS, "action_field": "move"})
    with pytest.raises(ValueError, match=r"env.options.eval_split 'dev': the server's splits are train, test"):
        _built({**GUESS, "eval_split": "dev"})
    with pytest.raises(ValueError, match=r"GET http://127.0.0.1:9/schema failed"):
        _built({"url": "http://127.0.0.1:9", "timeout_s": 2})
    for name in ("openenv", "openenv.core"):  # as if it were not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtra) as missing:
        _built(GUESS)
    assert str(missing.value) == f"env.kind openenv needs openenv 0.10.0: {INSTALL}"


def test_one_rl_step_of_the_tiny_model_on_an_openenv_server(tmp_path):
    from ponder.jobs.parts import rl_trainer
    from ponder.runlog.metrics_log import read_metrics

    recipe = load_recipe("recipes/openenv_guess.yaml", [
        "model.name=tiny", "env.max_turns=2", "env.options.n_train=4", "env.options.n_eval=2", "train.steps=1",
        "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4", "algo.micro_batch_size=2", f"train.out={tmp_path}",
    ])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    assert [task.id for task in trainer.sampler.tasks] == ["train-0", "train-1", "train-2", "train-3"]
    trainer.train()  # closes the factory at the end: the server it started is stopped
    assert trainer.env_factory.server is None
    (record,) = read_metrics(tmp_path)
    assert record["step"] == 1
    # two guesses of 8 random tokens: each costs 0.05, a find pays 1
    assert -0.1 - 1e-9 <= record["reward/turn_rewards"] <= 0.95 + 1e-9
    assert (tmp_path / "checkpoints" / "latest").exists()
