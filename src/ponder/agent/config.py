"""Typed configuration of the agent runtime, documented once, here.

Loadable from YAML with `ponder.config.load_recipe(path, overrides, cls=AgentConfig)`;
`ponder run-agent --config file.yaml key=value` does exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jsonschema

from ponder.tools.parsers import PARSERS


class AgentConfigError(ValueError):
    """An agent setting is wrong; the message names the key."""


@dataclass
class ToolPolicy:
    """How one tool is called.

    timeout_s: limit per attempt (None: the tool's own, else the registry default).
    retries: extra attempts after a transient failure (the tool raised, or timed out
        and is marked idempotent); invalid arguments and unknown tools are never retried.
    backoff_s: wait before the first retry; each later retry waits backoff_factor times longer.
    backoff_factor: growth of the wait between retries.
    fallbacks: tools tried in order, with the same arguments, when every attempt at this
        one failed ("search A fails → search B"); when all fail the model is told to
        answer from what it already knows.
    """

    timeout_s: float | None = None
    retries: int = 0
    backoff_s: float = 0.2
    backoff_factor: float = 2.0
    fallbacks: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise AgentConfigError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0 or self.backoff_factor < 1:
            raise AgentConfigError("backoff_s must be >= 0 and backoff_factor >= 1")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise AgentConfigError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass
class AgentConfig:
    """One agent's behaviour and limits.

    style: how the model calls tools: `hermes` (function calling, `<tool_call>{json}</tool_call>`)
        or `react` (Thought / Action / Action Input / Final Answer), or any parser name.
    instructions: extra text for the system prompt (the role, the task family's rules).
    max_turns: model actions per run; the run stops with `max_turns` after the last one.
    max_new_tokens_per_turn: cap on one model action.
    max_context_tokens: cap on the prompt the model reads (after the short-term window).
    max_generated_tokens: cap on tokens generated over the whole run.
    wall_clock_s: time limit of the run, checked at every step boundary and passed down
        as the limit of model and tool calls.
    answer_schema: JSON Schema the final answer must match (the answer is then JSON);
        None accepts any text.
    max_corrections: invalid final answers fed back with the validation error before the
        run fails with `schema_failed`.
    max_observation_chars: a tool result longer than this is cut (a tool returning 10 MB
        must not flood the context).
    window_tokens: short-term memory budget in tokens for the conversation after the
        first user message; 0 keeps everything (until max_context_tokens stops the run).
    window_mode: `drop` (oldest turns leave the window) or `summarize` (they are replaced
        by a one-paragraph summary of what was called and seen).
    tool_policy: the ToolPolicy used for tools not named in `tools`.
    tools: per-tool ToolPolicy by tool name.
    retrieve_tools_topk: with a tool retriever given to the Agent, each turn's system
        prompt lists only the k tools it ranks best for the task and the latest
        observation (the `retrieve_tools` step); 0 lists every registered tool.
    untrusted_rule: the system prompt says that tool results are data, never instructions
        (ponder.agent.prompt.UNTRUSTED_RULE).
    raw_tool_output: show tool output verbatim, neither escaped nor marked with its source
        (ponder.tools.safety.escape); only for measuring the undefended baseline.
    constrain_calls: sample each call the model opens to the offered tools' grammar
        (`hermes` style, a local model: ponder.rollout.constrain), so a call it writes
        names an offered tool with schema-valid arguments; text stays free.
    """

    style: str = "hermes"
    instructions: str = ""
    max_turns: int = 8
    max_new_tokens_per_turn: int = 256
    max_context_tokens: int = 4096
    max_generated_tokens: int = 4096
    wall_clock_s: float = 300.0
    answer_schema: dict[str, Any] | None = None
    max_corrections: int = 2
    max_observation_chars: int = 4000
    window_tokens: int = 0
    window_mode: str = "drop"
    tool_policy: ToolPolicy = field(default_factory=ToolPolicy)
    tools: dict[str, ToolPolicy] = field(default_factory=dict)
    retrieve_tools_topk: int = 5
    untrusted_rule: bool = True
    raw_tool_output: bool = False
    constrain_calls: bool = False

    def __post_init__(self) -> None:
        if self.style not in PARSERS:
            raise AgentConfigError(f"style {self.style!r} is unknown; valid: {', '.join(sorted(PARSERS))}")
        if self.constrain_calls and self.style != "hermes":
            raise AgentConfigError(f"constrain_calls needs style hermes (its calls have a grammar), not {self.style!r}")
        if self.window_mode not in ("drop", "summarize"):
            raise AgentConfigError(f"window_mode must be 'drop' or 'summarize', got {self.window_mode!r}")
        for name in ("max_turns", "max_new_tokens_per_turn", "max_context_tokens", "max_generated_tokens"):
            if getattr(self, name) < 1:
                raise AgentConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.wall_clock_s <= 0 or self.max_corrections < 0 or self.max_observation_chars < 100:
            raise AgentConfigError("need wall_clock_s > 0, max_corrections >= 0, max_observation_chars >= 100")
        if isinstance(self.tool_policy, dict):
            self.tool_policy = _tool_policy(self.tool_policy, "tool_policy")
        self.tools = {name: _tool_policy(p, f"tools.{name}") for name, p in self.tools.items()}

    def policy_for(self, tool_name: str) -> ToolPolicy:
        return self.tools.get(tool_name, self.tool_policy)

    def schema_error(self) -> str | None:
        """One line saying why `answer_schema` is not a valid JSON Schema, or None."""
        if self.answer_schema is None:
            return None
        if not isinstance(self.answer_schema, dict):
            return f"answer_schema must be a JSON object, got {type(self.answer_schema).__name__}"
        try:
            jsonschema.Draft202012Validator.check_schema(self.answer_schema)
        except jsonschema.SchemaError as err:
            where = "/".join(str(p) for p in err.absolute_path) or "<root>"
            return f"answer_schema is not a valid JSON Schema at {where}: {err.message}"
        return None


def _tool_policy(value: Any, key: str) -> ToolPolicy:
    if isinstance(value, ToolPolicy):
        return value
    if not isinstance(value, dict):
        raise AgentConfigError(f"{key} must be a mapping, got {value!r}")
    from ponder.config import ConfigError, from_dict

    try:
        return from_dict(ToolPolicy, value, "agent config", key + ".")
    except ConfigError as err:
        raise AgentConfigError(str(err)) from err
