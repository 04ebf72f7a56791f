"""LR schedule factors (hand values), the one seeded cycle of shuffled epochs, and the
deterministic, checkpointable task sampler built on it."""

import math
import random

import pytest
import torch

from ponder.config import OptimConfig
from ponder.train.optim import build_optimizer, lr_factor
from ponder.train.sampler import Cycle, ExampleSampler, TaskSampler, cycled_order
from ponder.types import Task


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_warmup_rises_linearly_to_the_peak_whatever_the_schedule(schedule):
    assert [lr_factor(s, 4, 100, schedule) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_constant_stays_at_the_peak():
    assert [lr_factor(s, 0, 10, "constant") for s in (0, 5, 10, 50)] == [1.0, 1.0, 1.0, 1.0]
    assert lr_factor(7, 2, 10, "constant") == 1.0


def test_linear_decays_to_zero_after_warmup():
    # warmup 2, total 10: decay over 8 steps from step 2.
    assert lr_factor(2, 2, 10, "linear") == 1.0
    assert lr_factor(4, 2, 10, "linear") == pytest.approx(0.75)
    assert lr_factor(6, 2, 10, "linear") == pytest.approx(0.5)
    assert lr_factor(10, 2, 10, "linear") == 0.0
    assert lr_factor(25, 2, 10, "linear") == 0.0  # clamped past the end


def test_cosine_hand_values():
    assert lr_factor(0, 0, 4, "cosine") == 1.0
    assert lr_factor(1, 0, 4, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # 0.853553
    assert lr_factor(1, 0, 4, "cosine") == pytest.approx(0.8535534)
    assert lr_factor(2, 0, 4, "cosine") == pytest.approx(0.5)
    assert lr_factor(4, 0, 4, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(3, 1, 5, "cosine") == pytest.approx(0.5)  # warmup 1: progress (3-1)/4


def test_built_scheduler_applies_the_factors_to_the_peak_lr():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer, scheduler = build_optimizer([param], OptimConfig(lr=0.1, warmup_steps=2, schedule="linear"), 6)
    lrs = []
    for _ in range(6):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.075, 0.05, 0.025])


def test_unknown_schedule_lists_the_valid_names():
    param = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="^unknown LR schedule 'cosin'; valid: constant, cosine, linear$"):
        build_optimizer([param], OptimConfig(schedule="cosin"), 10)


def test_nothing_to_train_is_an_error():
    with pytest.raises(ValueError, match="no parameter requires grad"):
        build_optimizer([], OptimConfig(), 10)


def _tasks(n):
    return [Task(id=f"t{i}", question=f"q{i}", answers=[str(i)]) for i in range(n)]


def _ids(batch):
    return [t.id for t in batch]


def test_every_task_once_per_epoch():
    sampler = TaskSampler(_tasks(5), seed=3)
    drawn = [t.id for _ in range(5) for t in sampler.next_batch(3)]  # 15 draws = 3 epochs
    for epoch in range(3):
        assert sorted(drawn[epoch * 5 : (epoch + 1) * 5]) == [f"t{i}" for i in range(5)]
    assert sampler.epoch == 2 and sampler.position == 5


def test_epochs_are_reshuffled():
    sampler = TaskSampler(_tasks(8), seed=0)
    epochs = [_ids(sampler.next_batch(8)) for _ in range(4)]
    assert len({tuple(e) for e in epochs}) > 1


def test_same_seed_same_sequence_different_seed_different():
    first = [_ids(TaskSampler(_tasks(8), seed=1).next_batch(20))]
    again = [_ids(TaskSampler(_tasks(8), seed=1).next_batch(20))]
    other = [_ids(TaskSampler(_tasks(8), seed=2).next_batch(20))]
    assert first == again
    assert first != other


@pytest.mark.parametrize("consumed", [3, 8, 11])  # mid-epoch, at an epoch's end, in the second epoch
def test_state_dict_continues_the_same_sequence(consumed):
    reference = TaskSampler(_tasks(8), seed=5)
    straight = _ids(reference.next_batch(consumed + 13))
    interrupted = TaskSampler(_tasks(8), seed=5)
    interrupted.next_batch(consumed)
    state = interrupted.state_dict()
    resumed = TaskSampler(_tasks(8), seed=5)
    resumed.load_state_dict(state)
    assert _ids(resumed.next_batch(13)) == straight[consumed:]


def test_a_cycle_is_whole_shuffled_epochs_one_after_another():
    order = cycled_order(5, 17, seed=3)
    for start in (0, 5, 10):
        assert sorted(order[start : start + 5]) == [0, 1, 2, 3, 4]
    assert len({tuple(order[0:5]), tuple(order[5:10]), tuple(order[10:15])}) > 1  # each epoch reshuffled
    assert order == Cycle(5, 3).next(17) and order != cycled_order(5, 17, seed=4)
    rng, epochs = random.Random(3), []  # one Random(seed), drawn on from epoch to epoch
    for _ in range(2):
        epoch = list(range(5))
        rng.shuffle(epoch)
        epochs += epoch
    assert order[:10] == epochs


@pytest.mark.parametrize("reseed", [False, True])
@pytest.mark.parametrize("consumed", [2, 5, 12])  # mid-epoch, at an epoch's end, in the third epoch
def test_a_cycle_resumed_from_its_state_continues_the_same_sequence(reseed, consumed):
    straight = Cycle(5, 7, reseed=reseed).next(consumed + 9)
    interrupted = Cycle(5, 7, reseed=reseed)
    interrupted.next(consumed)
    resumed = Cycle(5, 7, reseed=reseed)
    resumed.load_state_dict(interrupted.state_dict())
    assert resumed.next(9) == straight[consumed:]


