"""The RL trainer end to end on the tiny random model: it learns a trivial reward,
gradient accumulation is exact, resume (also after SIGKILL) reproduces an
uninterrupted run, the NaN guard keeps the last good checkpoint, and bad names or
keys fail with messages that say what is valid."""

import contextlib
import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ponder.jobs.parts import rl_trainer
from ponder.config import AlgoConfig, ConfigError, load_recipe
from ponder.envs.search_qa import build_messages
from ponder.models.adapters import saved_weights
from ponder.train.checkpoint import latest_checkpoint, load_checkpoint
from ponder.runlog.metrics_log import read_metrics
from ponder.train.rl import TrainingError
from ponder.train.rl_metrics import episode_metrics
from ponder.types import Trajectory

TINY = [
    "model.name=tiny",
    "train.steps=3",
    "train.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.batch_size=4",
    "rollout.sampling.max_new_tokens_per_turn=8",
    "env.max_turns=2",
    "env.options.max_obs_tokens=16",
    "env.options.taskgen.n_people=20",
    "env.options.taskgen.n_train=16",
    "env.options.taskgen.n_eval=4",
    "lora.r=4",
    "algo.micro_batch_size=2",
    "train.save_every=1",
]


def recipe(*overrides):
    return load_recipe(None, TINY + list(overrides))


def low_id_share(trajectory, task):
    """Share of the policy's tokens with id < 256 (about half for the random model).

    It differs from sample to sample, so every group carries a learning signal."""
    generated = [t for t, m in zip(trajectory.response_ids, trajectory.loss_mask) if m == 1]
    share = sum(t < 256 for t in generated) / max(1, len(generated))
    return share, {"low_id_share": share}


def _comparable(records):
    """step → metrics without wall-clock keys; NaN as a string so NaN == NaN."""
    out = {}
    for record in records:
        out[record["step"]] = {
            key: ("nan" if isinstance(value, float) and math.isnan(value) else value)
            for key, value in record.items()
            if key != "time" and not key.startswith(("time/", "throughput/", "memory/"))
        }
    return out


# --- learning ---------------------------------------------------------------------------

OVERFIT = [
    "lora.enabled=false",
    "optim.lr=1e-2",
    "env.max_turns=1",
    "algo.epochs=2",
    "train.tasks_per_step=4",
    "rollout.group_size=4",
    "rollout.batch_size=16",
    "rollout.sampling.max_new_tokens_per_turn=8",
    "algo.micro_batch_size=16",
    "train.save_every=100",  # only the final checkpoint
]


# Measured over seeds 0-4 (last-3 minus first-3 mean reward): grpo ≥ 0.21, rloo ≥ 0.19,
# reinforce ≥ 0.33 after 10 steps; gae (value head starts at 0, so it learns later)
# ≥ 0.08 after 10 steps but ≥ 0.29 after 12. Seed 0, used here: 0.24 / 0.40 / 0.33 / 0.31.
# Without learning the difference has std ≈ 0.04 (16 episodes × 8 tokens per step),
# so a 0.10 margin lets a broken update through well under 1% of the time.
MARGIN = 0.10


@pytest.mark.parametrize(
    ("advantage", "loss", "steps"),
    [("grpo", "ppo", 10), ("rloo", "vanilla", 10), ("reinforce", "vanilla", 10), ("gae", "ppo", 12)],
)
def test_tiny_model_learns_a_trivial_reward(tmp_path, advantage, loss, steps):
    config = recipe(*OVERFIT, f"algo.advantage={advantage}", f"algo.loss={loss}", f"train.steps={steps}")
    rl_trainer(config, tmp_path, reward=low_id_share).train()
    records = read_metrics(tmp_path)
    rewards = [r["reward/mean"] for r in records]
    assert len(rewards) == steps
    peaks = [(r["memory/rollout_peak_gb"], r["memory/peak_gb"]) for r in records]  # the peak so far never falls
    assert all(0 < rollout <= peak for rollout, peak in peaks) and sorted(sum(peaks, ())) == list(sum(peaks, ()))
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + MARGIN, f"{advantage}/{loss}: {first:.3f} -> {last:.3f} ({rewards})"


