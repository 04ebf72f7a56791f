"""Several LoRA adapters RL-trained in one run on one frozen base.

Each adapter has its own recipe (tasks, reward, learning rate, seed, steps …) and its
own `RLTrainer`: sampler, optimizer state, LR schedule, KL controller, advantage state,
metrics log and checkpoints, in RUN_DIR/adapters/NAME, a normal run directory whose
checkpoints are PEFT adapters (`ponder eval --model RUN_DIR/adapters/NAME` loads it).
They share the base weights and the generation:

  every adapter's tasks ──one RolloutEngine run──▶ one batch of episodes, each row
      sampled with its own adapter (rollout/multi_adapter.py)
  ──▶ per adapter, grouped: activate it (the only trainable adapter) → its trainer's
      step (reward → advantages → update with its optimizer) → its log and checkpoint

An episode of adapter `a` on task `t` runs with the task id `a/t` (the backend reads
the adapter from it) and comes back with `t`, so every adapter's trainer sees the
trajectories a run of its own would. A step on one adapter cannot move another's
weights or optimizer state: only the active adapter's parameters require gradients,
and each optimizer holds its own adapter's parameters only.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ponder.config import Recipe
from ponder.envs.base import close_env
from ponder.models.loading import Policy
from ponder.models.memory import peak_rss_gb, release_memory
from ponder.models.multi_lora import AdapterView, activate, check_adapter
from ponder.rollout import RolloutEngine, RolloutStats
from ponder.train.rl import RLTrainer
from ponder.types import Task, Trajectory

ADAPTERS_DIR = "adapters"


@dataclass
class AdapterPart:
    """What one adapter trains on: its recipe, a factory of fresh environments, its
    training tasks and its reward ((trajectory, task) -> (total | None, breakdown))."""

    recipe: Recipe
    env_factory: Callable[[], Any]
    tasks: list[Task]
    reward: Callable[..., Any]


class _RoutedEnv:
    """An environment that becomes, at reset, one of the adapter named by the task id's prefix."""

    def __init__(self, factories: dict[str, Callable[[], Any]]) -> None:
        self.factories, self.inner = factories, None

    def reset(self, task: Task) -> Any:
        name, _, original = task.id.partition("/")
        self.inner = self.factories[name]()
        return self.inner.reset(replace(task, id=original))

    def step(self, action: str) -> Any:
        return self.inner.step(action)

    def close(self) -> None:
        close_env(self.inner)

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner" or self.__dict__.get("inner") is None:
            raise AttributeError(attr)
        return getattr(self.inner, attr)


class _RoutedFactory:
    def __init__(self, factories: dict[str, Callable[[], Any]]) -> None:
        self.factories = factories

    def __call__(self) -> _RoutedEnv:
        return _RoutedEnv(self.factories)

    def close(self) -> None:
        for factory in self.factories.values():
            close_env(factory)


class _Handed:
    """An adapter trainer's `Rollouts`: this step's episodes were rolled out with every
    adapter's (handed over as the pending result); a refill (algo.group_filter) runs
    this adapter's tasks alone."""

    def __init__(self, owner: MultiAdapterTrainer, name: str) -> None:
        self.owner, self.name = owner, name

    def begin_step(self, step: int) -> None:
        pass

    def run(self, tasks: list[Task]) -> tuple[list[Trajectory], RolloutStats]:
        return self.owner.rollout({self.name: tasks})[self.name]

    def result(self, pending: Any) -> tuple[list[Trajectory], RolloutStats]:
        return pending

    def step_metrics(self) -> dict[str, float]:
        return {}


