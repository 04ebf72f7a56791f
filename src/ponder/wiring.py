"""The one place a recipe becomes parts: environment (factory and tasks), reward,
policy and generation backend. `train`, `eval`, `demo`, `pipeline` and the
benchmarks all build their parts here; the trainers take parts and never read a
task file, build a retriever or name an environment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ponder.config import Recipe, SamplingConfig
from ponder.envs.base import EnvContext, EnvSpec, load_tasks_from, resolve_env
from ponder.models import Policy
from ponder.rewards import CompositeReward
from ponder.rollout import HFBackend


def build_env(recipe: Recipe, tokenizer: Any = None) -> EnvSpec:
    """The recipe's environment: its builder's factory and tasks, with env.train_tasks /
    env.eval_tasks (JSONL, Parquet or a datasets directory) replacing its own tasks."""
    builder = resolve_env(recipe.env.kind)
    ctx = EnvContext(dict(recipe.env.options), tokenizer, recipe, served_tools(recipe))
    spec = builder(ctx)
    if not isinstance(spec, EnvSpec):
        raise ValueError(f"env.kind '{recipe.env.kind}': the builder returned {type(spec).__name__}, not an EnvSpec")
    unused = [name for name in ctx.tools if name not in ctx.used_tools]
    if unused:
        raise ValueError(f"env.mcp_servers: env '{recipe.env.kind}' does not use the served tool {unused[0]!r}; "
                         "name the tools it uses under the server's `tools:`")  # fmt: skip
    if recipe.env.train_tasks:
        spec = replace(spec, train=load_tasks_from(recipe.env.train_tasks))
    if recipe.env.eval_tasks:
        spec = replace(spec, eval=load_tasks_from(recipe.env.eval_tasks))
    return spec


def served_tools(recipe: Recipe) -> dict[str, Any]:
    """The tools of the recipe's env.mcp_servers, by name (their servers are started or
    reached once per process and stopped at exit); {} when it names none."""
    if not recipe.env.mcp_servers:
        return {}
    from ponder.tools.mcp import mcp_tools, parse_server_specs

    return {tool.name: tool for tool in mcp_tools(parse_server_specs(recipe.env.mcp_servers))}


def build_reward(recipe: Recipe, spec: EnvSpec) -> CompositeReward:
    """The environment's reward components at their default weights, updated by the recipe."""
    return CompositeReward.from_config(recipe.reward, spec.rewards, spec.reward_weights)


def train_tasks(recipe: Recipe, spec: EnvSpec) -> list:
    """The training tasks, restricted to train.task_kinds when it names any."""
    kinds = set(recipe.train.task_kinds)
    tasks = [t for t in spec.train if not kinds or t.kind in kinds]
    if not tasks:
        raise ValueError(f"env.kind '{recipe.env.kind}': no training tasks (train.task_kinds={sorted(kinds)})")
    return tasks


BACKENDS = ("hf", "vllm")


def build_backend(policy: Policy, recipe: Recipe, sampling: SamplingConfig | None = None, seed: int | None = None) -> Any:
    """The generation backend for `policy`, by rollout.backend: `hf` (ponder's CPU
    decoder or transformers) or `vllm` (a vLLM server; rollout/vllm.py)."""
    sampling = sampling or recipe.rollout.sampling
    seed = recipe.train.seed if seed is None else seed
    kind = recipe.rollout.backend
    if kind == "vllm":
        from ponder.rollout.vllm import VLLMBackend

        return VLLMBackend(policy, recipe.rollout, sampling, seed=seed)
    if kind != "hf":
        raise ValueError(f"rollout.backend: unknown '{kind}'; valid: {', '.join(BACKENDS)}")
    return HFBackend(policy, sampling, seed=seed)


def check_parts(recipe: Recipe) -> None:
    """Build the recipe's environment, tasks and reward once, without a model, so that a
    bad env, task file or reward fails before a command writes anything or trains."""
    spec = build_env(recipe)
    build_reward(recipe, spec)
    if recipe.train.steps > 0 or recipe.sft.steps > 0:
        train_tasks(recipe, spec)

