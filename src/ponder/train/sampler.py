"""Deterministic task sampling for training: shuffled epochs over the task list, or a
curriculum over task kinds (train.curriculum)."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from ponder.algos.curriculum import CURRICULA, allocate, update_signal
from ponder.algos.filters import informative_groups
from ponder.types import Task, Trajectory


class TaskSampler:
    """Yields batches from a fresh seeded permutation each epoch; checkpointable.

    stratify: interleave task kinds (one of each kind in turn, each kind shuffled),
    so every batch of at least as many tasks as kinds holds every kind: a step's
    update then never sees only one kind's lesson (e.g. "skip the search") with
    nothing from the kinds where that lesson is wrong.
    shuffle=False: the tasks in list order, cycling (TRL's shuffle_dataset=False).
    """

    def __init__(self, tasks: list[Task], seed: int, stratify: bool = False, shuffle: bool = True) -> None:
        if not tasks:
            raise ValueError("no training tasks to sample from (check train.task_kinds and env.taskgen.n_train)")
        self.tasks = tasks
        self.seed = seed
        self.stratify = stratify
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        if not self.shuffle:
            return list(range(len(self.tasks)))
        if not self.stratify:
            order = list(range(len(self.tasks)))
            rng.shuffle(order)
            return order
        by_kind: dict[str, list[int]] = {}
        for index, task in enumerate(self.tasks):
            by_kind.setdefault(task.kind, []).append(index)
        queues = [by_kind[kind] for kind in sorted(by_kind)]
        for queue in queues:
            rng.shuffle(queue)
        rng.shuffle(queues)
        return [queue[i] for i in range(max(map(len, queues))) for queue in queues if i < len(queue)]

    def next_batch(self, size: int) -> list[Task]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            batch.append(self.tasks[self._order[self.position]])
            self.position += 1
        return batch

    def observe(self, tasks: list[Task], trajectories: list[Trajectory]) -> dict[str, float]:
        """No feedback: the order is fixed by the seed (CurriculumSampler's has one)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()


class CurriculumSampler:
    """Batches whose mix of task kinds follows a curriculum (ponder.algos.curriculum):
    each kind is drawn from its own shuffled epochs (a TaskSampler over that kind), and
    a batch holds `allocate(shares, size)` tasks of each kind, interleaved. `observe`
    feeds back which of a step's groups carried a signal; the shares of later batches
    follow it. Checkpointable like TaskSampler.

    The initial signal is 1 for every kind (uniform shares until something is seen).
    """

    def __init__(self, tasks: list[Task], seed: int, curriculum: str, floor: float, momentum: float) -> None:
        self.shares_of = CURRICULA.get(curriculum)
        self.floor, self.momentum = floor, momentum
        by_kind: dict[str, list[Task]] = {}
        for task in tasks:
            by_kind.setdefault(task.kind, []).append(task)
        if not by_kind:
            raise ValueError("no training tasks to sample from (check train.task_kinds and env.taskgen.n_train)")
        self.kinds = sorted(by_kind)
        self.samplers = [TaskSampler(by_kind[kind], seed * 31 + i) for i, kind in enumerate(self.kinds)]
        self.signal = torch.ones(len(self.kinds), dtype=torch.float64)

    def shares(self) -> list[float]:
        return self.shares_of(self.signal, self.floor).tolist()

    def next_batch(self, size: int) -> list[Task]:
        counts = allocate(torch.tensor(self.shares(), dtype=torch.float64), size)
        parts = [sampler.next_batch(count) for sampler, count in zip(self.samplers, counts)]
        return [part[i] for i in range(max(counts, default=0)) for part in parts if i < len(part)]

    def observe(self, tasks: list[Task], trajectories: list[Trajectory]) -> dict[str, float]:
        """Update each kind's informative-group rate from one step's scored episodes;
        returns the curriculum's metrics (each kind's signal and next share)."""
        kind_of = {task.id: task.kind for task in tasks}
        rewards = torch.tensor([t.reward if t.reward is not None else math.nan for t in trajectories])
        keep = informative_groups(rewards, [t.group_id for t in trajectories]).tolist()
        groups: dict[str, tuple[str, bool]] = {t.group_id: (kind_of[t.task_id], k) for t, k in zip(trajectories, keep)}
        observed = torch.zeros(len(self.kinds), dtype=torch.float64)
        seen = torch.zeros(len(self.kinds), dtype=torch.bool)
        for index, kind in enumerate(self.kinds):
            flags = [informative for group_kind, informative in groups.values() if group_kind == kind]
            if flags:
                observed[index], seen[index] = sum(flags) / len(flags), True
        self.signal = update_signal(self.signal, observed, seen, self.momentum)
        shares = self.shares()
        metrics = {f"curriculum/{kind}/signal": float(s) for kind, s in zip(self.kinds, self.signal)}
        metrics.update({f"curriculum/{kind}/share": share for kind, share in zip(self.kinds, shares)})
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"kinds": [s.state_dict() for s in self.samplers], "signal": self.signal.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for sampler, sub in zip(self.samplers, state["kinds"]):
            sampler.load_state_dict(sub)
        self.signal = torch.tensor(state["signal"], dtype=torch.float64)


def build_sampler(tasks: list[Task], cfg: Any) -> TaskSampler | CurriculumSampler:
    """The recipe's task sampler: a curriculum over kinds when train.curriculum is not
    `none`, else shuffled (optionally stratified) epochs."""
    if not CURRICULA.trait(cfg.curriculum, "adaptive"):
        return TaskSampler(tasks, cfg.seed, cfg.stratify, cfg.shuffle)
    return CurriculumSampler(tasks, cfg.seed, cfg.curriculum, cfg.curriculum_floor, cfg.curriculum_momentum)
