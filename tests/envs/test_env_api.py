"""The environment API's edges: import paths, a raising environment, a bad reward, bad task rows."""

from __future__ import annotations

import json
import sys

import pytest

from ponder.cli import main
from ponder.config import RolloutConfig, SamplingConfig, load_recipe
from ponder.envs.base import Opening, load_tasks_from, resolve_env
from ponder.envs.taskfile import TaskFileError
from ponder.models import tiny_tokenizer
from ponder.rewards import CompositeReward, RewardError
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import Task, Trajectory, Turn
from ponder.wiring import build_env, build_reward


class RaisesOnSecondStep:
    """Answers 'ok' to the first action, raises on the second."""

    stop_strings: list[str] = []

    def __init__(self, **options) -> None:
        self.steps = 0

    def reset(self, task: Task) -> Opening:
        return Opening([{"role": "user", "content": task.question}])

    def step(self, action: str):
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("the simulator crashed")
        return "ok", False, {"reward": 0.25}


def test_an_env_that_raises_ends_its_episode_not_the_run():
    tokenizer = tiny_tokenizer()
    tasks = [Task("a", "q1", ["x"]), Task("b", "q2", ["y"])]
    backend = ScriptedBackend(tokenizer, {"a": ["one", "two", "three"], "b": ["one", "two", "three"]})
    config = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=16))
    trajectories, _ = RolloutEngine(backend, RaisesOnSecondStep, config).run(tasks)
    for trajectory in trajectories:
        assert trajectory.stop_reason == "env_error"
        assert [t.reward for t in trajectory.turns] == [0.25, None]
        assert trajectory.turns[1].error == "env error: RuntimeError: the simulator crashed"


def test_env_kind_resolves_names_and_import_paths(tmp_path, monkeypatch):
    assert resolve_env("search_qa").__name__ == "build_search_qa"
    with pytest.raises(ValueError, match=r"^env.kind: unknown environment 'serach_qa'; valid: .*search_qa.*, or 'module:attribute'$"):
        resolve_env("serach_qa")
    with pytest.raises(ValueError, match=r"env.kind 'no_such_pkg.envs:Env': cannot import no_such_pkg.envs"):
        resolve_env("no_such_pkg.envs:Env")
    (tmp_path / "my_envs.py").write_text("class Other: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"env.kind 'my_envs:Missing': my_envs has no attribute 'Missing'"):
        resolve_env("my_envs:Missing")


def test_a_class_env_takes_its_tasks_from_files(tmp_path, monkeypatch):
    (tmp_path / "my_env_mod.py").write_text(
        "from tests.envs.test_env_api import RaisesOnSecondStep as Env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "question": "2+2?", "answers": ["4"], "level": 3}) + "\n")
    recipe = load_recipe(None, ["env.kind=my_env_mod:Env", f"env.eval_tasks={tasks}", f"env.train_tasks={tasks}"])
    spec = build_env(recipe)
    assert [t.id for t in spec.eval] == ["t1"] and spec.eval[0].metadata == {"level": 3}
    assert isinstance(spec.factory(), RaisesOnSecondStep)


def test_tasks_load_from_parquet_and_datasets_directories(tmp_path):
    import datasets

    rows = [{"id": "p1", "question": "What?", "answers": ["that"], "kind": "k"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "t.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for source in (tmp_path / "t.parquet", tmp_path / "saved"):
        assert load_tasks_from(source) == [Task("p1", "What?", ["that"], kind="k")]


def test_a_bad_task_row_names_the_file_and_row(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"id": "ok", "question": "q"}, {"id": "bad", "question": ""}]).to_parquet(
        str(tmp_path / "t.parquet")
    )
    with pytest.raises(TaskFileError, match=r"t.parquet:row 2: task 'bad' has no 'question'"):
        load_tasks_from(tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("id,question\n")
    with pytest.raises(TaskFileError, match="unknown task file type"):
        load_tasks_from(tmp_path / "t.csv")


def nan_reward(trajectory: Trajectory, task: Task) -> float:
    return float("nan")


def test_a_reward_returning_nan_or_a_string_is_a_one_line_error():
    trajectory = Trajectory("t", [1], turns=[Turn(0, "a")])
    task = Task("t", "q", ["a"])
    reward = CompositeReward({f"{__name__}:nan_reward": 1.0})
    with pytest.raises(RewardError, match=r"reward 'tests.envs.test_env_api:nan_reward' returned nan for task t"):
        reward(trajectory, task)
    reward = CompositeReward({"text": 1.0}, {"text": lambda traj, t: "1.0"})
    with pytest.raises(RewardError, match=r"reward 'text' returned '1.0' for task t"):
        reward(trajectory, task)


def test_reward_terms_extend_and_override_the_env_defaults():
    recipe = load_recipe(None, ["reward.terms={f1: 0.5, turn_rewards: 1.0}", "reward.terms.em=0.7"])
    spec = build_env(recipe)
    reward = build_reward(recipe, spec)
    assert reward.weights == {"em": 0.7, "f1": 0.5, "format": 0.1, "search_cost": -0.05, "turn_rewards": 1.0}
    trajectory = Trajectory("t", [1], turns=[Turn(0, "a", reward=0.5), Turn(1, "b", reward=0.25, answer="Paris")])
    total, breakdown = reward(trajectory, Task("t", "q", ["Paris"]))
    assert breakdown["turn_rewards"] == 0.75 and breakdown["em"] == 1.0


def test_a_missing_env_fails_the_cli_with_one_line(tmp_path, capsys):
    code = main(["eval", "--model", "tiny", "--out", str(tmp_path / "e"), "env.kind=nowhere.at_all:Env"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == (
        "ponder eval: error: env.kind 'nowhere.at_all:Env': cannot import nowhere.at_all (No module named 'nowhere')"
    )
    assert not (tmp_path / "e").exists()
    assert "nowhere" not in sys.modules
