"""Deterministic task sampling for training: shuffled epochs over the task list."""

from __future__ import annotations

import random
from typing import Any

from ponder.types import Task


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

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()
