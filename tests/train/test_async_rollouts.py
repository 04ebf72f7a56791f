"""train.async_rollouts: step k+1's episodes are sampled during step k's update, from
the weights before it (one step behind, the importance ratio against the sampler's
logprobs); off, the trainer is exactly on-policy. Tiny random model."""

import pytest
import torch

from ponder.jobs.parts import rl_trainer
from ponder.config import load_recipe
from ponder.train.checkpoint import latest_checkpoint, load_checkpoint
from ponder.runlog.metrics_log import read_metrics
from ponder.train.rl import check_recipe

from tests.train.test_rl_trainer import TINY, low_id_share

STEPS = ["train.steps=2", "env.max_turns=1", "optim.lr=1e-2"]


def _steps(tmp_path, *overrides):
    """Two train steps by hand: each step's metrics and trajectories."""
    config = load_recipe(None, TINY + STEPS + list(overrides))
    trainer = rl_trainer(config, tmp_path, reward=low_id_share)
    out = []
    for _ in range(2):
        metrics = trainer.train_step()
        trainer.step += 1
        out.append((metrics, trainer._last_step[2]))
    assert trainer._pending is None  # nothing prefetched past the last step
    return out


def _tokens(trajectories):
    return [t.response_ids for t in trajectories], [t.old_logprobs for t in trajectories]


def test_async_samples_the_next_step_with_the_weights_before_the_update(tmp_path):
    on_policy = _steps(tmp_path / "sync")
    frozen = _steps(tmp_path / "frozen", "optim.lr=0")  # weights never move: what step 2 sees without update 1
    overlapped = _steps(tmp_path / "async", "train.async_rollouts=true")
    assert _tokens(overlapped[0][1]) == _tokens(on_policy[0][1]) == _tokens(frozen[0][1])
    # step 2: sampled from the step-1 weights, while update 1 ran: exactly the frozen run's episodes
    assert _tokens(overlapped[1][1]) == _tokens(frozen[1][1])
    assert _tokens(overlapped[1][1])[1] != _tokens(on_policy[1][1])[1]  # on-policy saw update 1
    assert [m["policy/staleness"] for m, _ in overlapped] == [0.0, 1.0]
    assert [m["policy/staleness"] for m, _ in on_policy] == [0.0, 0.0]
    # the behaviour policy's logprobs are the ratio's denominator: stale, so the ratio moved off 1
    stale, fresh = (abs(run[1][0]["policy/ratio_mean"] - 1.0) for run in (overlapped, on_policy))
    assert fresh < 1e-4 and stale > 10 * max(fresh, 1e-5), (stale, fresh)


def test_async_run_trains_and_checkpoints_the_sampler_before_the_prefetch(tmp_path):
    config = load_recipe(None, TINY + ["train.steps=3", "env.max_turns=1", "train.async_rollouts=true"])
    trainer = rl_trainer(config, tmp_path, reward=low_id_share)
    trainer.train()
    records = read_metrics(tmp_path)
    assert [r["policy/staleness"] for r in records] == [0.0, 1.0, 1.0]
    assert all(torch.isfinite(torch.tensor(r["loss/policy"])) for r in records)
    # after step 2 step 3's rollouts were in flight: the checkpoint's sampler has drawn
    # two steps' tasks (2 each), not three, so a resume samples step 3 again
    step2 = load_checkpoint(tmp_path / "checkpoints" / "step-000002")
    assert step2["trainer"]["sampler"]["position"] == 4
    final = load_checkpoint(latest_checkpoint(tmp_path))
    assert final["trainer"]["step"] == 3 and final["trainer"]["sampler"]["position"] == 6


def test_async_needs_a_staleness_bound_of_at_least_one():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        check_recipe(load_recipe(None, TINY + ["train.async_rollouts=true", "algo.max_staleness=0"]))


def test_async_in_one_process_refuses_full_fine_tuning_with_the_hf_backend(tmp_path):
    """The hf backend's sampling copy shares the weights full fine-tuning changes in place."""
    config = load_recipe(None, TINY + STEPS + ["train.async_rollouts=true", "lora.enabled=false"])
    trainer = rl_trainer(config, tmp_path, reward=low_id_share)
    with pytest.raises(ValueError, match=r"needs lora.enabled: .* use rollout.backend=vllm or --ray"):
        trainer.train_step()
