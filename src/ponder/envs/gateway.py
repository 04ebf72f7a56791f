"""`env.kind: gateway`: an agent *program*, unchanged, as the environment.

The program is not stepped by the rollout engine: it runs once per episode, talks to
the policy through an OpenAI `base_url` of the training gateway (ponder.serve.gateway),
and every model call it makes is recorded token-exactly (ponder.rollout.segments).
This module holds only what the recipe says about the program, its tasks and its
reward; the rollout engine's builder hands its episodes to the gateway's driver
(`ProgramDriven.driver`), for training, validation and evaluation alike.

    env:
      kind: gateway
      options:
        agent: examples.agents.openai_loop:run     # async def run(task, base_url, api_key)
        # or command: [python, my_agent.py]        # OPENAI_BASE_URL, OPENAI_API_KEY, PONDER_TASK set
        tasks_from: {kind: math, options: {seed: 0, n_train: 256, n_eval: 64}}
        # or tasks: data/train.jsonl, eval_tasks: data/eval.jsonl

The program's reward: what `run` returns (a number, or a dict of named numbers whose
sum is the reward, kept as its breakdown), or for a command the last line it prints
when that is a number or such a dict; else a reward posted to the session
(`POST /v1/sessions/{id}/reward`, `PONDER_REWARD_URL` for commands); else none (the
recipe's other reward terms may still score the trajectory). An episode whose program
raises, exits non-zero or outlives train.agent_timeout_s is recorded as failed, with
its reason, and scores 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ponder.config.load import from_dict
from ponder.envs.base import EnvContext, EnvSpec, load_tasks_from, register_env, resolve_env
from ponder.plugins import import_object
from ponder.types import Task, Trajectory

PROGRAM_REWARD = "program_reward"  # the trajectory metric holding what the program reported


@dataclass
class GatewayOptions:
    """env.options of `env.kind: gateway`.

    agent: the program as `module:function`, an `async def run(task, base_url, api_key)`
        (or a plain function) taking the task as a dict and returning its reward.
        Neither agent nor command: only `ponder gateway` (online mode, outside drivers)
        can run the recipe.
    command: or the program as a command run per episode, with OPENAI_BASE_URL,
        OPENAI_API_KEY, PONDER_TASK (the task as JSON) and PONDER_REWARD_URL set.
    tasks / eval_tasks: task files (JSONL, Parquet, a saved `datasets` directory).
    tasks_from: or another environment's task splits, `{kind, options}` (e.g. math's
        generated problems).
    concurrency: how many episodes run at once (0: rollout.batch_size).
    model: the model name the program's client sends (`policy`).
    env: more environment variables for a command.
    teacher: a reference solver as `module:function`, task dict -> the assistant replies
        a good episode of the program gets, in the program's own format (a call as
        `<tool_call>{...}</tool_call>`): they become the tasks' oracle actions, so the
        SFT warm-up (sft.steps) and `ponder eval --oracle` run the program against that
        solver served as the model, and record its calls as demonstrations.
    """

    agent: str | None = None
    command: list[str] | None = None
    tasks: str | None = None
    eval_tasks: str | None = None
    tasks_from: dict[str, Any] | None = None
    concurrency: int = 0
    model: str = "policy"
    env: dict[str, str] = field(default_factory=dict)
    teacher: str | None = None

    def __post_init__(self) -> None:
        if self.agent is not None and self.command is not None:
            raise ValueError("env.options for gateway: give one of `agent` (module:function) and `command` "
                             "(a list of strings), not both (neither: `ponder gateway` serves outside drivers)")  # fmt: skip
        if self.agent is not None and ":" not in self.agent:
            raise ValueError(f"env.options.agent {self.agent!r}: write it as module:function")
        if self.command is not None and (not self.command or not all(isinstance(a, str) for a in self.command)):
            raise ValueError("env.options.command must be a non-empty list of strings")
        if (self.tasks is None) == (self.tasks_from is None):
            raise ValueError("env.options for gateway: give `tasks` (a task file) or `tasks_from` "
                             "({kind, options} of another environment), not both")  # fmt: skip
        if self.concurrency < 0:
            raise ValueError("env.options.concurrency must be >= 0")


def program_reward(trajectory: Trajectory, task: Task) -> float | None:
    """What the program reported for its episode (None: it reported nothing)."""
    return trajectory.metrics.get(PROGRAM_REWARD)


class ProgramDriven:
    """The factory of a program-driven environment: there is no step() to call; its
    `driver` (ponder.rollout.engine.build_engine) runs the program through the gateway.

    timeout_s: train.agent_timeout_s. max_staleness: algo.max_staleness under
    train.async_rollouts (calls of sessions further behind get 429), else None."""

    driver = "ponder.serve.gateway:GatewayRollouts"

    def __init__(self, options: GatewayOptions, timeout_s: float = 300.0, max_staleness: int | None = None) -> None:
        self.options = options
        self.timeout_s = timeout_s
        self.max_staleness = max_staleness

    def __call__(self) -> Any:
        raise RuntimeError("env.kind gateway: episodes are driven by the agent program through the gateway "
                           "(ponder train / ponder eval start it); there is no environment to step")  # fmt: skip


@register_env("gateway", stepped=False)
def build_gateway(ctx: EnvContext) -> EnvSpec:
    """An agent program trained through the gateway (see the module docstring and
    GatewayOptions). Reward component: `program` (weight 1), what the program reported."""
    options = from_dict(GatewayOptions, dict(ctx.options), "env.options")
    if options.tasks_from is not None:
        source = dict(options.tasks_from)
        kind = source.pop("kind", None)
        if not isinstance(kind, str):
            raise ValueError("env.options.tasks_from needs a `kind` (an environment name)")
        inner = EnvContext(dict(source.get("options") or {}), ctx.tokenizer, ctx.recipe)
        with resolve_env(kind)(inner) as spec:
            train, evaluation = spec.train, spec.eval
    else:
        train = load_tasks_from(options.tasks)
        evaluation = load_tasks_from(options.eval_tasks) if options.eval_tasks else []
    if options.teacher is not None:
        solve = import_object(options.teacher, "env.options.teacher")
        train, evaluation = ([replace(t, oracle_actions=list(solve(t.to_dict()))) for t in split]
                             for split in (train, evaluation))  # fmt: skip
    recipe = ctx.recipe
    timeout_s = recipe.train.agent_timeout_s if recipe is not None else 300.0
    staleness = recipe.algo.max_staleness if recipe is not None and recipe.train.async_rollouts else None
    factory = ProgramDriven(options, timeout_s, staleness)
    return EnvSpec(factory, train, evaluation, {"program": program_reward}, {"program": 1.0})
