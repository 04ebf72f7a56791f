"""The environment worker pool on a real local Ray cluster with the tiny model: an env
worker SIGKILLed mid-step is replaced, its episodes' environments are rebuilt by
replay, and the step's trajectories are token for token those of a run whose
environments never left the rollout workers (nothing lost, nothing duplicated)."""

import os
import signal
import threading
import time
from collections import Counter

import pytest

from ponder.jobs.parts import rl_trainer
from ponder.models import tiny_tokenizer
from ponder.train.ray.env_pool import EnvWorker
from ponder.wiring import build_env, train_tasks

from tests.train.test_rl_trainer import low_id_share, recipe

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ponder[ray]')")

STEP = ["train.tasks_per_step=4", "rollout.sampling.max_new_tokens_per_turn=48", "train.ray_workers=2"]


def test_a_replayed_environment_answers_as_the_original():
    """What a fresh env worker does for an episode whose worker died: reset + the earlier
    actions, then the failed call; the answer is the one the original env gives."""
    config = recipe()
    tokenizer = tiny_tokenizer()
    task = train_tasks(config, build_env(config, tokenizer))[0]
    actions = ["<search>who</search>", "<answer>nobody</answer>"]
    worker = EnvWorker(config, tokenizer)
    opening, stops = worker.reset("a", task)
    first = worker.step("a", actions[0])
    original = worker.step("a", actions[1])
    assert worker.ping() == 0  # the episode ended: its environment is dropped
    fresh = EnvWorker(config, tokenizer)
    assert fresh.step("a", actions[1]) == "missing"  # never hosted here
    rebuilt = fresh.step("a", actions[1], replay=(task, actions[:1]))
    assert rebuilt[:2] == original[:2] and rebuilt[2]["turn"] == original[2]["turn"]
    assert opening.messages and stops and first[0]


@pytest.fixture(scope="module")
def cluster():
    from ponder.train.ray.rollouts import connect

    assert connect(None, num_cpus=4)  # a fresh local cluster, 127.0.0.1
    yield
    ray.shutdown()


def _step(tmp_path, env_workers: int, kill: bool):
    """Step 1 of a 2-rollout-worker run; with kill, env worker 0 is SIGKILLed while it
    hosts live episodes."""
    from ponder.train.ray.rollouts import RayRollouts

    config = recipe(*STEP, f"train.ray_env_workers={env_workers}")
    trainer = rl_trainer(config, tmp_path, reward=low_id_share)
    with RayRollouts(config, trainer.policy) as rollouts:
        trainer.use_rollouts(rollouts)
        killed = []

        def killer():
            worker = ray.get(rollouts.env_pool.handles.remote())[0]
            pid = ray.get(worker.pid.remote())
            while ray.get(worker.ping.options(concurrency_group="health").remote()) == 0:
                time.sleep(0.005)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        thread = threading.Thread(target=killer, daemon=True)
        if kill:
            thread.start()
        metrics = trainer.train_step()
        if kill:
            thread.join(5)
            assert killed
        _, tasks, trajectories = trainer._last_step
    return tasks, trajectories, metrics


@pytest.mark.slow
def test_an_env_worker_killed_mid_step_loses_and_duplicates_nothing(cluster, tmp_path):
    tasks, in_rollout_workers, metrics = _step(tmp_path / "a", env_workers=0, kill=False)
    assert "ray/env_workers" not in metrics
    again_tasks, killed, killed_metrics = _step(tmp_path / "b", env_workers=2, kill=True)
    assert killed_metrics["ray/env_workers"] == 2 and killed_metrics["ray/env_restarts"] >= 1
    assert killed_metrics["ray/requeued"] == 0  # the rollout workers lived on
    assert Counter(t.task_id for t in killed) == Counter({t.id: 2 for t in tasks})  # every episode once
    assert len(killed) == len(tasks) * 2 == 8
    # Replay keeps the episodes exact: the same tokens, logprobs and environment turns
    # as the run whose environments ran inside the rollout workers.
    assert [t.id for t in again_tasks] == [t.id for t in tasks]
    assert [t.response_ids for t in killed] == [t.response_ids for t in in_rollout_workers]
    assert [t.old_logprobs for t in killed] == [t.old_logprobs for t in in_rollout_workers]
    assert [t.loss_mask for t in killed] == [t.loss_mask for t in in_rollout_workers]
    assert [[turn.observation for turn in t.turns] for t in killed] == [
        [turn.observation for turn in t.turns] for t in in_rollout_workers
    ]
    assert sum(len(t.turns) for t in killed) > len(killed) - 1  # the episodes took env steps
