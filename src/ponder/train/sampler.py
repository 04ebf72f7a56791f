"""Deterministic sampling for training: one seeded cycle of shuffled epochs (`Cycle`)
under every trainer that cycles through its data (RL's tasks, SFT's examples and
demonstrations, DPO's pairs, the RL update's demonstration anchor), weighted draws by
task type (SFT's task weights), and a curriculum over task kinds (train.curriculum)."""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import torch

from ponder.algos.curriculum import CURRICULA, allocate, update_signal
from ponder.algos.filters import informative_groups
from ponder.types import Task, Trajectory

# Orders one epoch in place: (indices, rng) -> indices.
Permute = Callable[[list[int], random.Random], list[int]]

NO_TASKS = ("no training tasks to sample from (check train.task_kinds and the environment's training tasks, "
            "e.g. env.options.taskgen.n_train for search_qa)")


def shuffled(indices: list[int], rng: random.Random) -> list[int]:
    rng.shuffle(indices)
    return indices


def in_order(indices: list[int], rng: random.Random) -> list[int]:
    return indices


class Cycle:
    """Indices into n items, epoch after epoch, each epoch ordered by `permute` with a
    seeded RNG and consumed in order; checkpointable.

    The RNG is one Random(seed) drawn on from epoch to epoch, or with `reseed` a
    fresh Random(seed * 1_000_003 + epoch) each epoch (RL's task order: any epoch is
    known from its number, the state is two integers). The two schemes are the two
    orders recorded runs were made with; neither is better.
    """

    def __init__(self, n: int, seed: int, permute: Permute = shuffled, reseed: bool = False) -> None:
        if n <= 0:
            raise ValueError("nothing to cycle through")
        self.n, self.seed, self.permute, self.reseed = n, seed, permute, reseed
        self.rng = random.Random(seed)
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        if self.reseed:
            self.rng.seed(self.seed * 1_000_003 + self.epoch)
        self._start = self.rng.getstate()  # what a checkpoint keeps to redraw this epoch
        return self.permute(list(range(self.n)), self.rng)

    def next(self, count: int) -> list[int]:
        picked = []
        while len(picked) < count:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            picked.append(self._order[self.position])
            self.position += 1
        return picked

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position}
        if not self.reseed:
            state["rng"] = self._start
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        if not self.reseed:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
        self._order = self._permutation()


def cycled_order(n: int, length: int, seed: int) -> list[int]:
    """The first `length` indices of Cycle(n, seed): seeded shuffles of range(n), one after another."""
    return Cycle(n, seed).next(length)


class ExampleSampler:
    """Seeded draws of example indices. Equal weights: a Cycle of shuffled epochs;
    otherwise independent draws with probability ∝ the weight of the example's task type."""

    def __init__(self, task_types: list[str], weights: dict[str, float], seed: int) -> None:
        self.weights = [float(weights.get(t, 1.0)) for t in task_types]
        if any(w < 0 for w in self.weights) or not any(self.weights):
            raise ValueError(f"task weights must be >= 0 with one > 0, got {weights}")
        self.cycle = Cycle(len(self.weights), seed) if len(set(self.weights)) == 1 else None
        self.rng = random.Random(seed)

    def next(self, count: int) -> list[int]:
        if self.cycle is not None:
            return self.cycle.next(count)
        return self.rng.choices(range(len(self.weights)), weights=self.weights, k=count)

    def state_dict(self) -> dict[str, Any]:
        return self.cycle.state_dict() if self.cycle is not None else {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.cycle is not None:
            self.cycle.load_state_dict(state)
        else:
            self.rng.setstate(state["rng"])


def round_robin(kinds: list[str], rng: random.Random, shuffle_kinds: bool = False) -> list[int]:
    """Indices of items whose kinds are `kinds`: one of each kind in turn (kinds in
    sorted order, or shuffled by rng with shuffle_kinds), each kind's items shuffled by rng."""
    by_kind: dict[str, list[int]] = {}
    for index, kind in enumerate(kinds):
        by_kind.setdefault(kind, []).append(index)
    queues = [by_kind[kind] for kind in sorted(by_kind)]
    for queue in queues:
        rng.shuffle(queue)
    if shuffle_kinds:
        rng.shuffle(queues)
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


class TaskSampler:
    """Yields batches of tasks from a Cycle with a fresh seeded permutation each epoch; checkpointable.

    stratify: interleave task kinds (one of each kind in turn, each kind shuffled),
    so every batch of at least as many tasks as kinds holds every kind: a step's
    update then never sees only one kind's lesson (e.g. "skip the search") with
    nothing from the kinds where that lesson is wrong.
    shuffle=False: the tasks in list order, cycling (TRL's shuffle_dataset=False).
    """

    def __init__(self, tasks: list[Task], seed: int, stratify: bool = False, shuffle: bool = True) -> None:
        if not tasks:
            raise ValueError(NO_TASKS)
        self.tasks = tasks
        kinds = [task.kind for task in tasks]
        permute: Permute = shuffled
        if not shuffle:
            permute = in_order
        elif stratify:
            permute = lambda indices, rng: round_robin(kinds, rng, shuffle_kinds=True)  # noqa: E731
        self.cycle = Cycle(len(tasks), seed, permute, reseed=True)

    @property
    def epoch(self) -> int:
        return self.cycle.epoch

    @property
    def position(self) -> int:
        return self.cycle.position

    def next_batch(self, size: int) -> list[Task]:
        return [self.tasks[i] for i in self.cycle.next(size)]

    def observe(self, tasks: list[Task], trajectories: list[Trajectory]) -> dict[str, float]:
        """No feedback: the order is fixed by the seed (CurriculumSampler's has one)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.cycle.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cycle.load_state_dict(state)


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
            raise ValueError(NO_TASKS)
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
