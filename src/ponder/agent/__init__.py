"""The agent runtime: a state machine over any chat policy, with the rollout tool step,
schema-checked answers, retries and fallbacks, resumable JSON state, memory,
multi-agent coordination and RAG over local documents.

Names are imported on first use, so `ponder --help` (which registers the agent's
sub-commands) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Agent": "ponder.agent.loop",
    "AgentConfig": "ponder.agent.config",
    "AgentConfigError": "ponder.agent.config",
    "ToolPolicy": "ponder.agent.config",
    "AgentState": "ponder.agent.state",
    "StateError": "ponder.agent.state",
    "BackendPolicy": "ponder.agent.policy",
    "ChatPolicy": "ponder.agent.policy",
    "Completion": "ponder.agent.policy",
    "PolicyError": "ponder.agent.policy",
    "load_chat_policy": "ponder.agent.policy",
    "ToolAttempt": "ponder.agent.runner",
    "ToolRunner": "ponder.agent.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ponder.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
