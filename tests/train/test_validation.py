"""Model selection during RL: the validation split, the best-so-far record, early
stopping and ending on the best weights (ponder.train.validation)."""

from __future__ import annotations

import math

import torch
from peft import get_peft_model_state_dict

from ponder.config import load_recipe
from ponder.models.adapters import find_trained, saved_weights
from ponder.train.checkpoint import latest_checkpoint
from ponder.runlog.metrics_log import read_metrics
from ponder.models.prepare import prepare_policy
from ponder.train.validation import BEST_DIR, BestSoFar, recipe_validation, split_validation
from ponder.types import Task
from ponder.jobs.parts import rl_trainer

from tests.train.test_rl_trainer import TINY, low_id_share


def _tasks(kinds: str) -> list[Task]:
    return [Task(id=f"t{i}", question=f"q{i}", answers=["a"], kind=kind) for i, kind in enumerate(kinds)]


def test_split_takes_kinds_in_turn_and_keeps_every_task_once():
    tasks = _tasks("aaaabb")
    train, val = split_validation(tasks, 3, seed=0)
    assert sorted(t.kind for t in val) == ["a", "a", "b"]  # a, b, a in turn
    assert {t.id for t in train} | {t.id for t in val} == {t.id for t in tasks}
    assert not {t.id for t in train} & {t.id for t in val}
    assert [t.id for t in train] == [t.id for t in tasks if t not in val]  # order kept
    assert split_validation(tasks, 3, seed=0) == (train, val)
    assert split_validation(tasks, 0, seed=0) == (tasks, [])


def test_split_covers_every_kind_when_it_can():
    for seed in range(5):
        _, val = split_validation(_tasks("aaaaaabbbc"), 3, seed)
        assert sorted(t.kind for t in val) == ["a", "b", "c"]


def test_split_refuses_to_leave_nothing_to_train_on():
    try:
        split_validation(_tasks("ab"), 2, seed=0)
    except ValueError as err:
        assert "train.val_tasks=2" in str(err)
    else:
        raise AssertionError("expected ValueError")


def test_validation_outside_sft_is_left_out_of_the_warm_up_for_every_rl_seed():
    from ponder.jobs.parts import recipe_demonstrations
    from ponder.wiring import build_env, train_tasks

    policy = prepare_policy(load_recipe(None, TINY))
    whole = ["rollout.sampling.max_new_tokens_per_turn=256", "env.max_turns=3", "sft.behaviour=oracle"]
    kept_out = whole + ["train.val_tasks=4", "train.val_outside_sft=true", "sft.examples=16"]
    splits = []
    for seed in (0, 1):
        recipe = load_recipe(None, TINY + kept_out + [f"train.seed={seed}"])
        tasks = train_tasks(recipe, build_env(recipe, policy.tokenizer))
        train, val = recipe_validation(recipe, tasks)
        demos = {d.task_id for d in recipe_demonstrations(recipe, policy)}
        assert len(val) == 4 and not demos & {t.id for t in val}
        assert demos == {t.id for t in train}  # sft.examples=16 asks for all of them
        splits.append(val)
    assert splits[0] == splits[1]  # one split whatever the RL seed
    plain = load_recipe(None, TINY + whole + ["train.val_tasks=4", "sft.examples=16", "train.seed=1"])
    _, val = recipe_validation(plain, tasks)
    assert val != splits[0]  # without it the split follows train.seed ...
    assert {d.task_id for d in recipe_demonstrations(plain, policy)} == {t.id for t in tasks}  # ... and SFT sees it


def test_rl_outside_sft_draws_only_what_the_warm_up_did_not_demonstrate():
    import pytest

    from ponder.jobs.parts import recipe_demonstrations
    from ponder.wiring import build_env, train_tasks

    policy = prepare_policy(load_recipe(None, TINY))
    whole = ["rollout.sampling.max_new_tokens_per_turn=256", "env.max_turns=3", "sft.behaviour=oracle", "sft.examples=5"]
    everything = train_tasks(recipe := load_recipe(None, TINY + whole), build_env(recipe, policy.tokenizer))
    outside = load_recipe(None, TINY + whole + ["train.outside_sft=true"])
    rl = train_tasks(outside, build_env(outside, policy.tokenizer))
    demos = [d.task_id for d in recipe_demonstrations(outside, policy)]
    assert len(demos) == 5 and len(rl) == len(everything) - 5
    assert not set(demos) & {t.id for t in rl}
    assert [t.id for t in rl] == [t.id for t in everything if t.id not in demos]  # the rest, in order
    both = load_recipe(None, TINY + whole + ["train.outside_sft=true", "train.val_outside_sft=true"])
    with pytest.raises(ValueError, match="train.outside_sft and train.val_outside_sft"):
        train_tasks(both, build_env(both, policy.tokenizer))