# --- gradient accumulation --------------------------------------------------------------

ACCUMULATION = [
    "train.steps=1",
    "train.tasks_per_step=4",
    "rollout.group_size=2",
    "rollout.batch_size=8",
    "rollout.sampling.max_new_tokens_per_turn=12",
    "env.max_turns=1",
    "optim.max_grad_norm=0",
]


def _one_step(micro_batch_size, aggregation, advantage):
    """One train_step; returns (weights before, weights after, metrics, policy tokens per episode)."""
    config = recipe(
        *ACCUMULATION,
        f"algo.micro_batch_size={micro_batch_size}",
        f"algo.aggregation={aggregation}",
        f"algo.advantage={advantage}",
    )
    trainer = rl_trainer(config, "unused-run-dir", reward=low_id_share)
    # Cap prompt + response at the longest prompt of this step + 4: its episodes get 4
    # policy tokens, shorter prompts up to 12, so token_mean and seq_mean_token_mean
    # weigh tokens differently.
    tokenizer = trainer.policy.tokenizer
    prompts = [
        tokenizer.apply_chat_template(build_messages(task), tokenize=False, add_generation_prompt=True)
        for task in copy.deepcopy(trainer.sampler).next_batch(config.train.tasks_per_step)
    ]
    longest = max(len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    config.rollout.sampling.max_total_tokens = longest + 4
    # AdamW's first step is lr·sign(grad): blind to any error that scales a gradient.
    # Plain SGD with lr 1 moves every weight by exactly its gradient.
    trainer.optimizer = torch.optim.SGD(trainer._trainable(), lr=1.0)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda step: 1.0)
    run, lengths = trainer.engine.run, []

    def recording_run(tasks):
        trajectories, stats = run(tasks)
        lengths.extend(sum(t.loss_mask) for t in trajectories)
        return trajectories, stats

    trainer.engine.run = recording_run
    before = [p.detach().clone() for p in trainer._trainable()]
    metrics = trainer.train_step()
    after = [p.detach().clone() for p in trainer._trainable()]
    return before, after, metrics, lengths


@pytest.mark.parametrize(
    ("aggregation", "advantage"),
    [("token_mean", "grpo"), ("seq_mean_token_mean", "grpo"), ("seq_mean_token_sum_norm", "gae")],
)
def test_micro_batches_of_one_equal_one_micro_batch_of_eight(aggregation, advantage):
    before, one_by_one, metrics_1, lengths = _one_step(1, aggregation, advantage)
    _, all_at_once, metrics_8, _ = _one_step(8, aggregation, advantage)
    assert len(lengths) == 8 and len(set(lengths)) > 1 and min(lengths) > 0, lengths
    moved = max(float((a - b).abs().max()) for a, b in zip(all_at_once, before))
    assert moved > 1e-2  # the step did something
    for a, b in zip(one_by_one, all_at_once):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert metrics_1["optim/grad_norm"] == pytest.approx(metrics_8["optim/grad_norm"], rel=1e-5)
    assert metrics_1["loss/policy"] == pytest.approx(metrics_8["loss/policy"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("reference", [True, False])
def test_no_grad_passes_do_not_depend_on_their_micro_batch_size(reference):
    # Reference logprobs (adapters disabled) and value estimates are per-row: batching
    # rows of different lengths together must not change them.
    from ponder.train.batch import collate
    from ponder.train.update import forward_pass_no_grad

    config = recipe(*ACCUMULATION, "algo.advantage=gae", "algo.kl_coef=0.1")
    trainer = rl_trainer(config, "unused-run-dir", reward=low_id_share)
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(config.train.tasks_per_step))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    assert len({int(m.sum()) for m in batch.attention_mask}) > 1  # rows of different lengths
    head = None if reference else trainer.value_head
    if head is not None:  # the head starts at zero; give it weights that show any mix-up
        for param in head.parameters():
            torch.nn.init.normal_(param, std=0.1, generator=torch.Generator().manual_seed(0))
    with trainer._reference_policy() if reference else contextlib.nullcontext():
        one = forward_pass_no_grad(trainer.policy, batch, 1, 1.0, head)
        eight = forward_pass_no_grad(trainer.policy, batch, 8, 1.0, head)
    assert float((one * batch.loss_mask).abs().sum()) > 0
    torch.testing.assert_close(one * batch.loss_mask, eight * batch.loss_mask, atol=1e-5, rtol=1e-5)


def test_token_mean_and_sequence_mean_give_different_gradients():
    """Guards the test above: its batch has unequal lengths, so the aggregations differ."""
    _, _, token_mean, _ = _one_step(8, "token_mean", "grpo")
    _, _, seq_mean, _ = _one_step(8, "seq_mean_token_mean", "grpo")
    assert token_mean["optim/grad_norm"] != pytest.approx(seq_mean["optim/grad_norm"], rel=1e-3)


# --- resume -----------------------------------------------------------------------------

# Warm-up over 4 updates: steps 3-4 only match if the scheduler's position is restored.
RESUME = ["train.steps=4", "optim.lr=1e-3", "optim.warmup_steps=4"]


def resume_recipe(*overrides):
    return recipe(*RESUME, *overrides)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """Four steps without interruption: the reference for every resume test."""
    run_dir = tmp_path_factory.mktemp("straight")
    rl_trainer(resume_recipe(), run_dir, reward=low_id_share).train()
    return run_dir


def _assert_same_as_straight(run_dir, straight_run):
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    expected, got = _comparable(read_metrics(straight_run)), _comparable(records)
    for step in (1, 2, 3, 4):
        assert got[step] == expected[step], f"step {step} differs"
    final = load_checkpoint(latest_checkpoint(run_dir))
    assert final["trainer"]["step"] == 4
    weights, reference = saved_weights(latest_checkpoint(run_dir)), saved_weights(latest_checkpoint(straight_run))
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), name


