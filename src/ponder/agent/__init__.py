"""The agent runtime: a state machine over any chat policy, with the rollout tool step,
schema-checked answers, retries and fallbacks, resumable JSON state, memory,
multi-agent coordination and RAG over local documents."""

from ponder.agent.config import AgentConfig, AgentConfigError, ToolPolicy
from ponder.agent.loop import Agent
from ponder.agent.policy import BackendPolicy, ChatPolicy, Completion, PolicyError, load_chat_policy
from ponder.agent.runner import ToolAttempt, ToolRunner
from ponder.agent.state import AgentState, StateError

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentConfigError",
    "AgentState",
    "BackendPolicy",
    "ChatPolicy",
    "Completion",
    "PolicyError",
    "StateError",
    "ToolAttempt",
    "ToolPolicy",
    "ToolRunner",
    "load_chat_policy",
]
