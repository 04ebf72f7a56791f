"""`ponder train-adapters`: several LoRA adapters RL-trained in one run from one recipe.

The adapters file maps each adapter's name to its recipe overrides (dotted keys, as on
the command line), on top of the base recipe:

    alice: {optim.lr: 1.0e-4, env.options.taskgen.seed: 1}
    bob:   {optim.lr: 3.0e-4, reward.terms: {format: 0.2}}

Everything an adapter's own run would read may differ (tasks, reward, optimizer and
LR, seed, steps, LoRA rank); the model and the rollout sections are the run's, shared
by every adapter (one base, one batch of episodes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ponder.config import ConfigError, Recipe, load_recipe, to_dict
from ponder.jobs.demo import warm_up_weights
from ponder.jobs.parts import seed_everything
from ponder.models.loading import load_policy
from ponder.models.multi_lora import (AdapterView, activate, attach_lora_adapters, check_adapter_name,
                                     load_adapter_state)
from ponder.rollout.multi_adapter import MultiAdapterBackend
from ponder.train.multi_adapter import ADAPTERS_DIR, AdapterPart, MultiAdapterTrainer
from ponder.train.rl import check_recipe
from ponder.train.validation import recipe_validation
from ponder.wiring import build_env, build_reward, train_tasks

SHARED_SECTIONS = ("model.", "rollout.")


def read_adapters_file(path: str | Path) -> dict[str, list[str]]:
    """{adapter name: ["key=value", …]} from an adapters file (see module docstring);
    ValueError naming a malformed entry."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read the adapters file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not YAML ({str(err).splitlines()[0]})") from None
    if isinstance(data, dict) and set(data) == {"adapters"}:
        data = data["adapters"]
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: write a mapping of adapter name -> its overrides (e.g. alice: {{optim.lr: 1e-4}})")
    adapters: dict[str, list[str]] = {}
    for name, overrides in data.items():
        check_adapter_name(name)
        if overrides is None:
            overrides = {}
        if not isinstance(overrides, dict):
            raise ValueError(f"{path}: adapter {name}: its overrides must be a mapping of dotted keys to values")
        adapters[name] = [f"{key}={json.dumps(value)}" for key, value in _dotted(overrides).items()]
    return adapters


def _dotted(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections flattened to dotted keys; a mapping value of a dict-typed field
    (reward.terms, env.options) stays whole when its key is written dotted already."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and "." not in str(key) and not prefix:
            out.update(_dotted(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def adapter_recipes(recipe_path: str | None, overrides: list[str], adapters: dict[str, list[str]]) -> dict[str, Recipe]:
    """Each adapter's recipe: the base recipe, the command line's overrides, then its own.
    ValueError when an adapter changes a shared section."""
    recipes = {}
    for name, own in adapters.items():
        for item in own:
            if item.startswith(SHARED_SECTIONS):
                raise ValueError(f"adapter {name}: {item.split('=')[0]} is shared by every adapter of the run "
                                 "(model and rollout sections); set it in the recipe or on the command line")
        try:
            recipes[name] = load_recipe(recipe_path, [*overrides, *own])
        except ConfigError as err:
            raise ValueError(f"adapter {name}: {err}") from None
        check_recipe(recipes[name])
    return recipes


def multi_adapter_trainer(recipes: dict[str, Recipe], run_dir: str | Path,
                          sft_from: str | Path | None = None) -> MultiAdapterTrainer:  # fmt: skip
    """The base loaded once, an adapter per recipe (seeded with its train.seed, as a run
    of its own starts, or holding `sft_from`'s warm-up), each adapter's environment,
    tasks and reward built from its recipe."""
    first = next(iter(recipes.values()))
    seed_everything(first.train.seed)
    base = load_policy(first.model.name, first.model.dtype, first.model.device, first.model.rope_scaling)
    policy = attach_lora_adapters(base, {n: r.lora for n, r in recipes.items()},
                                  {n: r.train.seed for n, r in recipes.items()})  # fmt: skip
    backend = MultiAdapterBackend(policy, first.rollout.sampling, seed=first.train.seed)
    parts = {}
    for name, recipe in recipes.items():
        if sft_from is not None:  # the same checks as `ponder demo --sft-from`
            load_adapter_state(policy.model, name, warm_up_weights(sft_from, recipe)[0])
        activate(policy.model, name)
        view = replace(policy, model=AdapterView(policy.model, name))
        spec = build_env(recipe, policy.tokenizer)
        tasks, _ = recipe_validation(recipe, train_tasks(recipe, spec))
        parts[name] = AdapterPart(recipe, spec.factory, tasks, build_reward(recipe, spec, view))
    return MultiAdapterTrainer(policy, parts, backend, run_dir)


def run_train_adapters(recipes: dict[str, Recipe], run_dir: Path, say: Any = print,
                       sft_from: str | Path | None = None) -> Path:  # fmt: skip
    """Train every adapter into RUN_DIR/adapters/NAME (RUN_DIR claimed already), each
    from a fresh LoRA or from `sft_from`'s warm-up; returns RUN_DIR."""
    for name, recipe in recipes.items():
        (run_dir / ADAPTERS_DIR / name).mkdir(parents=True)
        (run_dir / ADAPTERS_DIR / name / "recipe.yaml").write_text(yaml.safe_dump(to_dict(recipe), sort_keys=False))
    trainer = multi_adapter_trainer(recipes, run_dir, sft_from)

    def report(name: str, step: int, metrics: dict[str, float]) -> None:
        steps = recipes[name].train.steps
        say(f"{name:<16} step {step}/{steps}  reward {metrics.get('reward/mean', float('nan')):.3f}  "
            f"rollout {metrics.get('time/shared_rollout_s', 0.0):.1f} s")  # fmt: skip

    return trainer.train(report)
