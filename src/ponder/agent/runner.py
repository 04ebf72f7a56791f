"""Tool calls with retries, backoff and declared fallbacks, every attempt recorded.

`ToolRunner` stands where `run_tool_step` expects a ToolRegistry (it has the same
`call(call, timeout_s)` and never raises), so the agent keeps the one parse →
validate → call → observe step that rollouts use, and adds only the policy:
- invalid arguments and unknown tools come back at once (retrying cannot fix them);
- any other failure (the tool raised or returned an error) is retried `retries`
  times, waiting backoff_s, backoff_s·factor, …; a call that timed out is retried
  only when the tool is marked idempotent (it may have half-run: a retry could
  repeat its side effect);
- when every attempt failed, the declared fallbacks are tried in order with the same
  arguments; when they fail too, the model is told to answer from what it knows.
Each attempt's limit is the tool's timeout capped by the run's remaining wall-clock time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ponder.agent.config import AgentConfig
from ponder.tools.registry import TimedOut, ToolRegistry
from ponder.types import ToolCall, ToolResult

ANSWER_FROM_MEMORY = "every tool for this failed; answer from what you already know"


@dataclass
class ToolAttempt:
    """One try at running a tool.

    requested: the tool the model named; tool: the one actually run (a fallback may differ).
    kind: `call` (first try), `retry` or `fallback`.
    """

    turn: int
    requested: str
    tool: str
    kind: str
    attempt: int
    arguments: dict[str, Any] = field(default_factory=dict)
    ok: bool = False
    error: str | None = None
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolAttempt:
        return cls(**data)


class ToolRunner:
    """A ToolRegistry's `call` with the config's per-tool policies; see module docstring.

    `remaining_s` returns the seconds left in the run (None: no limit). `sleep` is
    injectable so tests can record the backoff schedule without waiting.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        config: AgentConfig,
        remaining_s: Callable[[], float | None] = lambda: None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.registry = registry
        self.config = config
        self.remaining_s = remaining_s
        self.sleep = sleep
        self.turn = 0
        self.attempts: list[ToolAttempt] = []

    def validate(self, call: ToolCall) -> str | None:
        return self.registry.validate(call)

    @property
    def max_calls_per_action(self) -> int:
        return self.registry.max_calls_per_action

    def call(self, call: ToolCall, timeout_s: float | None = None) -> ToolResult:
        started = time.perf_counter()
        chain = [call.name] + [n for n in self.config.policy_for(call.name).fallbacks if n != call.name]
        failures: list[str] = []
        for position, name in enumerate(chain):
            candidate = dataclasses.replace(call, name=name)
            invalid = self.registry.validate(candidate)
            if invalid is not None:
                self._record(call.name, name, "fallback" if position else "call", 0, call, invalid, 0.0)
                if position == 0:  # the model's own mistake: it must fix the call
                    return ToolResult(invalid, True, call.name, time.perf_counter() - started)
                failures.append(invalid)
                continue
            result = self._with_retries(call.name, candidate, position > 0, timeout_s)
            if not result.is_error:
                if position:
                    note = f"[{call.name} failed; result from fallback tool {name}]\n"
                    result = dataclasses.replace(result, content=note + result.content)
                return dataclasses.replace(result, name=call.name, elapsed_s=time.perf_counter() - started)
            failures.append(result.content)
            if self._out_of_time():
                break
        message = "; ".join(failures)
        if len(chain) > 1:
            message = f"{message}; {ANSWER_FROM_MEMORY}"
        return ToolResult(message, True, call.name, time.perf_counter() - started)

    def _with_retries(self, requested: str, call: ToolCall, is_fallback: bool, timeout_s: float | None) -> ToolResult:
        policy = self.config.policy_for(call.name)
        wait = policy.backoff_s
        result = ToolResult("not run", True)
        for attempt in range(policy.retries + 1):
            if attempt:
                remaining = self.remaining_s()
                if remaining is not None and remaining <= wait:
                    break  # the retry could not finish inside the run's time
                self.sleep(wait)
                wait *= policy.backoff_factor
            limit = self._limit(call.name, timeout_s if timeout_s is not None else policy.timeout_s)
            result = self.registry.call(call, timeout_s=limit)
            kind = "retry" if attempt else ("fallback" if is_fallback else "call")
            self._record(requested, call.name, kind, attempt, call, result.content if result.is_error else None,
                         result.elapsed_s)
            if not result.is_error or self._out_of_time():
                break
            if isinstance(result, TimedOut) and not self.registry.get(call.name).idempotent:
                break
        return result

    def _limit(self, name: str, timeout_s: float | None) -> float | None:
        """The attempt's limit: the given one, else the tool's, else the registry's, capped by the run."""
        remaining = self.remaining_s()
        if remaining is None:
            return timeout_s
        if timeout_s is None:
            own = self.registry.get(name).timeout_s
            timeout_s = own if own is not None else self.registry.default_timeout_s
        return max(0.01, min(timeout_s, remaining))

    def _out_of_time(self) -> bool:
        remaining = self.remaining_s()
        return remaining is not None and remaining <= 0

    def _record(self, requested: str, tool: str, kind: str, attempt: int, call: ToolCall,
                error: str | None, elapsed_s: float) -> None:
        self.attempts.append(
            ToolAttempt(self.turn, requested, tool, kind, attempt, dict(call.arguments), error is None, error, elapsed_s)
        )