def test_straight_run_updates_weights_and_logs_each_step(straight_run):
    records = read_metrics(straight_run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert len({r["reward/mean"] for r in records}) > 1
    # One update per step, so the PPO ratio is measured before it: the logprobs recorded
    # while sampling (from the merged LoRA copy) must match the trainer's own.
    for record in records:
        assert record["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert record["policy/approx_kl"] < 1e-6
    weights = saved_weights(latest_checkpoint(straight_run))
    assert any("lora_B" in name and float(w.abs().max()) > 0 for name, w in weights.items())


def test_logged_lr_is_the_lr_the_step_trained_with(straight_run):
    # warm-up over 4 updates, one update per step: steps 1-4 train at 1/4 ... 4/4 of 1e-3.
    assert [r["optim/lr"] for r in read_metrics(straight_run)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])


def test_resume_after_a_shorter_run_matches_a_straight_run(tmp_path, straight_run):
    rl_trainer(resume_recipe("train.steps=2"), tmp_path, reward=low_id_share).train()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    trainer = rl_trainer(resume_recipe(), tmp_path, reward=low_id_share)
    assert trainer.resume() == 2
    trainer.train()
    _assert_same_as_straight(tmp_path, straight_run)


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes(tmp_path, straight_run):
    calls = []

    def terminate_during_step_2(trajectory, task):
        calls.append(1)
        if len(calls) == 5:  # 4 episodes per step: the first reward of step 2
            os.kill(os.getpid(), signal.SIGTERM)
        return low_id_share(trajectory, task)

    stopped = rl_trainer(resume_recipe(), tmp_path, reward=terminate_during_step_2)
    stopped.train()
    assert stopped._watchdog is None  # the run stopped in time: its watchdog is cancelled, never fires later
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert load_checkpoint(latest_checkpoint(tmp_path))["trainer"]["step"] == 2
    trainer = rl_trainer(resume_recipe(), tmp_path, reward=low_id_share)
    assert trainer.resume() == 2
    trainer.train()
    _assert_same_as_straight(tmp_path, straight_run)


KILLED_RUN = """
import importlib.util, os, signal, sys
import torch
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("rl_trainer_tests", sys.argv[1])
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
from ponder.jobs.parts import rl_trainer
from ponder.train.rl import RLTrainer

class KilledBeforeStep3Checkpoint(RLTrainer):
    def save(self):
        if self.step == 3:  # step 3's metrics line is written; its checkpoint is not
            os.kill(os.getpid(), signal.SIGKILL)
        return super().save()

rl_trainer(tests.resume_recipe(), sys.argv[2], reward=tests.low_id_share, trainer_class=KilledBeforeStep3Checkpoint).train()
"""


def test_resume_after_sigkill_between_log_and_checkpoint(tmp_path, straight_run):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2] / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", KILLED_RUN, __file__, str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]  # step 3 logged, not saved
    assert latest_checkpoint(tmp_path).name == "step-000002"
    trainer = rl_trainer(resume_recipe(), tmp_path, reward=low_id_share)
    assert trainer.resume() == 2
    trainer.train()
    _assert_same_as_straight(tmp_path, straight_run)  # step 3 once, with the resumed run's values


