"""One SFT warm-up shared by several recipes (`ponder warmup`).

Each recipe's demonstrations are built as its own warm-up builds them (its
environment, its `sft` section); one adapter is trained on all of them together;
and every recipe gets a run directory, OUT/NAME, holding that adapter and the recipe
as the warm-up ran it, which `ponder demo --sft-from` and `ponder train --sft-from`
take. RL runs on different tasks then start from the same weights, so what each
one changed is measured from the shared warm-up: the setting in which task vectors
are small edits of one model and merging them (`ponder merge` with `base_model:
OUT`) can keep each task's gain.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ponder.config import Recipe, SFTConfig, load_recipe, save_recipe, to_dict
from ponder.fileio import write_json_atomic

# What every recipe of a shared warm-up must agree on: one model, one adapter shape,
# one optimisation (the steps are the sum of the recipes' own).
SHARED_SECTIONS = ("model", "lora")
SHARED_SFT_KEYS = ("batch_size", "lr", "warmup_steps", "max_grad_norm")


def _shared(name: str, section: dict[str, Any]) -> dict[str, Any]:
    """What must agree: everything but the keys a warm-up's reuse lets differ
    (train/demo.py RL_KEYS: the training products' precision; the first recipe's is
    used), which do not change the adapter or the model."""
    from ponder.jobs.demo import RL_KEYS

    return {k: v for k, v in section.items() if k not in RL_KEYS.get(name, ())}


def shared_sft(recipes: dict[str, Recipe], where: dict[str, str]) -> SFTConfig:
    """The joint SFT settings: the recipes' common batch size, learning rate, warm-up
    and gradient clipping, for the sum of their steps. ValueError naming the file and
    key where a recipe disagrees with the first."""
    names = list(recipes)
    first = recipes[names[0]]
    for name in names[1:]:
        recipe = recipes[name]
        for section in SHARED_SECTIONS:
            ours, theirs = (_shared(section, to_dict(getattr(r, section))) for r in (recipe, first))
            if ours != theirs:
                raise ValueError(f"{where[name]}: section '{section}' differs from {where[names[0]]}'s; "
                                 "a shared warm-up trains one adapter of one model")  # fmt: skip
        for key in SHARED_SFT_KEYS:
            if getattr(recipe.sft, key) != getattr(first.sft, key):
                mine, theirs = getattr(recipe.sft, key), getattr(first.sft, key)
                raise ValueError(f"{where[name]}: key 'sft.{key}' is {mine}, {where[names[0]]} has {theirs}; "
                                 "a shared warm-up takes one")  # fmt: skip
    return replace(first.sft, steps=sum(r.sft.steps for r in recipes.values()))


def run_shared_warm_up(
    recipes: dict[str, Recipe], where: dict[str, str], out: Path,
    on_step: Callable[[int, dict[str, float]], None] | None = None, say: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Train the shared adapter into OUT/sft and write OUT/NAME per recipe and
    OUT/warmup.json (the recipes, demonstrations per recipe, the joint settings)."""
    from ponder.jobs.demo import copy_warm_up
    from ponder.jobs.parts import recipe_demonstrations
    from ponder.models.prepare import prepare_policy
    from ponder.train.sft import train_and_save

    config = shared_sft(recipes, where)
    first = next(iter(recipes.values()))
    policy = prepare_policy(first)
    demonstrations, counts = [], {}
    for name, recipe in recipes.items():
        built = recipe_demonstrations(recipe, policy)
        say(f"{name}: {len(built)} demonstrations ({where[name]})")
        counts[name] = len(built)
        demonstrations += built
    micro = min(r.algo.micro_batch_size for r in recipes.values())
    history = train_and_save(policy, demonstrations, config, first.train.seed, micro, out / "sft", on_step)
    joint = {key: getattr(config, key) for key in ("steps", *SHARED_SFT_KEYS)}
    for name, recipe in recipes.items():
        as_run = replace(recipe, sft=replace(recipe.sft, **joint))
        (out / name).mkdir(parents=True, exist_ok=True)
        save_recipe(as_run, out / name / "recipe.yaml")
        copy_warm_up(out / "sft", out / name)
    summary = {"recipes": where, "demonstrations": counts, "sft": joint, "micro_batch_size": micro,
               "last": history[-1] if history else {}}  # fmt: skip
    write_json_atomic(out / "warmup.json", summary)
    return summary


def warm_up_recipes(paths: list[str], out_dir: str, overwrite: bool) -> int:
    """`ponder warmup`: the recipe files checked, OUT claimed, the shared warm-up run
    with progress; returns the exit code."""
    from rich.console import Console

    from ponder.rundir import claim_run_dir, discard_on_error
    from ponder.runlog.progress import item_progress
    from ponder.wiring import check_parts

    where = {Path(path).stem: path for path in paths}
    if len(where) != len(paths) or len(where) < 2:
        raise ValueError("--recipe: give two or more recipe files with different names")
    recipes = {name: load_recipe(path) for name, path in where.items()}
    for recipe in recipes.values():
        check_parts(recipe)
    total = shared_sft(recipes, where).steps
    out = claim_run_dir(out_dir, overwrite)
    console = Console(stderr=True)
    with discard_on_error(out), item_progress("warm-up steps", total) as on_step:
        summary = run_shared_warm_up(recipes, where, out, on_step, say=console.print)
    console.print(f"{total} steps, last loss {summary['last'].get('sft/loss', float('nan')):.3f}; "
                  f"wrote {out / 'sft'} and {', '.join(str(out / n) for n in recipes)}")  # fmt: skip
    return 0
