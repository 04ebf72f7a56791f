"""Weighted sums of named reward components that keep the per-component breakdown."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ponder.registry import Registry
from ponder.rewards.format import format_compliance
from ponder.rewards.qa import exact_match, token_f1
from ponder.rewards.search import plan_kept, search_calls, search_calls_excess, search_calls_if_correct
from ponder.types import Task, Trajectory

RewardFn = Callable[[Trajectory, Task], float | None]



def turn_rewards_total(trajectory: Trajectory, task: Task) -> float | None:
    """The sum of the per-turn rewards the environment gave (None when it gave none)."""
    given = [t.reward for t in trajectory.turns if t.reward is not None]
    return float(sum(given)) if given else None


REWARDS: Registry[RewardFn] = Registry("reward component")
for _name, _fn in {
    "em": exact_match,
    "f1": token_f1,
    "format": format_compliance,
    "search_cost": search_calls,
    "search_cost_if_correct": search_calls_if_correct,
    "search_cost_excess": search_calls_excess,
    "plan_kept": plan_kept,
    "turn_rewards": turn_rewards_total,
}.items():
    REWARDS.add(_name, _fn)
del _name, _fn


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make a (trajectory, task) -> float | None callable a reward component
    (a name already taken by another callable is refused)."""
    return REWARDS.register(name)


class RewardError(ValueError):
    """A reward component returned something that is not a finite number or None."""


class CompositeReward:
    """total = sum(weight x component). A component with a nonzero weight that
    returns None makes the whole episode unscorable (total None), because a partial
    sum would silently mean something different from the configured reward.

    Components are looked up in `components` (an environment's own), then in the
    registry REWARDS, then as import paths `module:function`."""

    def __init__(self, weights: Mapping[str, float], components: Mapping[str, RewardFn] | None = None):
        self.components = {name: _component(name, components or {}) for name in weights}
        self.weights = {name: float(weight) for name, weight in weights.items()}

    @classmethod
    def from_config(
        cls, cfg: Any, components: Mapping[str, RewardFn] | None = None, defaults: Mapping[str, float] | None = None
    ) -> CompositeReward:
        """Weights from a RewardConfig: `defaults` (the environment's default weights,
        EnvSpec.reward_weights; none when None) updated by cfg.terms, plus cfg.shaping's
        nonzero penalties."""
        base = dict(defaults or {})
        shaping = getattr(cfg, "shaping", None)
        if shaping is not None:  # reward-hacking penalties: components `shaping/*`, weight -penalty
            from ponder.rewards.hacking import shaping_components

            shaped, penalties = shaping_components(shaping)
            components, base = {**(components or {}), **shaped}, {**base, **penalties}
        return cls({**base, **dict(cfg.terms)}, components)

    def __call__(self, trajectory: Trajectory, task: Task) -> tuple[float | None, dict[str, float]]:
        """(total, {component name: raw component value}); zero-weight components are
        still computed so they can be logged, and a None value is left out. A
        component marked `uses_breakdown` (a shaping rule over other components) is
        called with the breakdown of the others, after them."""
        total: float | None = 0.0
        breakdown: dict[str, float] = {}
        derived = [name for name in self.weights if getattr(self.components[name], "uses_breakdown", False)]
        plain = [name for name in self.weights if name not in derived]
        for name in plain + derived:
            weight, fn = self.weights[name], self.components[name]
            value = fn(dict(breakdown)) if name in derived else fn(trajectory, task)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            ):
                raise RewardError(f"reward '{name}' returned {value!r} for task {task.id} (want a finite number or None)")
            if value is None:
                if weight != 0.0:
                    total = None
                continue
            breakdown[name] = float(value)
            if total is not None:
                total += weight * value
        return total, breakdown

    def __repr__(self) -> str:
        return f"CompositeReward({self.weights!r})"


class PartReward:
    """The reward of a mixture of environments (ponder.envs.mixture): each task scored
    by its part's own reward, given the task as that part made it. `part_of(task)` is
    (part name, that task); `parts` is part name → (trajectory, task) -> (total, breakdown)."""

    def __init__(self, parts: Mapping[str, Callable[[Trajectory, Task], tuple[float | None, dict[str, float]]]],
                 part_of: Callable[[Task], tuple[str, Task]]) -> None:  # fmt: skip
        self.parts = dict(parts)
        self.part_of = part_of

    def __call__(self, trajectory: Trajectory, task: Task) -> tuple[float | None, dict[str, float]]:
        name, own = self.part_of(task)
        if name not in self.parts:
            raise KeyError(f"task {task.id!r}: no part {name!r} of the mixture ({', '.join(self.parts)})")
        return self.parts[name](trajectory, own)

    def __repr__(self) -> str:
        return f"PartReward({self.parts!r})"


def _component(name: str, components: Mapping[str, RewardFn]) -> RewardFn:
    if name in components:
        return components[name]
    if name in REWARDS:
        return REWARDS.get(name)
    if ":" in name:
        from ponder.plugins import import_object

        fn = import_object(name, "reward")
        if not callable(fn):
            raise ValueError(f"reward '{name}': not callable")
        return fn
    valid = sorted({*components, *REWARDS})
    raise ValueError(f"unknown reward component(s) ['{name}']; valid: {', '.join(valid)}, or 'module:function'")


def score_trajectories(
    trajectories: Iterable[Trajectory],
    tasks_by_id: Mapping[str, Task],
    reward: Callable[[Trajectory, Task], tuple[float | None, dict[str, float]]],
) -> None:
    """Set `reward` and `breakdown` on each trajectory in place."""
    for trajectory in trajectories:
        task = tasks_by_id.get(trajectory.task_id)
        if task is None:
            raise KeyError(f"trajectory refers to unknown task id {trajectory.task_id!r}")
        trajectory.reward, trajectory.breakdown = reward(trajectory, task)
