"""Environments: the protocol (ponder.envs.base) and task files; each environment is a
module of its own (search_qa, math, code, function_calling), registered by name when
a recipe first asks for one, and imported from there by what needs its own names."""

from ponder.envs.base import (
    ENVS,
    BaseEnv,
    Env,
    EnvBuilder,
    EnvContext,
    EnvSpec,
    Opening,
    RewardFn,
    close_env,
    load_tasks_from,
    opening_of,
    register_env,
    resolve_env,
)
from ponder.envs.taskfile import TaskFileError, load_tasks, write_jsonl

__all__ = [
    "ENVS",
    "BaseEnv",
    "Env",
    "EnvBuilder",
    "EnvContext",
    "EnvSpec",
    "Opening",
    "RewardFn",
    "TaskFileError",
    "close_env",
    "load_tasks",
    "load_tasks_from",
    "opening_of",
    "register_env",
    "resolve_env",
    "write_jsonl",
]
