"""A mixture of environments: one policy trains and is evaluated on the tasks of
several environments at once (math and search-QA …), each task run by its own
environment and scored by its own reward, so that one student can learn several
specialists' behaviour, e.g. from a teacher per part (teacher.model: {math: RUN_A,
search_qa: RUN_B}).

    env:
      kind: mixture
      options:
        parts:
          math: {kind: math, max_turns: 3, options: {difficulties: [1, 2]}}
          search_qa: {kind: search_qa, options: {...}, reward: {terms: {search_cost: -0.1}}}

A part is built by its own builder from a recipe of its own: the mixture's recipe with
the part's env section (kind, options, max_turns, train_tasks / eval_tasks, columns,
transform, format) as `env` and the recipe's `reward` section updated by the part's
`reward` (so its builder reads its own env.max_turns and reward.terms, as it would
alone). Its tasks join the mixture under the part's name (envs.base.part_task): id
and kind `<part>/…` (`math/level1`, `search_qa/multi_hop`: stratified sampling, the
per-kind evaluation breakdown and a per-kind or per-part teacher read them),
metadata[PART_KEY] the part. An episode's environment is the task's part's, made at
reset, which gets the task as its part made it (envs.base.own_task).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable

from ponder.config import EnvConfig, Recipe, RewardConfig, check_ranges, from_dict, to_dict
from ponder.envs.base import (
    EnvContext, EnvPart, EnvSpec, close_env, own_task, part_task, recipe_tasks, register_env, resolve_env,
)  # fmt: skip
from ponder.types import Task

logger = logging.getLogger(__name__)
# ponder's two own environments: the mixture a bare `env.kind: mixture` builds
DEFAULT_PARTS: dict[str, dict[str, Any]] = {"math": {"kind": "math"}, "search_qa": {"kind": "search_qa"}}
PART_ONLY = ("weight", "reward")  # a part's keys beside those of an env section


class MixtureEnv:
    """One episode: the environment of the task's part, made at `reset` and stepped and
    closed through. Its stop strings are every part's: the engine generates a batch of
    episodes with one list, and an action of one part stops at its own closing tags."""

    def __init__(self, factories: dict[str, Callable[[], Any]], stop_strings: list[str]) -> None:
        self.factories = factories
        self.stop_strings = stop_strings
        self.env: Any = None

    def reset(self, task: Task) -> Any:
        part, own = own_task(task)
        if part not in self.factories:
            raise ValueError(f"task {task.id!r}: not a task of this mixture's parts ({', '.join(self.factories)})")
        self.close()  # reset again: the last episode's environment is done
        self.env = self.factories[part]()
        return self.env.reset(own)

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        if self.env is None:
            raise RuntimeError("MixtureEnv.step before reset: no part's environment yet")
        return self.env.step(action)

    def close(self) -> None:
        if self.env is not None:
            close_env(self.env)
            self.env = None


class MixtureFactory:
    """A MixtureEnv per call over the parts' factories; `close` closes every part's."""

    def __init__(self, factories: dict[str, Callable[[], Any]]) -> None:
        self.factories = factories
        self._stop_strings: list[str] | None = None

    def __call__(self) -> MixtureEnv:
        return MixtureEnv(self.factories, self.stop_strings())

    def stop_strings(self) -> list[str]:
        """Every part's stop strings, in part order, each once (read from one episode of each)."""
        if self._stop_strings is None:
            found: list[str] = []
            for factory in self.factories.values():
                env = factory()
                found += [s for s in env.stop_strings if s not in found]
                close_env(env)
            self._stop_strings = found
        return list(self._stop_strings)

    def close(self) -> None:
        for factory in self.factories.values():
            close_env(factory)


@register_env("mixture")
def build_mixture(ctx: EnvContext) -> EnvSpec:
    """The tasks of several environments at once, each run and scored by its own.

    env.options:
      parts: part name → an env section as in a recipe (`kind` required; `options`,
        `max_turns` (the recipe's env.max_turns when absent), `train_tasks`,
        `eval_tasks`, `columns`, `transform`, `format`), plus optionally `weight`
        (its share of the training tasks) and `reward` (the part's reward section,
        over the recipe's `reward`: `terms`, `shaping`, `judge`). Default: {math:
        {kind: math}, search_qa: {kind: search_qa}}. A name holds no `/`.
    Training tasks: every part's, interleaved in proportion (a prefix of the list holds
    each part at its share; SFT takes the first sft.examples). With a `weight` on every
    part the shares are the weights: as many tasks as the scarcest part allows, the
    first of each part's, none repeated. Evaluation tasks: every part's, one of each
    part in turn while it has any (eval.episodes then takes each part alike).
    The recipe's env.mcp_servers serve every part. Each task is scored by its part's
    reward (wiring.build_reward), so its breakdown holds its own part's components."""
    recipe = ctx.recipe if ctx.recipe is not None else Recipe()
    unknown = sorted(set(ctx.options) - {"parts"})
    if unknown:
        raise ValueError(f"env.options for mixture: unknown {unknown}; valid: parts")
    if recipe.env.train_tasks or recipe.env.eval_tasks:
        raise ValueError("env.train_tasks / env.eval_tasks of a mixture: give each part its own "
                         "(env.options.parts.<name>.train_tasks / eval_tasks)")  # fmt: skip
    specs = ctx.options.get("parts", DEFAULT_PARTS)
    if not isinstance(specs, dict) or not specs:
        raise ValueError(f"env.options.parts: want a mapping {{part name: env section}}, got {specs!r}")
    parts: dict[str, EnvPart] = {}
    try:
        for name, section in specs.items():
            parts[str(name)] = build_part(str(name), section, ctx, recipe)
        weights = part_weights(parts)
    except BaseException:
        for part in parts.values():
            part.spec.close()
        raise
    sizes = {name: float(len(part.spec.train)) for name, part in parts.items()}
    train = interleave({name: [part_task(t, name) for t in p.spec.train] for name, p in parts.items()},
                       weights or sizes)  # fmt: skip
    evaluation = interleave({name: [part_task(t, name) for t in p.spec.eval] for name, p in parts.items()})
    logger.info("mixture: %s", ", ".join(f"{name} {sum(t.kind.startswith(name + '/') for t in train)} train / "
                                          f"{len(p.spec.eval)} eval" for name, p in parts.items()))  # fmt: skip
    factory = MixtureFactory({name: part.spec.factory for name, part in parts.items()})
    return EnvSpec(factory, train, evaluation, parts=parts)


