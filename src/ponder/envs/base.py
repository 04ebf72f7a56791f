"""The environment protocol, the environment registry and task files.

An environment is one episode of a multi-turn, text-and-tool interaction:

    env = factory()                       # a fresh environment per episode
    opening = env.reset(task)             # Opening(messages, tools) — or a bare message list
    observation, done, info = env.step(action_text)

- `reset(task)` gives the opening chat messages (system rules, the question) and
  the tools the episode may call (`ToolSpec`s; shown to the policy by the env's own
  prompt, and recorded).
- `step(action)` gets the policy's action text and gives the observation to append
  (None when there is nothing to show), whether the episode ended, and an info dict
  that may carry `turn` (a `Turn` record: tool calls, results, the answer, errors —
  the engine makes a plain one when absent), `reward` (a per-turn reward, e.g. a
  test-run score or a step cost), `stop_reason` (`answer`, `max_turns` …) and
  `metrics` (the environment's own per-episode counts, name → this turn's amount:
  the engine sums them into the trajectory's metrics beside its own `turns`,
  `tool_calls`, `tool_calls/<name>` …; search-QA counts `searches` so).
- `stop_strings`: texts at which generation of one action stops (a closing tag).
- `close()` (optional; `BaseEnv` gives a no-op one): release what the episode holds
  (a file, a socket, a process). The engine calls it once when the episode ends,
  whatever ended it — an answer, a token budget, a `step` that raised — and for
  every open episode when the run itself fails. An environment without one is
  fine; an error from it is logged, never raised.

An environment that raises in `step` ends that episode (stop reason `env_error`,
the error text in the turn) and never the run.

A factory may hold what its episodes share (a sandbox pool, a checker process):
it then has a `close()` too, and whoever built the `EnvSpec` closes it when done
(`spec.close()`, or `with build_env(...) as spec:`) — the trainer's job, the
evaluation runner.

Environments are built by **builders** registered by name: `builder(ctx)` gets an
`EnvContext` (the recipe's `env.options`, the tokenizer, the whole recipe) and
returns an `EnvSpec`: the per-episode factory, the train and eval tasks, and the
environment's own reward. A recipe names one by registered name (`env.kind:
search_qa`) or by import path (`env.kind: my_package.my_env:build` — a builder, or
an environment class whose constructor takes the options as keywords; tasks then
come from `env.train_tasks` / `env.eval_tasks`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self, runtime_checkable

from ponder.plugins import import_object
from ponder.registry import Registry
from ponder.types import Task, ToolSpec, Trajectory

RewardFn = Callable[[Trajectory, Task], Any]
logger = logging.getLogger(__name__)


@dataclass
class Opening:
    """What `reset` gives: the opening messages and the tools the episode may call."""

    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)


@runtime_checkable
class Env(Protocol):
    """reset, step and stop_strings are required; `close()` is optional (see the
    module docstring), so environments written without one stay environments."""

    stop_strings: list[str]

    def reset(self, task: Task) -> Opening | list[dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]: ...


class BaseEnv:
    """A base class for environments: a no-op `close()` to override when an episode
    holds something to release."""

    def close(self) -> None:
        """Release what this episode holds; the engine calls it once, when the episode ends."""


def close_env(thing: Any) -> None:
    """Call `thing.close()` if it has one (an environment or an environment factory).
    Releasing is best effort: an error is logged, never raised, so a failing close
    neither ends a run nor hides the error that ended one."""
    close = getattr(thing, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception as err:  # noqa: BLE001 - see the docstring
        logger.warning("closing %s failed: %s: %s", type(thing).__name__, type(err).__name__, err)


def opening_of(value: Opening | list[dict[str, Any]]) -> Opening:
    """`reset`'s result as an Opening (a bare list of messages offers no tools)."""
    return value if isinstance(value, Opening) else Opening(list(value))


@dataclass
class EnvContext:
    """What a builder may use: options (the recipe's env.options), the policy's
    tokenizer (to cut observations to a token budget), the whole recipe, and tools
    served from outside (the recipe's env.mcp_servers), by name.

    A builder takes served tools with `served_tool(name)` (one it would otherwise
    build itself) or `served_tools()` (all, for an environment that offers any tool);
    the wiring refuses a recipe whose served tools the environment left unused."""

    options: dict[str, Any]
    tokenizer: Any = None
    recipe: Any = None
    tools: dict[str, Any] = field(default_factory=dict)
    used_tools: set[str] = field(default_factory=set)

    def served_tool(self, name: str) -> Any:
        """The served tool called `name` (a ponder Tool), or None when none is."""
        if name in self.tools:
            self.used_tools.add(name)
        return self.tools.get(name)

    def served_tools(self) -> list[Any]:
        """Every served tool, in the servers' order."""
        self.used_tools.update(self.tools)
        return list(self.tools.values())


@dataclass
class EnvSpec:
    """A built environment: a factory of fresh episodes, task splits, and the
    reward components it defines (name → callable (trajectory, task) -> float | None)
    with their default weights."""

    factory: Callable[[], Env]
    train: list[Task]
    eval: list[Task]
    rewards: dict[str, RewardFn] = field(default_factory=dict)
    reward_weights: dict[str, float] = field(default_factory=dict)
    # A mixture's parts (ponder.envs.mixture), by name: each of its tasks (own_task
    # names the part) is scored by that part's own reward, built from the part's recipe.
    parts: dict[str, EnvPart] = field(default_factory=dict)

    def split(self, name: str) -> list[Task]:
        """The tasks of split `name` (eval.split): `train`, else the held-out `eval`."""
        return self.train if name == "train" else self.eval

    def close(self) -> None:
        """Close the factory (what its episodes share), when it has a `close`."""
        close_env(self.factory)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class EnvPart:
    """One environment of a mixture: its built spec, the recipe it was built from (the
    mixture's recipe with the part's env and reward sections in their place) and its
    training weight (None: its tasks' count)."""

    spec: EnvSpec
    recipe: Any
    weight: float | None = None


