"""A trainer from a recipe: every part (policy, environment factory and tasks,
reward, backend, validation split, SFT demonstrations) built with ponder.wiring and
handed to the trainer, which never builds a world itself."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ponder.config import Recipe
from ponder.models import Policy
from ponder.models.prepare import prepare_policy
from ponder.rollout.build import build_backend
from ponder.train.rl import RLTrainer, check_recipe
from ponder.train.sft import build_demonstrations, train_and_save
from ponder.train.teacher import check_teacher_kinds, load_teacher
from ponder.train.validation import recipe_validation
from ponder.types import Trajectory
from ponder.wiring import build_env, build_reward, sft_tasks, train_tasks


def rl_trainer(
    recipe: Recipe, run_dir: str | Path, policy: Policy | None = None, reward: Callable[..., object] | None = None,
    trainer_class: type[RLTrainer] = RLTrainer,
) -> RLTrainer:
    """Every part from the recipe; `policy` and `reward` replace the recipe's
    (`trainer_class`: a subclass of RLTrainer to build instead)."""
    check_recipe(recipe)  # fail on a typo before any model or data loads
    seed_everything(recipe.train.seed)
    policy = prepare_policy(recipe, policy)
    spec = build_env(recipe, policy.tokenizer)
    reward = reward or build_reward(recipe, spec, policy)
    backend = build_backend(policy, recipe)
    tasks, val_tasks = recipe_validation(recipe, train_tasks(recipe, spec))
    demonstrations = recipe_demonstrations(recipe, policy) if recipe.algo.sft_coef > 0 else []
    trainer = trainer_class(policy, spec.factory, tasks, reward, backend, recipe, run_dir, val_tasks)
    trainer.use_demonstrations(demonstrations)
    check_teacher_kinds(recipe.teacher, {task.kind for task in tasks})
    trainer.teacher = load_teacher(recipe.teacher, policy)
    return trainer


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's global generators, from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def recipe_demonstrations(recipe: Recipe, policy: Policy) -> list[Trajectory]:
    """The recipe's SFT demonstrations: sft.examples training tasks of sft.task_kinds
    (less RL's validation split under train.val_outside_sft), replayed with
    sft.behaviour (and sft.oracle_fraction)."""
    with build_env(recipe, policy.tokenizer) as spec:
        held = set()
        if recipe.train.val_outside_sft:
            held = {t.id for t in recipe_validation(recipe, train_tasks(recipe, spec))[1]}
        tasks = sft_tasks(recipe, spec, held)
        return build_demonstrations(tasks, recipe.sft.behaviour, spec.factory, policy, recipe,
                                    recipe.sft.oracle_fraction)  # fmt: skip


def warm_up(
    recipe: Recipe, policy: Policy, log_dir: Path, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> list[dict[str, float]]:
    """The recipe's SFT stage: demonstrations of sft.task_kinds, then sft_train (logged
    in log_dir; on_step(step, metrics) after each step too); the trained weights are
    saved in log_dir (models.adapters)."""
    demonstrations = recipe_demonstrations(recipe, policy)
    return train_and_save(policy, demonstrations, recipe.sft, recipe.train.seed, recipe.algo.micro_batch_size,
                          log_dir, on_step)  # fmt: skip