def build_part(name: str, section: Any, ctx: EnvContext, recipe: Recipe) -> EnvPart:
    """Part `name` built by its own builder from its recipe; ValueError (one line,
    naming env.options.parts.<name>) for a part that is wrong."""
    where = f"env.options.parts.{name}"
    try:
        if not name or "/" in name:
            raise ValueError("a part's name is a non-empty word without '/' (it prefixes its tasks' ids and kinds)")
        if not isinstance(section, dict):
            raise ValueError(f"want an env section {{kind, options, …}}, got {section!r}")
        env_keys = {key: value for key, value in section.items() if key not in PART_ONLY}
        if "kind" not in env_keys:
            raise ValueError("give the part's `kind` (an environment: math, search_qa, … or 'module:attribute')")
        if env_keys["kind"] == "mixture":
            raise ValueError("a part cannot be a mixture; list its parts here instead")
        if "mcp_servers" in env_keys:
            raise ValueError("mcp_servers is the recipe's (env.mcp_servers serves every part)")
        env = from_dict(EnvConfig, {"max_turns": recipe.env.max_turns, **env_keys}, where)
        reward = from_dict(RewardConfig, merged(to_dict(recipe.reward), section.get("reward") or {}), where, "reward.")
        part_recipe = replace(recipe, env=env, reward=reward)
        check_ranges(part_recipe, where)
        builder = resolve_env(env.kind)
        spec = builder(EnvContext(dict(env.options), ctx.tokenizer, part_recipe, ctx.tools, ctx.used_tools))
        if not isinstance(spec, EnvSpec):
            raise ValueError(f"its builder returned {type(spec).__name__}, not an EnvSpec")
        if spec.parts or getattr(spec.factory, "driver", None) is not None:
            spec.close()
            raise ValueError(f"env.kind '{env.kind}' cannot be a part (a mixture, or episodes a program drives)")
        if env.train_tasks:
            spec = replace(spec, train=recipe_tasks(env, env.train_tasks))
        if env.eval_tasks:
            spec = replace(spec, eval=recipe_tasks(env, env.eval_tasks))
        return EnvPart(spec, part_recipe, _weight(section.get("weight")))
    except (ValueError, TypeError) as err:
        message = (str(err).splitlines() or [type(err).__name__])[0]
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from err


def _weight(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"weight: want a number > 0, got {value!r}")
    return float(value)


def merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`base` with `update`'s keys set, mappings merged key by key (a part's reward.terms
    over the recipe's)."""
    if not isinstance(update, dict):
        raise ValueError(f"reward: want a reward section (terms, shaping, judge), got {update!r}")
    out = dict(base)
    for key, value in update.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def part_weights(parts: dict[str, EnvPart]) -> dict[str, float] | None:
    """The parts' training weights: None when no part gives one (every task is trained
    on), else every part's (one missing fails)."""
    given = {name: part.weight for name, part in parts.items() if part.weight is not None}
    if not given:
        return None
    missing = [name for name in parts if name not in given]
    if missing:
        raise ValueError(f"env.options.parts.{missing[0]}: give every part a weight, or none "
                         f"({', '.join(given)} have one)")  # fmt: skip
    return given


def interleave(splits: dict[str, list[Task]], weights: dict[str, float] | None = None) -> list[Task]:
    """The parts' tasks in one list. Without `weights`: one of each part in turn
    (the evaluation's order). With `weights`: each part's first n_i tasks, n_i in
    proportion to its weight and as large as the scarcest part allows, part i's j-th
    at position (j + 0.5) / n_i, so any prefix holds each part at its share."""
    total = sum(weights.values()) if weights is not None else 0.0
    if weights is None:
        keyed = [(j, order, task) for order, tasks in enumerate(splits.values()) for j, task in enumerate(tasks)]
    elif total <= 0:
        return []
    else:
        stocked = [len(tasks) * total / weights[name] for name, tasks in splits.items() if tasks]
        size = min(stocked, default=0.0)  # the most tasks in all whose shares the parts can fill
        counts = {name: min(len(tasks), int(size * weights[name] / total + 1e-9)) for name, tasks in splits.items()}
        keyed = [((j + 0.5) / counts[name], order, task) for order, (name, tasks) in enumerate(splits.items())
                 for j, task in enumerate(tasks[: counts[name]])]  # fmt: skip
    return [task for *_, task in sorted(keyed, key=lambda item: (item[0], item[1]))]