# --- guards and errors ------------------------------------------------------------------


def test_nan_reward_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    calls = []

    def nan_after_step_1(trajectory, task):
        calls.append(1)
        return (float("nan"), {}) if len(calls) > 4 else low_id_share(trajectory, task)

    trainer = rl_trainer(recipe(), tmp_path, reward=nan_after_step_1)
    with pytest.raises(TrainingError, match="NaN"):
        trainer.train()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "step-000001"
    state = load_checkpoint(path)
    assert state["trainer"]["step"] == 1
    assert all(torch.isfinite(w).all() for w in saved_weights(path).values())
    assert rl_trainer(recipe(), tmp_path, reward=low_id_share).resume() == 1


def test_unscorable_episodes_do_not_trip_the_nan_guard(tmp_path):
    calls = []

    def every_other_unscorable(trajectory, task):
        calls.append(1)
        return (None, {}) if len(calls) % 2 else low_id_share(trajectory, task)

    rl_trainer(recipe("train.steps=1"), tmp_path, reward=every_other_unscorable).train()
    (record,) = read_metrics(tmp_path)
    assert len(calls) == 4
    assert math.isfinite(record["loss/policy"]) and math.isfinite(record["optim/grad_norm"])
    assert math.isfinite(record["reward/mean"])  # the mean of the two scored episodes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.advantage=gpro", r"unknown advantage estimator 'gpro'; valid: .*grpo.*rloo"),
        ("algo.loss=ppo2", r"unknown policy loss 'ppo2'; valid: .*ppo.*vanilla"),
        ("algo.aggregation=tokenmean", r"unknown loss aggregation 'tokenmean'; valid: .*token_mean"),
        ("algo.std_scope=global", r"algo.std_scope: unknown 'global'; valid: group, batch"),
        ("algo.micro_batch_size=0", r"key 'algo.micro_batch_size' must be >= 1, got 0"),
        ("algo.logprob_micro_batch_size=-2", r"key 'algo.logprob_micro_batch_size' must be >= 0, got -2"),
    ],
)
def test_unknown_algorithm_names_list_the_valid_ones(tmp_path, override, message):
    # Checked when the recipe loads or in the constructor, before the model, data or run directory are touched.
    with pytest.raises(ValueError, match=message):
        rl_trainer(recipe(override, "train.steps=1"), tmp_path / "run", reward=low_id_share)
    assert not (tmp_path / "run").exists()


def test_full_fine_tuning_with_kl_is_refused(tmp_path):
    with pytest.raises(ValueError, match="kl_coef=0 or lora.enabled=true"):
        rl_trainer(recipe("lora.enabled=false", "algo.kl_coef=0.1"), tmp_path)


def test_recipe_typo_fails_in_load_recipe_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'algo\.advantge'.*advantage"):
        load_recipe(None, TINY + ["algo.advantge=grpo"])
    path = tmp_path / "recipe.yaml"
    path.write_text("model:\n  name: tiny\ntrain:\n  step: 3\n")
    with pytest.raises(ConfigError, match=r"recipe\.yaml: unknown key 'train\.step' \(valid: .*steps"):
        load_recipe(path)


# --- collapse metrics -------------------------------------------------------------------


def _episode(group, reward, response, **metrics):
    return Trajectory(
        task_id=group, prompt_ids=[1], response_ids=response, loss_mask=[1] * len(response),
        old_logprobs=[0.0] * len(response), reward=reward, breakdown={"em": reward or 0.0},
        metrics=metrics, group_id=group,
    )  # fmt: skip


