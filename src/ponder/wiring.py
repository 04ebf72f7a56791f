"""The one place a recipe becomes parts: environment (factory and tasks), reward,
policy and generation backend. `train`, `eval`, `demo`, `pipeline` and the
benchmarks all build their parts here; the trainers take parts and never read a
task file, build a retriever or name an environment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ponder.config import Recipe
from ponder.envs.base import EnvContext, EnvSpec, own_task, recipe_tasks, resolve_env
from ponder.models import Policy
from ponder.models.chat import encode_chat
from ponder.rewards import CompositeReward, PartReward


def build_env(recipe: Recipe, tokenizer: Any = None) -> EnvSpec:
    """The recipe's environment: its builder's factory and tasks, with env.train_tasks /
    env.eval_tasks (JSONL, Parquet, a datasets directory or `hf:…`, read with env.columns,
    env.transform and env.format) replacing its own tasks."""
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
        spec = replace(spec, train=recipe_tasks(recipe.env, recipe.env.train_tasks))
    if recipe.env.eval_tasks:
        spec = replace(spec, eval=recipe_tasks(recipe.env, recipe.env.eval_tasks))
    return spec


def served_tools(recipe: Recipe) -> dict[str, Any]:
    """The tools of the recipe's env.mcp_servers, by name (their servers are started or
    reached once per process and stopped at exit); {} when it names none."""
    if not recipe.env.mcp_servers:
        return {}
    from ponder.tools.mcp import mcp_tools, parse_server_specs

    return {tool.name: tool for tool in mcp_tools(parse_server_specs(recipe.env.mcp_servers))}


def build_reward(recipe: Recipe, spec: EnvSpec, policy: Policy | None = None) -> CompositeReward | PartReward:
    """The environment's reward components at their default weights, updated by the
    recipe; with reward.judge.weight set, a `judge` component (served, or for
    self_judge the `policy` itself). A mixture's (spec.parts): each part's own, built
    from the part's recipe, scoring that part's tasks."""
    if spec.parts:
        return PartReward({name: build_reward(part.recipe, part.spec, policy) for name, part in spec.parts.items()},
                          own_task)  # fmt: skip
    judge = recipe.reward.judge
    components = dict(spec.rewards)
    if judge.weight != 0:
        components["judge"] = build_judge(recipe, policy)
    reward = CompositeReward.from_config(recipe.reward, components, spec.reward_weights)
    if judge.weight != 0:
        reward.weights["judge"] = judge.weight
        reward.components["judge"] = components["judge"]
    shaping = recipe.reward.shaping
    unknown = [name for name in (shaping.judge, shaping.verified) if name not in reward.weights]
    if shaping.judge_unverified and unknown:
        raise ValueError(f"reward.shaping.judge_unverified: no reward component {unknown[0]!r} to compare; "
                         f"set reward.shaping.judge / verified to two of "
                         f"{', '.join(reward.weights)}")  # fmt: skip
    return reward


def build_judge(recipe: Recipe, policy: Policy | None = None) -> Any:
    """reward.judge as a JudgeReward: over the OpenAI API at judge.url, or (self_judge,
    labelled hackable) generated greedily by `policy`."""
    import os

    from ponder.rewards.judge import JudgeReward, openai_completion

    judge = recipe.reward.judge
    if bool(judge.url) == judge.self_judge:
        raise ValueError("reward.judge: set exactly one of url (a served judge) and self_judge (the policy)")
    if judge.url:
        key = os.environ.get(judge.api_key_env, "") if judge.api_key_env else ""
        return JudgeReward(openai_completion(judge.url, judge.model, key, judge.max_tokens), judge)
    return JudgeReward(policy_completion(policy, judge.max_tokens), judge, hackable=True)


def policy_completion(policy: Policy | None, max_tokens: int) -> Any:
    """`complete(messages) -> text` by `policy` (its chat template, greedy): the
    self-judge. Without a policy (a recipe check) it fails when called, not before."""
    import torch

    def complete(messages: list[dict[str, str]]) -> str:
        if policy is None:
            raise RuntimeError("reward.judge.self_judge: no policy was given to judge with")
        tokenizer = policy.tokenizer
        ids = torch.tensor([encode_chat(tokenizer, messages)], device=policy.device)
        with torch.no_grad():
            out = policy.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                        do_sample=False, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    return complete


def train_tasks(recipe: Recipe, spec: EnvSpec) -> list:
    """The training tasks, restricted to train.task_kinds when it names any, and to
    those the SFT warm-up did not demonstrate under train.outside_sft."""
    kinds = set(recipe.train.task_kinds)
    tasks = [t for t in spec.train if not kinds or t.kind in kinds]
    if recipe.train.outside_sft:
        if recipe.train.val_outside_sft:
            raise ValueError("train.outside_sft and train.val_outside_sft: choose one (each is defined by the other)")
        demonstrated = {t.id for t in sft_tasks(recipe, spec)}
        tasks = [t for t in tasks if t.id not in demonstrated]
    if not tasks:
        raise ValueError(f"env.kind '{recipe.env.kind}': no training tasks (train.task_kinds={sorted(kinds)}"
                         f"{', train.outside_sft' if recipe.train.outside_sft else ''})")  # fmt: skip
    return tasks


def sft_tasks(recipe: Recipe, spec: EnvSpec, held: set[str] = frozenset()) -> list:
    """The tasks the SFT warm-up demonstrates: the first sft.examples training tasks
    of sft.task_kinds, at most sft.kind_examples of a kind, less `held` (a
    validation split kept out of SFT)."""
    kinds, caps = set(recipe.sft.task_kinds), recipe.sft.kind_examples
    taken: dict[str, int] = {}
    tasks = []
    for task in spec.train:
        capped = taken.get(task.kind, 0) >= caps.get(task.kind, len(spec.train))
        if (kinds and task.kind not in kinds) or task.id in held or capped:
            continue
        taken[task.kind] = taken.get(task.kind, 0) + 1
        tasks.append(task)
    return tasks[: recipe.sft.examples]


def check_parts(recipe: Recipe) -> None:
    """Build the recipe's environment, tasks and reward once, without a model, so that a
    bad env, task file or reward fails before a command writes anything or trains."""
    with build_env(recipe) as spec:
        build_reward(recipe, spec)
        if recipe.train.steps > 0 or recipe.sft.steps > 0:
            train_tasks(recipe, spec)