def test_uniform_example_sampler_is_the_cycle_and_resumes():
    sampler = ExampleSampler(["a"] * 6, {}, seed=2)
    assert sampler.next(8) == cycled_order(6, 8, seed=2)
    again = ExampleSampler(["a"] * 6, {}, seed=2)
    again.load_state_dict(sampler.state_dict())
    assert again.next(5) == cycled_order(6, 13, seed=2)[8:]


def test_no_tasks_is_an_error():
    with pytest.raises(ValueError, match="no training tasks"):
        TaskSampler([], seed=0)


def _kinded(counts):
    return [
        Task(id=f"{kind}{i}", question="q", answers=["a"], kind=kind) for kind, n in counts.items() for i in range(n)
    ]


def test_stratified_batches_hold_every_kind_until_a_kind_runs_out():
    tasks = _kinded({"single_hop": 4, "multi_hop": 4, "in_prompt": 5})
    sampler = TaskSampler(tasks, seed=0, stratify=True)
    epoch = sampler.next_batch(13)
    assert sorted(t.id for t in epoch) == sorted(t.id for t in tasks)  # still every task once per epoch
    for start in range(0, 12, 3):  # the first 12 draws cycle through the three kinds
        assert {t.kind for t in epoch[start : start + 3]} == {"single_hop", "multi_hop", "in_prompt"}
    assert epoch[12].kind == "in_prompt"  # the one left over
    again = TaskSampler(tasks, seed=0, stratify=True)
    assert _ids(again.next_batch(13)) == _ids(epoch)
    state = sampler.state_dict()
    resumed = TaskSampler(tasks, seed=0, stratify=True)
    resumed.load_state_dict(state)
    assert _ids(resumed.next_batch(7)) == _ids(sampler.next_batch(7))


def test_shared_optimizer_step_clips_and_refuses_a_nan_gradient():
    from ponder.train.optim import NonFiniteError, optimizer_step

    weight = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    optimizer, scheduler = build_optimizer([weight], OptimConfig(lr=0.1, weight_decay=0.0), 10)
    weight.grad = torch.tensor([3.0, 4.0])  # norm 5, clipped to 1
    norm, lr = optimizer_step([weight], optimizer, scheduler, 1.0)
    assert (norm, lr) == (5.0, 0.1)
    assert weight.grad is None and not torch.equal(weight.detach(), torch.tensor([1.0, 1.0]))
    before = weight.detach().clone()
    weight.grad = torch.tensor([float("nan"), 1.0])
    with pytest.raises(NonFiniteError):
        optimizer_step([weight], optimizer, scheduler, 1.0)
    assert torch.equal(weight.detach(), before) and weight.grad is None  # nothing applied, gradient dropped


def test_unshuffled_sampler_takes_the_tasks_in_order():
    tasks = [Task(str(i), "q", ["a"]) for i in range(3)]
    sampler = TaskSampler(tasks, seed=1, shuffle=False)
    assert [t.id for t in sampler.next_batch(4)] == ["0", "1", "2", "0"]


def _scored(tasks, rewards_by_kind, group_size=2):
    from ponder.types import Trajectory

    episodes = []
    for task in tasks:
        for sample, reward in zip(range(group_size), rewards_by_kind[task.kind]):
            episodes.append(Trajectory(task_id=task.id, prompt_ids=[1], response_ids=[2], loss_mask=[1], old_logprobs=[0.0],
                                       reward=reward, group_id=f"{task.id}/g"))  # fmt: skip
    return episodes


def test_curriculum_moves_tasks_to_the_kinds_with_signal_and_keeps_a_floor():
    from ponder.train.sampler import CurriculumSampler

    tasks = _kinded({"a": 10, "b": 10, "c": 10})
    sampler = CurriculumSampler(tasks, seed=0, curriculum="informative", floor=0.25, momentum=0.0)
    first = sampler.next_batch(6)
    assert sorted(t.kind for t in first) == ["a", "a", "b", "b", "c", "c"]  # no signal seen yet: uniform
    # kind a's groups differ in reward, b's and c's are all equal (no gradient)
    metrics = sampler.observe(first, _scored(first, {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0]}))
    assert metrics["curriculum/a/signal"] == 1.0 and metrics["curriculum/b/signal"] == 0.0
    # shares: 0.25/3 + 0.75 for a, 0.25/3 for b and c -> 12 slots: 10, 1, 1
    assert metrics["curriculum/a/share"] == pytest.approx(0.25 / 3 + 0.75)
    second = [t.kind for t in sampler.next_batch(12)]
    assert (second.count("a"), second.count("b"), second.count("c")) == (10, 1, 1)


def test_curriculum_sampler_state_continues_the_same_sequence():
    from ponder.train.sampler import CurriculumSampler

    tasks = _kinded({"a": 5, "b": 7})
    first = CurriculumSampler(tasks, 3, "informative", 0.5, 0.5)
    batch = first.next_batch(4)
    first.observe(batch, _scored(batch, {"a": [1.0, 0.0], "b": [0.0, 0.0]}))
    state = first.state_dict()
    second = CurriculumSampler(tasks, 3, "informative", 0.5, 0.5)
    second.load_state_dict(state)
    assert [t.id for t in first.next_batch(9)] == [t.id for t in second.next_batch(9)]
