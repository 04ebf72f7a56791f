"""`ponder train` as a function: resume or a new run directory, the SFT warm-up (or a
finished run's), then RL in this process, with rollouts on Ray workers, or with the
learner in a Ray actor."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.config import Recipe, apply_overrides, from_dict, load_recipe, save_recipe, to_dict
from ponder.jobs.demo import copy_warm_up, warm_up_weights
from ponder.jobs.parts import rl_trainer, warm_up
from ponder.models.adapters import MANIFEST, load_adapter_weights, trainable_state
from ponder.models.prepare import prepare_policy
from ponder.rundir import check_resume_recipe, claim_run_dir, discard_on_error, require_run_dir
from ponder.runlog.progress import item_progress, training_progress
from ponder.train.ray.learner import RayLearner
from ponder.train.ray.rollouts import RayRollouts, check_address
from ponder.train.rl import check_recipe
from ponder.wiring import check_parts


@dataclass
class TrainOptions:
    """What `ponder train` was asked: a recipe file or a loaded Recipe (or a run to
    resume), key=value overrides, the starting model, the run directory, and where
    to run (ray: None, "local" or an address)."""

    recipe: str | Recipe | None = None
    resume: str | None = None
    out: str | None = None
    model: str | None = None
    overwrite: bool = False
    sft_from: str | None = None
    allow_recipe_change: bool = False
    ray: str | None = None
    overrides: list[str] = field(default_factory=list)


def run_train(args: TrainOptions) -> int:
    """`ponder train`: the recipe checked, the run directory claimed (or resumed), the SFT
    warm-up (or a finished run's, --sft-from), then RL here, on Ray workers, or with
    the learner in a Ray actor. Returns the exit code."""

    overrides = args.overrides + ([f"model.name={args.model}"] if args.model else [])
    if args.resume:
        # a recipe.yaml alone: stopped during the warm-up, which is then run again
        state = ("checkpoints/latest", "checkpoints", f"sft/{MANIFEST}", "recipe.yaml")
        anew = f"a new one: ponder train --recipe RECIPE --out {args.resume}"
        run_dir = require_run_dir(args.resume, state, anew)
        recipe = load_recipe(run_dir / "recipe.yaml", overrides)
        saved = to_dict(load_recipe(run_dir / "recipe.yaml"))  # settings added to ponder since: defaults
        check_resume_recipe(saved, to_dict(recipe), args.allow_recipe_change)
        save_recipe(recipe, run_dir / "recipe.yaml")
    elif isinstance(args.recipe, Recipe):
        recipe = from_dict(Recipe, apply_overrides(to_dict(args.recipe), overrides))
    else:
        recipe = load_recipe(args.recipe, overrides)
    check_recipe(recipe)
    check_parts(recipe)  # bad envs, task files and rewards fail before anything is written
    if args.ray:  # so do a missing Ray and a cluster address that does not answer
        check_address(args.ray)
    if args.sft_from:  # so does a warm-up made with other settings
        if args.resume:
            raise ValueError("--sft-from starts a new run; give it with --recipe, not --resume")
        warm_up_from = warm_up_weights(args.sft_from, recipe)[0]
    policy = prepare_policy(recipe)  # so do bad model names and paths
    if not args.resume:
        run_dir = claim_run_dir(args.out or recipe.train.out, args.overwrite, can_resume=True)
    with discard_on_error(run_dir, fresh=not args.resume):
        if not args.resume:
            save_recipe(recipe, run_dir / "recipe.yaml")
            if args.sft_from:
                load_adapter_weights(policy.model, copy_warm_up(warm_up_from, run_dir))
            elif recipe.sft.steps > 0:
                _warm_up(recipe, policy, run_dir)
        elif not (run_dir / "checkpoints" / "latest").is_file():  # stopped before RL's first checkpoint
            _resume_warm_up(recipe, policy, run_dir)
        if args.ray and recipe.train.ray_learner:  # the learner is a Ray actor; this process orchestrates
            learner = _ray_learner(args, recipe, policy, run_dir)
        else:
            trainer = rl_trainer(recipe, run_dir, policy=policy)
    if args.ray and recipe.train.ray_learner:
        return _train_ray_learner(learner, recipe, run_dir)
    return _train_here(args, trainer, recipe, run_dir)


def _warm_up(recipe: Recipe, policy: Any, run_dir: Path) -> None:
    with item_progress("SFT steps", recipe.sft.steps) as advance:
        warm_up(recipe, policy, run_dir / "sft", advance)


def _resume_warm_up(recipe: Recipe, policy: Any, run_dir: Path) -> None:
    """--resume of a run without an RL checkpoint: its finished warm-up loaded, or, when it
    was stopped during the warm-up (no sft/ manifest), the warm-up run again from the
    start, the partial one removed first (the SFT loop keeps no checkpoints of its own)."""
    sft = run_dir / "sft"
    if (sft / MANIFEST).is_file():
        load_adapter_weights(policy.model, sft)
    elif recipe.sft.steps > 0:
        print(f"ponder train: {run_dir} was stopped during its SFT warm-up; warming up again from the start")
        shutil.rmtree(sft, ignore_errors=True)
        _warm_up(recipe, policy, run_dir)


def _train_here(args: TrainOptions, trainer: Any, recipe: Any, run_dir: Any) -> int:
    """The learner in this process (its rollouts here or, with --ray, on Ray workers)."""

    start = trainer.resume() if args.resume else 0
    with contextlib.ExitStack() as stack:
        if args.ray:
            address = None if args.ray == "local" else args.ray
            trainer.use_rollouts(stack.enter_context(RayRollouts(recipe, trainer.policy, address)))
            print(f"ponder train: rollouts on {recipe.train.ray_workers} Ray workers ({address or 'local cluster'})")
        print(f"ponder train: {recipe.algo.advantage}/{recipe.algo.loss} from step {start} to {recipe.train.steps} in {run_dir}")
        with training_progress(recipe.train.steps, start) as on_step:
            trainer.train(on_step)
    stopped = " (stopped early; resume with --resume)" if trainer.step < recipe.train.steps else ""
    print(f"ponder train: step {trainer.step}{stopped}; metrics in {run_dir / 'metrics.jsonl'}")
    return 0


def _ray_learner(args: TrainOptions, recipe: Any, policy: Any, run_dir: Any) -> Any:
    """The learner actor of `ponder train --ray` (train.ray_learner), built on the cluster;
    it starts from the driver's weights when an SFT warm-up made them."""
    start_state = trainable_state(policy.model) if recipe.sft.steps > 0 or args.sft_from else None
    address = None if args.ray == "local" else args.ray
    return RayLearner(recipe, run_dir, rl_trainer, address, start_state, resume=bool(args.resume))


def _train_ray_learner(learner: Any, recipe: Any, run_dir: Any) -> int:

    cfg = recipe.train
    with learner:
        where = f"{'a GPU' if learner.gpus else 'a CPU'}; {cfg.ray_workers} rollout workers"
        envs = f", {cfg.ray_env_workers} env workers" if cfg.ray_env_workers else ""
        print(f"ponder train: learner on Ray ({where}{envs})")
        algo = f"{recipe.algo.advantage}/{recipe.algo.loss}"
        print(f"ponder train: {algo} from step {learner.start} to {cfg.steps} in {run_dir}")
        with training_progress(cfg.steps, learner.start) as on_step:
            step = learner.train(on_step)
    stopped = " (stopped early; resume with --resume)" if step < cfg.steps else ""
    print(f"ponder train: step {step}{stopped}; metrics in {run_dir / 'metrics.jsonl'}")
    return 0