def test_episode_metrics_hand_case():
    episodes = [
        _episode("a", 1.0, [7, 8], searches=1.0),
        _episode("a", 1.0, [7, 8], searches=3.0),  # tied rewards, identical responses
        _episode("b", 0.0, [3], searches=0.0),
        _episode("b", 1.0, [4], searches=0.0),
    ]
    metrics = episode_metrics(episodes)
    assert metrics["collapse/tied_groups"] == 0.5
    assert metrics["collapse/distinct_ratio"] == pytest.approx((1 / 2 + 2 / 2) / 2)  # 0.75
    assert metrics["reward/mean"] == 0.75
    assert metrics["reward/std"] == pytest.approx(math.sqrt((3 * 0.25**2 + 0.75**2) / 4))  # 0.4330
    assert metrics["reward/em"] == 0.75
    assert metrics["episode/searches"] == 1.0
    assert metrics["episode/answered"] == 0.0  # missing counts are 0
    assert not any(key.startswith("kind/") for key in metrics)
    by_kind = episode_metrics(episodes, {"a": "multi_hop", "b": "in_prompt"})
    assert by_kind["kind/multi_hop/searches"] == 2.0 and by_kind["kind/multi_hop/reward"] == 1.0
    assert by_kind["kind/in_prompt/searches"] == 0.0 and by_kind["kind/in_prompt/reward"] == 0.5


def test_episode_metrics_leave_unscorable_rewards_out_of_the_mean():
    episodes = [_episode("a", None, [1]), _episode("a", 0.5, [2]), _episode("a", 1.0, [3])]
    metrics = episode_metrics(episodes)
    assert metrics["reward/mean"] == 0.75
    assert metrics["collapse/tied_groups"] == 0.0
    assert metrics["collapse/distinct_ratio"] == 1.0
    assert json.dumps(metrics, allow_nan=False)  # nothing NaN here


def test_every_algorithm_knob_is_reachable_from_the_recipe():
    import dataclasses

    from ponder.algos import AdvantageConfig, LossConfig

    trainer = rl_trainer(
        recipe("algo.clip_c=3.0", "algo.std_eps=0.01", "algo.baseline_momentum=0.5", "algo.whiten_gae=true"),
        "unused-run-dir", reward=low_id_share,
    )  # fmt: skip
    assert trainer.loss_config().clip_c == 3.0
    algo = trainer.recipe.algo
    names = {f.name for f in dataclasses.fields(AlgoConfig)} | {"eps"}
    for config in (AdvantageConfig, LossConfig):
        assert {f.name for f in dataclasses.fields(config)} <= names, config
    assert (algo.std_eps, algo.baseline_momentum, algo.whiten_gae) == (0.01, 0.5, True)


@pytest.mark.parametrize("damage_kind", ["bit flip", "truncated", "deleted", "dangling latest", "latest outside",
                                         "latest missing", "checksums emptied", "checksums deleted"])  # fmt: skip
def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, straight_run, damage_kind, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(straight_run, run)
    root = run / "checkpoints"
    newest = root / (root / "latest").read_text().strip()
    weights = newest / "adapter_model.safetensors"
    if damage_kind == "bit flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x10
        weights.write_bytes(bytes(data))
    elif damage_kind == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage_kind == "deleted":
        weights.unlink()
    elif damage_kind == "dangling latest":
        (root / "latest").write_text("step-000099\n")
    elif damage_kind == "latest missing":
        (root / "latest").unlink()
    elif damage_kind == "checksums emptied":
        (newest / "checksums.json").write_bytes(b"")
    elif damage_kind == "checksums deleted":
        (newest / "checksums.json").unlink()
    else:
        (root / "latest").write_text("../../../etc\n")
    found = latest_checkpoint(run)
    if damage_kind in ("dangling latest", "latest outside", "latest missing"):  # the checkpoints themselves are intact
        assert found == newest
    else:
        assert found is not None and found.name < newest.name
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("ponder: warning: ") and found.name in warning[0]
    assert rl_trainer(resume_recipe(), run, reward=low_id_share).resume() == int(found.name[5:])