class MultiAdapterTrainer:
    """N adapters of one PEFT model (models/multi_lora.attach_lora_adapters), one
    `RLTrainer` each; `train()` runs them in lockstep (see module docstring). `backend`
    is a MultiAdapterBackend on `policy`; `parts` maps adapter name -> AdapterPart."""

    def __init__(self, policy: Policy, parts: dict[str, AdapterPart], backend: Any, run_dir: str | Path) -> None:
        if not parts:
            raise ValueError("no adapters to train")
        self.policy, self.backend, self.run_dir = policy, backend, Path(run_dir)
        self.trainers: dict[str, RLTrainer] = {}
        for name, part in parts.items():
            check_adapter(policy.model, name)
            _check_part(name, part.recipe)
            activate(policy.model, name)  # its trainer's optimizer takes the trainable parameters: its own
            view = replace(policy, model=AdapterView(policy.model, name))
            trainer = RLTrainer(view, part.env_factory, part.tasks, part.reward, backend, part.recipe,
                                self.run_dir / ADAPTERS_DIR / name)  # fmt: skip
            trainer.use_rollouts(_Handed(self, name))
            self.trainers[name] = trainer
        first = next(iter(parts.values())).recipe.rollout
        # each adapter's episodes as concurrent as in a run of its own
        rollout = replace(first, batch_size=first.batch_size * len(parts))
        self.engine = RolloutEngine(backend, _RoutedFactory({n: p.env_factory for n, p in parts.items()}), rollout)

    def rollout(self, tasks: dict[str, list[Task]]) -> dict[str, tuple[list[Trajectory], RolloutStats]]:
        """Every adapter's tasks in one engine run; per adapter its trajectories (task
        ids as given) and the run's stats."""
        tagged = [replace(task, id=f"{name}/{task.id}") for name, batch in tasks.items() for task in batch]
        trajectories, stats = self.engine.run(tagged)
        out: dict[str, tuple[list[Trajectory], RolloutStats]] = {name: ([], stats) for name in tasks}
        for trajectory in trajectories:
            name, _, original = trajectory.task_id.partition("/")
            trajectory.task_id = original
            trajectory.group_id = trajectory.group_id.partition("/")[2]
            out[name][0].append(trajectory)
        return out

    def train_step(self) -> dict[str, dict[str, float]]:
        """One step of every adapter that has steps left; metrics per adapter."""
        live = {n: t for n, t in self.trainers.items() if t.step < t.recipe.train.steps and not t.stop_requested}
        tasks = {n: t.sampler.next_batch(t.recipe.train.tasks_per_step) for n, t in live.items()}
        self.policy.model.eval()
        tick = time.perf_counter()
        results = self.rollout(tasks)
        rollout_s = time.perf_counter() - tick
        metrics: dict[str, dict[str, float]] = {}
        for name, trainer in live.items():
            activate(self.policy.model, name)  # forward and backward grouped by adapter
            trainer._pending = (tasks[name], results[name])
            step = trainer.train_step()
            step.update({"policy/staleness": 0.0, "time/shared_rollout_s": rollout_s,
                         "multi/adapters_sampled_together": float(len(live))})  # fmt: skip
            metrics[name] = step
        return metrics

    def train(self, on_step: Callable[[str, int, dict[str, float]], None] | None = None) -> Path:
        """Run until every adapter has done its train.steps; returns the run directory.
        Each adapter logs to and checkpoints into RUN_DIR/adapters/NAME."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"adapters": {n: f"{ADAPTERS_DIR}/{n}" for n in self.trainers}}
        (self.run_dir / "adapters.json").write_text(json.dumps(summary, indent=2) + "\n")
        try:
            with contextlib.ExitStack() as stack:
                logs = {n: stack.enter_context(t._metrics_log()) for n, t in self.trainers.items()}
                while any(t.step < t.recipe.train.steps for t in self.trainers.values()):
                    for name, metrics in self.train_step().items():
                        trainer = self.trainers[name]
                        trainer.step += 1
                        metrics["memory/peak_gb"] = peak_rss_gb()
                        logs[name].log(trainer.step, metrics)
                        if on_step is not None:
                            on_step(name, trainer.step, metrics)
                        cfg = trainer.recipe.train
                        if trainer.step % cfg.save_every == 0 or trainer.step == cfg.steps:
                            trainer.save()
                    release_memory()
        finally:
            for trainer in self.trainers.values():
                trainer.close()
            close_env(self.engine.env_factory)
        return self.run_dir


def _check_part(name: str, recipe: Recipe) -> None:
    """What a trainer of one adapter among several cannot do, as a one-line ValueError."""
    train, algo = recipe.train, recipe.algo
    refusals = [
        (not recipe.lora.enabled, "lora.enabled=false (every adapter is a LoRA on the shared base)"),
        (train.async_rollouts, "train.async_rollouts (the adapters' rollouts are sampled together)"),
        (train.eval_every > 0, "train.eval_every (evaluate each adapter after the run: "
                               "ponder eval --model RUN_DIR/adapters/NAME)"),
        (train.val_tasks > 0, "train.val_tasks (evaluate each adapter after the run)"),
        (algo.sft_coef > 0, "algo.sft_coef"),
        (algo.distill_coef > 0, "algo.distill_coef"),
    ]
    for refused, what in refusals:
        if refused:
            raise ValueError(f"adapter {name}: multi-adapter training does not support {what}")
