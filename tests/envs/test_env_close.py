"""Env.close: the rollout engine closes every episode's environment once, however the
episode ended (an answer, a token budget, a step that raised) and when the run itself
fails; env factories are closed by whoever built them (EnvSpec, evaluation, wiring).
The environments here hold a real resource: an open file (episodes), a socket (factory)."""

from __future__ import annotations

import logging
import socket
import sys
import textwrap
from types import SimpleNamespace

import pytest

from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.base import BaseEnv, EnvSpec, Opening, close_env
from ponder.eval.runner import evaluate
from ponder.models import tiny_tokenizer
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import Task
from ponder.wiring import build_env, check_parts

CONFIG = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=16))


class FileEnv(BaseEnv):
    """Writes every action to its own open log file; `raise` raises in step, `answer` ends."""

    stop_strings: list[str] = []

    def __init__(self, directory, opened: list[FileEnv]) -> None:
        self.file = open(directory / f"episode-{len(opened)}.log", "w")  # noqa: SIM115 - closed by close()
        self.closes = 0
        opened.append(self)

    def reset(self, task: Task) -> Opening:
        if task.question == "broken":
            raise RuntimeError("no such task")
        return Opening([{"role": "user", "content": task.question}])

    def step(self, action: str):
        self.file.write(action + "\n")
        if action == "raise":
            raise RuntimeError("the simulator crashed")
        return ("ok", action == "answer", {"stop_reason": "answer"} if action == "answer" else {})

    def close(self) -> None:
        self.closes += 1
        self.file.close()


def run(tmp_path, scripts, tasks, config=CONFIG):
    opened: list[FileEnv] = []
    engine = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts), lambda: FileEnv(tmp_path, opened), config)
    return engine, opened


def test_every_episode_is_closed_once_however_it_ended(tmp_path):
    tasks = [Task("answers", "q", []), Task("raises", "q", []), Task("runs_out", "q", [])]
    scripts = {"answers": ["look", "answer"], "raises": ["look", "raise"], "runs_out": ["look " * 40] * 3}
    tight = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=16,
                                                                              max_total_tokens=48))  # fmt: skip
    engine, opened = run(tmp_path, scripts, tasks, tight)
    trajectories, _ = engine.run(tasks)
    assert [t.stop_reason for t in trajectories] == ["answer", "env_error", "max_tokens"]
    assert len(opened) == 3 and all(env.file.closed and env.closes == 1 for env in opened)
    assert (tmp_path / "episode-1.log").read_text() == "look\nraise\n"  # written, flushed by close


def test_a_failing_run_closes_every_open_environment(tmp_path):
    tasks = [Task(f"t{i}", "q", []) for i in range(4)]  # batch_size 2: two active, two queued
    engine, opened = run(tmp_path, {"t0": ["answer"], "t1": ["look", "look"]}, tasks)  # t2's turn: no script
    with pytest.raises(IndexError, match="no turn 0 for episode 't2#0'"):
        engine.run(tasks)
    assert len(opened) == 4 and all(env.file.closed and env.closes == 1 for env in opened)


def test_a_reset_that_raises_closes_its_environment_and_those_before_it(tmp_path):
    tasks = [Task("fine", "q", []), Task("bad", "broken", [])]
    engine, opened = run(tmp_path, {"fine": ["answer"]}, tasks)
    with pytest.raises(RuntimeError, match="no such task"):
        engine.run(tasks)
    assert len(opened) == 2 and all(env.file.closed and env.closes == 1 for env in opened)


class NoClose:
    stop_strings: list[str] = []

    def reset(self, task):
        return [{"role": "user", "content": task.question}]

    def step(self, action):
        return None, True, {}


class CloseRaises(NoClose):
    def close(self):
        raise OSError("disk gone")


@pytest.mark.parametrize("factory", [NoClose, CloseRaises])
def test_an_env_without_close_or_whose_close_fails_still_runs(factory, caplog):
    engine = RolloutEngine(ScriptedBackend(tiny_tokenizer(), {"a": ["x"]}), factory, CONFIG)
    with caplog.at_level(logging.WARNING, logger="ponder.envs.base"):
        (trajectory,), _ = engine.run([Task("a", "q", [])])
    assert trajectory.stop_reason == "done"
    assert ("closing CloseRaises failed: OSError: disk gone" in caplog.text) == (factory is CloseRaises)


class SocketFactory:
    """Fresh FileEnvs around one shared resource: a connected socket pair."""

    def __init__(self, directory) -> None:
        self.directory, self.opened = directory, []
        self.sockets = socket.socketpair()

    def __call__(self) -> FileEnv:
        return FileEnv(self.directory, self.opened)

    def close(self) -> None:
        for end in self.sockets:
            end.close()


def test_an_env_spec_closes_its_factory(tmp_path):
    factory = SocketFactory(tmp_path)
    with EnvSpec(factory, [], []) as spec:
        assert spec.factory is factory and factory.sockets[0].fileno() >= 0
    assert all(end.fileno() == -1 for end in factory.sockets)  # closed
    close_env(object())  # nothing to close: nothing happens
    EnvSpec(lambda: NoClose(), [], []).close()


BUILDER = '''
    import tempfile
    from pathlib import Path

    from ponder.envs.base import EnvSpec
    from ponder.types import Task
    from test_env_close import SocketFactory

    FACTORIES = []


    def build(ctx):
        FACTORIES.append(SocketFactory(Path(tempfile.mkdtemp())))
        tasks = [Task(f"t{i}", "q", [], oracle_actions=["answer"]) for i in range(3)]
        return EnvSpec(FACTORIES[-1], tasks, tasks, {"one": lambda t, task: 1.0}, {"one": 1.0})
'''


@pytest.fixture
def closing_envs(tmp_path, monkeypatch):
    (tmp_path / "closing_envs.py").write_text(textwrap.dedent(BUILDER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    monkeypatch.delitem(sys.modules, "closing_envs", raising=False)
    import closing_envs

    return closing_envs


def test_evaluation_and_the_parts_check_close_the_factory_they_built(closing_envs):
    recipe = load_recipe(None, ["env.kind=closing_envs:build", "eval.episodes=2", "train.steps=0", "sft.steps=0"])
    result = evaluate(recipe, SimpleNamespace(tokenizer=tiny_tokenizer()), oracle=True)
    assert [t.reward for t in result.trajectories] == [1.0, 1.0]
    check_parts(recipe)
    first, second = closing_envs.FACTORIES
    for factory in (first, second):
        assert all(end.fileno() == -1 for end in factory.sockets)
    assert len(first.opened) == 2 and all(env.file.closed for env in first.opened)
    spec = build_env(recipe)  # a spec built by hand is its builder's to close
    assert spec.factory.sockets[0].fileno() >= 0
    spec.close()
