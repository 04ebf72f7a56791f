"""Rollouts on Ray workers, on a real local Ray cluster with the tiny model: a worker
killed mid-step has its share re-queued and the step's trajectories are exactly those
of an undisturbed run (nothing lost, nothing duplicated); a run is reproducible; the
CLI's --ray runs, and an address that does not answer fails in seconds."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from ponder.jobs.parts import rl_trainer
from ponder.train.ray.rollouts import RayError, check_address, connect, share_seed, split_tasks

from tests.train.test_rl_trainer import TINY, low_id_share, recipe

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ponder[ray]')")

# Long enough actions that a step's rollout is still running when the test kills a worker.
STEP = ["train.tasks_per_step=4", "rollout.sampling.max_new_tokens_per_turn=48", "train.ray_workers=2"]


def test_shares_are_contiguous_and_cover_every_task_once():
    tasks = list(range(7))
    shares = split_tasks(tasks, 3)
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_tasks([0], 2) == [[0], []]
    assert share_seed(0, 1, 0, 0) == share_seed(0, 1, 0, 0)
    assert len({share_seed(0, s, c, i) for s in range(3) for c in range(2) for i in range(2)}) == 12


@pytest.fixture(scope="module")
def cluster():
    assert connect(None, num_cpus=3)  # a fresh local cluster, 127.0.0.1
    yield
    ray.shutdown()


def _step_trajectories(tmp_path, kill: bool):
    """Step 1 of a 2-worker run; with kill, a worker is SIGKILLed while its share runs."""
    from ponder.train.ray.rollouts import RayRollouts

    config = recipe(*STEP)
    trainer = rl_trainer(config, tmp_path, reward=low_id_share)
    with RayRollouts(config, trainer.policy) as rollouts:
        trainer.use_rollouts(rollouts)
        killed = []

        def killer():
            while not rollouts.in_flight:
                time.sleep(0.001)
            os.kill(rollouts.pids[0], signal.SIGKILL)
            killed.append(rollouts.pids[0])

        thread = threading.Thread(target=killer, daemon=True)
        if kill:
            thread.start()
        metrics = trainer.train_step()
        if kill:
            thread.join(5)
            assert killed
        _, tasks, trajectories = trainer._last_step
    return tasks, trajectories, metrics


@pytest.mark.slow  # 25 s alone, 230 s beside other work on 2 cores: the longest test of the suite
def test_a_worker_killed_mid_step_loses_and_duplicates_nothing(cluster, tmp_path):
    tasks, undisturbed, metrics = _step_trajectories(tmp_path / "a", kill=False)
    assert metrics["ray/requeued"] == 0 and metrics["ray/workers"] == 2
    again_tasks, killed, killed_metrics = _step_trajectories(tmp_path / "b", kill=True)
    assert killed_metrics["ray/requeued"] == 1
    group_size = 2
    expected = Counter({t.id: group_size for t in tasks})
    assert Counter(t.task_id for t in killed) == expected  # every episode once
    assert len(killed) == len(tasks) * group_size == 8
    # The re-run share samples with its own seed: the same tokens as the undisturbed run,
    # which is also the reproducibility check (two runs, same step-1 token ids).
    assert [t.id for t in again_tasks] == [t.id for t in tasks]
    assert [t.response_ids for t in killed] == [t.response_ids for t in undisturbed]
    assert [t.old_logprobs for t in killed] == [t.old_logprobs for t in undisturbed]
    assert all(len(t.loss_mask) == len(t.response_ids) == len(t.old_logprobs) for t in killed)
    assert sum(sum(t.loss_mask) for t in killed) > 0


CLOCK = ("time", "throughput/", "memory/", "ray/overhead_s", "ray/worker_rollout_s", "ray/weights_sync_s")


def _train(tmp_path, name, *extra, timeout=300):
    """`ponder train` on the tiny recipe as a subprocess; `extra` goes last (--ray …)."""
    out = tmp_path / name
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("{}\n")
    command = [sys.executable, "-m", "ponder.cli", "train", "--recipe", str(recipe_file), "--out", str(out),
               *TINY, "train.steps=2", "env.max_turns=1", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env), out


def test_an_address_that_does_not_answer_fails_in_seconds(tmp_path):
    with socket_free_port() as port:
        tick = time.perf_counter()
        result, out = _train(tmp_path, "run", "--ray", f"127.0.0.1:{port}", timeout=120)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"no cluster answers at 127.0.0.1:{port}" in line, result.stderr
    assert time.perf_counter() - tick < 60  # the python start and model load dominate
    with pytest.raises(RayError, match="not HOST:PORT"):
        check_address("nonsense")


@pytest.mark.slow
def test_cli_ray_run_is_reproducible_and_one_process_run_completes(tmp_path):
    rewards = []
    for name in ("ray-1", "ray-2"):
        result, out = _train(tmp_path, name, "--ray")
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["ray/workers"] for r in records] == [2.0, 2.0]
        # every metric that depends on the sampled tokens and the update, not the clock
        rewards.append([{k: v for k, v in r.items() if not k.startswith(CLOCK)} for r in records])
    assert rewards[0] == rewards[1]
    assert rewards[0][0]["episode/generated_tokens"] > 0
    result, out = _train(tmp_path, "local")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and "ray/workers" not in records[0]


class socket_free_port:
    """A port on 127.0.0.1 that nothing listens on (bound, not listening, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        pass
