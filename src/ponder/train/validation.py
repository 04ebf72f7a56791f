"""Model selection during RL: a validation split carved out of the training tasks,
evaluated every train.eval_every steps (and before the first step); the best adapter
so far is kept in RUN_DIR/best, the run stops early when validation has not improved
for train.patience evaluations, and the policy ends on the best weights.

The held-out test tasks are never used to choose: selection on them would make the
reported gain optimistic. Validation tasks are removed from RL's sampler only (the
SFT warm-up may have seen their demonstrations, which favours the warm-up, step 0:
selection stays conservative), unless train.val_outside_sft keeps them out of the
warm-up too.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ponder.config import Recipe
from ponder.models import Policy
from ponder.rewards import score_trajectories
from ponder.rollout import build_engine
from ponder.train.sampler import round_robin
from ponder.types import Task

BEST_DIR = "best"


def split_validation(tasks: list[Task], n: int, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, validation): `n` tasks held out, taken from each kind in turn (each kind
    shuffled with `seed`), so validation covers the kinds RL trains on. n=0 keeps all."""
    if n <= 0:
        return list(tasks), []
    if n >= len(tasks):
        raise ValueError(f"train.val_tasks={n} leaves no training tasks (there are {len(tasks)})")
    interleaved = round_robin([task.kind for task in tasks], random.Random(seed * 7_919 + n))
    held = {tasks[i].id for i in interleaved[:n]}
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def recipe_validation(recipe: Recipe, tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """The recipe's (train, validation) split of RL's training tasks: train.val_tasks
    held out, drawn with train.seed, or with seed 0 under train.val_outside_sft (the
    SFT warm-up leaves the same tasks out, whichever RL seed runs after it)."""
    seed = 0 if recipe.train.val_outside_sft else recipe.train.seed
    return split_validation(tasks, recipe.train.val_tasks, seed)


@dataclass
class BestSoFar:
    """The best validation reward so far, its step, and evaluations since it improved.

    patience: stop after this many evaluations without improvement (0 = never).
    A tie does not count as an improvement: the earlier (less trained) weights stay.
    """

    patience: int = 0
    best: float = -math.inf
    step: int = -1
    evals_since: int = 0

    def observe(self, step: int, value: float) -> bool:
        """Record one evaluation; True when it is a new best."""
        if value > self.best:
            self.best, self.step, self.evals_since = value, step, 0
            return True
        self.evals_since += 1
        return False

    @property
    def exhausted(self) -> bool:
        return self.patience > 0 and self.evals_since >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def validate(
    policy: Policy, env_factory: Callable[[], Any], tasks: list[Task], reward: Callable[..., Any], recipe: Recipe
) -> dict[str, float]:
    """One episode per validation task at eval.temperature (0 = greedy), scored by the
    training reward; returns `val/reward` and each reward component as `val/<name>`."""
    from ponder.eval.metrics import summarise
    from ponder.rollout.build import build_backend

    sampling = replace(recipe.rollout.sampling, temperature=recipe.eval.temperature)
    batch = recipe.eval.batch_size or recipe.rollout.batch_size
    rollout = replace(recipe.rollout, sampling=sampling, group_size=1, batch_size=batch)
    backend = build_backend(policy, recipe, sampling, seed=recipe.rollout.seed)
    trajectories, _ = build_engine(backend, env_factory, rollout).run(tasks)
    tasks_by_id = {task.id: task for task in tasks}
    score_trajectories(trajectories, tasks_by_id, reward)
    summary = summarise(trajectories, tasks_by_id)
    metrics = {"val/reward": float(summary["reward"])}
    metrics.update({f"val/{name}": float(value) for name, value in summary.get("components", {}).items()})
    return metrics