def test_sft_kind_examples_caps_a_kind_and_leaves_its_other_tasks_to_rl():
    import pytest

    from ponder.config import ConfigError
    from ponder.wiring import build_env, sft_tasks, train_tasks

    policy = prepare_policy(load_recipe(None, TINY))
    whole = ["rollout.sampling.max_new_tokens_per_turn=256", "env.max_turns=3", "sft.examples=8"]
    plain = load_recipe(None, TINY + whole)
    spec = build_env(plain, policy.tokenizer)
    kind = spec.train[0].kind
    first_of_kind = [t.id for t in spec.train if t.kind == kind]
    capped = load_recipe(None, TINY + whole + [f"sft.kind_examples={{{kind}: 1}}", "train.outside_sft=true"])
    demos = sft_tasks(capped, spec)
    assert len(demos) == 8 and [t.id for t in demos if t.kind == kind] == first_of_kind[:1]
    others = [t.id for t in spec.train if t.kind != kind]
    assert [t.id for t in demos if t.kind != kind] == others[:7]  # the other kinds fill in, in order
    rl = {t.id for t in train_tasks(capped, spec)}
    assert set(first_of_kind[1:]) <= rl and first_of_kind[0] not in rl
    loose = load_recipe(None, TINY + whole + [f"sft.kind_examples={{{kind}: 100}}"])
    assert sft_tasks(loose, spec) == sft_tasks(plain, spec)  # a cap that does not bind changes nothing
    with pytest.raises(ConfigError, match="sft.kind_examples: 'x' expects a count >= 0, got -1"):
        load_recipe(None, TINY + ["sft.kind_examples={x: -1}"])


def test_best_so_far_counts_evaluations_without_improvement():
    best = BestSoFar(patience=2)
    seen = [best.observe(step, value) for step, value in [(0, 0.5), (2, 0.4), (4, 0.6), (6, 0.6), (8, 0.5)]]
    assert seen == [True, False, True, False, False]  # a tie keeps the earlier weights
    assert (best.best, best.step, best.evals_since) == (0.6, 4, 2)
    assert best.exhausted
    restored = BestSoFar()
    restored.load_state_dict(best.state_dict())
    assert restored == best
    assert not BestSoFar(patience=0, evals_since=99).exhausted and BestSoFar().best == -math.inf


SELECT = TINY + ["train.val_tasks=4", "train.eval_every=1", "eval.temperature=0", "env.options.taskgen.n_train=12"]


def test_run_ends_on_the_best_validation_weights_and_never_trains_on_them(tmp_path):
    config = load_recipe(None, SELECT + ["train.steps=3", "optim.lr=5e-3"])
    seen: set[str] = set()

    def recording(trajectory, task):
        seen.add(task.id)
        return low_id_share(trajectory, task)

    trainer = rl_trainer(config, tmp_path, reward=recording)
    val_ids = {t.id for t in trainer.val_tasks}
    trainer.train()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all("val/reward" in r for r in records)
    best_step = int(records[-1]["val/best_step"])
    assert records[-1]["val/best_reward"] == max(r["val/reward"] for r in records)
    assert records[best_step]["val/reward"] == records[-1]["val/best_reward"]
    assert len(val_ids) == 4
    # validation tasks are scored (by `recording` too) but only in greedy validation
    # episodes: the sampler's training groups never hold them
    trained = {t.id for t in trainer.sampler.tasks}
    assert not trained & val_ids and val_ids <= seen
    final = get_peft_model_state_dict(trainer.policy.model)
    best = saved_weights(tmp_path / BEST_DIR)
    assert all(torch.equal(final[name], best[name]) for name in best)
    assert find_trained(tmp_path) == tmp_path / BEST_DIR
    last = saved_weights(latest_checkpoint(tmp_path))
    same_as_last = all(torch.equal(last[name], best[name]) for name in best)
    assert same_as_last == (best_step == 3)


def test_patience_stops_the_run_when_validation_stops_improving(tmp_path):
    config = load_recipe(None, SELECT + ["train.steps=5", "train.patience=2"])

    def constant(trajectory, task):  # validation never improves on step 0
        return 0.5, {"constant": 0.5}

    rl_trainer(config, tmp_path, reward=constant).train()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["val/best_step"] == 0.0
    assert latest_checkpoint(tmp_path).name.endswith("2")


def test_the_step_line_shows_validation_and_the_best_step():
    from ponder.runlog.progress import step_summary

    line = step_summary({"reward/mean": 0.25, "val/reward": 0.5, "val/best_step": 5.0})
    assert line.endswith("val +0.500 (best: step 5)")
    assert "val" not in step_summary({"reward/mean": 0.25})