def test_no_intact_checkpoint_refuses_to_resume_instead_of_starting_over(tmp_path, straight_run):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(straight_run, run)
    for checkpoint in (run / "checkpoints").glob("step-*"):
        (checkpoint / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no intact checkpoint to resume from; start again with --overwrite"):
        rl_trainer(resume_recipe(), run, reward=low_id_share).resume()


STUCK_RUN = """
import importlib.util, pathlib, sys, time
spec = importlib.util.spec_from_file_location("rl_trainer_tests", sys.argv[1])
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
from ponder.jobs.parts import rl_trainer

def stuck(trajectory, task):  # a reward that never returns, like a hung verifier
    pathlib.Path(sys.argv[3]).touch()
    while True:
        time.sleep(0.05)

rl_trainer(tests.resume_recipe("train.stop_grace_s=1"), sys.argv[2], reward=stuck).train()
"""


def test_sigterm_stops_a_stuck_step_within_the_grace_period(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2] / "src"), env.get("PYTHONPATH", "")])
    marker = tmp_path / "in-step"
    command = [sys.executable, "-c", STUCK_RUN, __file__, str(tmp_path / "run"), str(marker)]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), process.stderr.read()[-2000:] if process.poll() is not None else "never reached the reward"
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - sent < 10  # the grace period is 1 s; generous for a loaded machine
    assert "did not finish within 1 s of SIGTERM; stopping now" in stderr


def test_dynamic_sampling_replaces_groups_without_signal(tmp_path):
    """Tasks of one kind get a constant reward (no signal); with the `informative`
    filter the step drops their groups and samples fresh tasks in their place."""
    def constant_for_in_prompt(trajectory, task):
        if task.kind == "in_prompt":
            return 1.0, {"low_id_share": 1.0}
        return low_id_share(trajectory, task)

    config = recipe("algo.group_filter=informative", "algo.max_refills=3", "train.steps=1")
    trainer = rl_trainer(config, tmp_path, reward=constant_for_in_prompt)
    tasks, kept, _, sampled = trainer._sample_groups()
    kinds = {t.id: t.kind for t in tasks}
    assert all(kinds[t.task_id] != "in_prompt" for t in kept)  # only groups with signal
    assert sampled["sampling/kept_groups"] == len({t.group_id for t in kept})
    assert kinds[tasks[0].id] == "in_prompt"  # the seeded first draw holds a group without signal …
    assert sampled["sampling/rollouts"] > 1  # … so the step sampled again
    assert sampled["sampling/kept_groups"] == config.train.tasks_per_step  # until it had enough
    with pytest.raises(ValueError, match="unknown group filter 'dapo'"):
        rl_trainer(recipe("algo.group_filter=dapo"), tmp_path / "x", reward=low_id_share)
    trainer.train()  # a whole step runs with the filter on
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


def test_curriculum_run_logs_its_shares_and_resumes_bit_identical(tmp_path):
    """train.curriculum=informative: every step logs each kind's signal and share, and
    a run stopped after 2 steps and resumed matches a straight 3-step run."""
    overrides = ("train.curriculum=informative", "train.curriculum_momentum=0.0", "train.steps=3")
    straight = tmp_path / "straight"
    rl_trainer(resume_recipe(*overrides), straight, reward=low_id_share).train()
    records = read_metrics(straight)
    kinds = sorted({key.split("/")[1] for key in records[0] if key.startswith("curriculum/")})
    assert len(kinds) >= 2
    for record in records:
        assert sum(record[f"curriculum/{kind}/share"] for kind in kinds) == pytest.approx(1.0)
    rl_trainer(resume_recipe(*overrides, "train.steps=2"), tmp_path / "resumed", reward=low_id_share).train()
    trainer = rl_trainer(resume_recipe(*overrides), tmp_path / "resumed", reward=low_id_share)
    assert trainer.resume() == 2
    trainer.train()
    expected, got = _comparable(records), _comparable(read_metrics(tmp_path / "resumed"))
    assert got[3] == expected[3]
    with pytest.raises(ValueError, match="unknown curriculum 'hard_first'"):
        rl_trainer(recipe("train.curriculum=hard_first"), tmp_path / "x", reward=low_id_share)