# The metadata key of a mixture's task that names its part.
PART_KEY = "mixture_part"


def part_task(task: Task, part: str) -> Task:
    """`task` as a mixture holds it: id and kind under the part's name (`math/level1`:
    a stratified sampler, an evaluation's breakdown and a teacher per kind or part read
    it so), the part named in metadata[PART_KEY]."""
    return replace(task, id=f"{part}/{task.id}", kind=f"{part}/{task.kind}",
                   metadata={**task.metadata, PART_KEY: part})  # fmt: skip


def own_task(task: Task) -> tuple[str, Task]:
    """(the part's name, the task as the part made it) of a mixture's task; ("", task)
    for a task of no mixture."""
    part = task.metadata.get(PART_KEY)
    if not isinstance(part, str) or not part:
        return "", task
    cut = len(part) + 1
    metadata = {key: value for key, value in task.metadata.items() if key != PART_KEY}
    return part, replace(task, id=task.id.removeprefix(f"{part}/"),
                         kind=task.kind[cut:] if task.kind.startswith(f"{part}/") else task.kind,
                         metadata=metadata)  # fmt: skip


EnvBuilder = Callable[[EnvContext], EnvSpec]
# stepped: the rollout engine steps its episodes (False: an agent program drives them
# through the gateway, envs/gateway.py)
ENVS: Registry[EnvBuilder] = Registry("environment", traits={"stepped": True})


def register_env(name: str, **traits: Any) -> Callable[[EnvBuilder], EnvBuilder]:
    """Decorator: make `builder` available to recipes as `env.kind: name` (a name
    already taken by another builder is refused); traits as ENVS declares them."""
    return ENVS.register(name, **traits)


def resolve_env(kind: str) -> EnvBuilder:
    """The builder a recipe's env.kind names (registered name or import path)."""
    _load_builtin_envs()
    if kind in ENVS:
        return ENVS.get(kind)
    if ":" not in kind:
        raise ENVS.error(kind, "env.kind", also="'module:attribute'")
    target = import_object(kind, "env.kind")
    if isinstance(target, type):
        return _class_builder(target)
    if not callable(target):
        raise ValueError(f"env.kind '{kind}': not a builder function or an environment class")
    return target


def _class_builder(cls: type) -> EnvBuilder:
    """A builder for an environment class: options are its keyword arguments, tasks come from files."""

    def build(ctx: EnvContext) -> EnvSpec:
        env_cfg = ctx.recipe.env if ctx.recipe is not None else None
        train = recipe_tasks(env_cfg, env_cfg.train_tasks) if env_cfg is not None and env_cfg.train_tasks else []
        evaluation = recipe_tasks(env_cfg, env_cfg.eval_tasks) if env_cfg is not None and env_cfg.eval_tasks else []
        if not train and not evaluation:
            raise ValueError(f"env.kind {cls.__name__}: give env.train_tasks and/or env.eval_tasks (JSONL, Parquet "
                             "or a saved datasets directory)")  # fmt: skip
        rewards = getattr(cls, "rewards", {}) or {}
        weights = getattr(cls, "reward_weights", {}) or {}
        return EnvSpec(lambda: cls(**ctx.options), train, evaluation, dict(rewards), dict(weights))

    return build


def _load_builtin_envs() -> None:
    """Importing the environment modules registers them."""
    for module in BUILTIN_ENV_MODULES:
        importlib.import_module(module)


# Modules whose import registers ponder's own environments.
BUILTIN_ENV_MODULES: list[str] = [
    "ponder.envs.search_qa", "ponder.envs.math", "ponder.envs.code", "ponder.envs.function_calling",
    "ponder.envs.gateway", "ponder.envs.verified_qa", "ponder.envs.verifiers_env", "ponder.envs.openenv_env",
    "ponder.envs.mixture",
]  # fmt: skip


def load_tasks_from(source: str | os.PathLike[str], spec: Any = None) -> list[Task]:
    """Tasks from a JSONL file, a Parquet file, a saved `datasets` directory or
    `hf:NAME[:CONFIG]:SPLIT` (a dataset in the local cache), read as `spec` (a
    ponder.envs.formats.TaskSource: env.columns, env.transform, env.format) says.

    Schema: `id` (non-empty), `question` (non-empty text), and optionally `answers`
    (list of strings), `kind`, `context`, `oracle_actions` (list of strings),
    `metadata` (object); other columns go into metadata. verl's and TRL's layouts and
    other column names are mapped onto it (ponder.envs.formats). A bad row raises
    TaskFileError naming the file and row; no rows at all is one too."""
    from ponder.envs.formats import load_source

    return load_source(source, spec)


def recipe_tasks(env_cfg: Any, source: str | os.PathLike[str]) -> list[Task]:
    """The tasks of `source` read with the recipe's env.columns, env.transform and env.format."""
    from ponder.envs.formats import TaskSource

    return load_tasks_from(source, TaskSource(dict(env_cfg.columns), env_cfg.transform, env_cfg.format))
