"""Shared helpers for agent tests: the tiny tokenizer, scripted agents, a few tools."""

import pytest

from ponder.agent import Agent, AgentConfig, BackendPolicy
from ponder.models import tiny_tokenizer
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools import tool


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


@tool
def lookup(query: str) -> str:
    """Look a fact up.

    Args:
        query: What to look for.
    """
    return f"fact about {query}"


def call(name, **arguments):
    import json

    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def scripted_agent(tokenizer, turns, tools=(add, lookup), key="t1", **config):
    """An Agent whose model replays `turns` for episode `key`; returns (agent, backend)."""
    backend = ScriptedBackend(tokenizer, {key: list(turns)})
    agent = Agent(BackendPolicy(backend), list(tools), AgentConfig(**config))
    return agent, backend