def _warmed_up_trainer(run_dir, *overrides):
    """A trainer whose LoRA weights are not the fresh ones (as after the demo's SFT
    warm-up): every trainable weight moved by seeded noise."""
    from ponder.models.prepare import prepare_policy

    config = recipe(*ACCUMULATION, "algo.kl_coef=0.1", *overrides)
    policy = prepare_policy(config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in policy.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return rl_trainer(config, run_dir, policy=policy, reward=low_id_share)


def _reference_and_policy_logprobs(trainer, batch):
    from ponder.train.update import forward_pass_no_grad

    with trainer._reference_policy():
        reference = forward_pass_no_grad(trainer.policy, batch, 8, 1.0) * batch.loss_mask
    return reference, forward_pass_no_grad(trainer.policy, batch, 8, 1.0) * batch.loss_mask


def test_kl_reference_start_is_the_policy_as_the_run_began(tmp_path):
    from ponder.train.batch import collate

    trainer = _warmed_up_trainer(tmp_path / "start")
    trajectories, _ = trainer.engine.run(trainer.sampler.next_batch(2))
    batch = collate(trajectories, trainer.policy.tokenizer.pad_token_id)
    reference, policy = _reference_and_policy_logprobs(trainer, batch)
    torch.testing.assert_close(reference, policy, atol=0, rtol=0)  # KL 0 before any update
    trainer.train()
    reference_after, policy_after = _reference_and_policy_logprobs(trainer, batch)
    torch.testing.assert_close(reference_after, reference, atol=0, rtol=0)  # still the start
    assert float((policy_after - reference).abs().max()) > 1e-3  # the policy moved away from it
    # the weights were restored after each reference pass: the policy is the trained one
    _, again = _reference_and_policy_logprobs(trainer, batch)
    torch.testing.assert_close(again, policy_after, atol=0, rtol=0)
    # kl_reference=base: the base model (adapters off), not the warmed-up start
    base = _warmed_up_trainer(tmp_path / "base", "algo.kl_reference=base")
    base_reference, base_policy = _reference_and_policy_logprobs(base, batch)
    assert float((base_reference - base_policy).abs().max()) > 1e-3


def test_kl_reference_start_and_base_agree_on_fresh_adapters(tmp_path):
    from ponder.train.batch import collate

    config = recipe(*ACCUMULATION, "algo.kl_coef=0.1")
    start = rl_trainer(config, tmp_path / "s", reward=low_id_share)
    base = rl_trainer(recipe(*ACCUMULATION, "algo.kl_coef=0.1", "algo.kl_reference=base"),
                                 tmp_path / "b", reward=low_id_share)  # fmt: skip
    assert start.reference_weights is None  # fresh adapters: the cheaper pass, adapters off
    trajectories, _ = start.engine.run(start.sampler.next_batch(2))
    batch = collate(trajectories, start.policy.tokenizer.pad_token_id)
    torch.testing.assert_close(_reference_and_policy_logprobs(start, batch)[0],
                               _reference_and_policy_logprobs(base, batch)[0], atol=1e-6, rtol=0)  # fmt: skip


def test_a_resumed_run_keeps_its_starting_reference(tmp_path):
    first = _warmed_up_trainer(tmp_path / "run", "train.steps=1")
    assert first.reference_weights is not None
    first.train()
    second = _warmed_up_trainer(tmp_path / "run", "train.steps=1")
    assert second.resume() == 1
    for name, value in first.reference_weights.items():
        assert torch.equal(second.reference_weights[name], value)
    moved = dict(second.policy.model.named_parameters())
    assert any(not torch.equal(moved[name], value) for name, value in second.reference_weights.items())


def test_unknown_kl_reference_is_refused(tmp_path):
    with pytest.raises(ValueError, match="^algo.kl_reference: unknown kl reference 'sft'; valid: base, start$"):
        rl_trainer(recipe("algo.kl_reference=sft"), tmp_path)


def test_training_closes_its_environment_factory(tmp_path):
    trainer = rl_trainer(recipe("train.steps=1"), tmp_path)
    closed = []
    trainer.env_factory.close = lambda: closed.append(trainer.step)  # what a sandbox pool's factory has
    trainer.train()
    assert closed == [1]  # once, when training ended
