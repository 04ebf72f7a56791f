"""The learner as a Ray actor, on a real local Ray cluster with the tiny model: a 2-step
run gives exactly the metrics and weights of the same run whose learner is the driver
process (same seed, same rollout workers), and writes them into the same run layout."""

import math
import os
import sys

import pytest
import torch

from ponder.jobs.parts import rl_trainer
from ponder.models.adapters import saved_weights
from ponder.train.checkpoint import latest_checkpoint
from ponder.runlog.metrics_log import read_metrics

from tests.train.ray.test_distributed import CLOCK
from tests.train.test_rl_trainer import low_id_share, recipe

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ponder[ray]')")

RUN = ["train.steps=2", "train.tasks_per_step=2", "train.ray_workers=2"]


@pytest.fixture(scope="module")
def cluster():
    from ponder.train.ray.rollouts import connect

    # The test's reward function travels to the learner actor by value (its module is
    # a test file, which Ray's workers need not be able to import).
    ray.cloudpickle.register_pickle_by_value(sys.modules[low_id_share.__module__])
    assert connect(None, num_cpus=3)  # a fresh local cluster, 127.0.0.1
    yield
    ray.shutdown()


def _comparable(run_dir):
    """Each step's metrics that depend on the sampled tokens and the update, not the clock."""
    out = []
    for record in read_metrics(run_dir):
        out.append({k: ("nan" if isinstance(v, float) and math.isnan(v) else v)
                    for k, v in record.items() if not k.startswith(CLOCK)})  # fmt: skip
    return out


@pytest.mark.slow
def test_the_learner_actor_trains_exactly_as_the_driver_side_learner(cluster, tmp_path):
    from ponder.train.ray.rollouts import RayRollouts
    from ponder.train.ray.learner import RayLearner, learner_threads

    config = recipe(*RUN)
    trainer = rl_trainer(config, tmp_path / "driver", reward=low_id_share)
    with RayRollouts(config, trainer.policy) as rollouts:
        trainer.use_rollouts(rollouts)
        trainer.train()
    seen = []
    with RayLearner(config, tmp_path / "actor", rl_trainer, reward=low_id_share) as learner:
        assert learner.start == 0 and learner.gpus == 0  # a CPU-only cluster
        assert learner.train(lambda step, metrics: seen.append((step, metrics["reward/mean"]))) == 2
        # Ray starts the actor at one OMP thread (its num_cpus); it computes on every core it may use.
        threads = ray.get(learner.actor.__ray_call__.remote(lambda _: torch.get_num_threads()))
        assert threads == learner_threads() == len(os.sched_getaffinity(0))
    driver, actor = _comparable(tmp_path / "driver"), _comparable(tmp_path / "actor")
    assert [r["step"] for r in actor] == [1, 2] == [step for step, _ in seen]
    assert actor == driver
    assert [reward for _, reward in seen] == [r["reward/mean"] for r in driver]
    assert actor[0]["episode/generated_tokens"] > 0
    weights = saved_weights(latest_checkpoint(tmp_path / "actor"))
    reference = saved_weights(latest_checkpoint(tmp_path / "driver"))
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[name], tensor) for name, tensor in reference.items())
    assert any("lora_B" in name and float(w.abs().max()) > 0 for name, w in weights.items())  # it trained
