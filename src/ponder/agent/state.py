"""The agent's whole state, serialisable to JSON at every step boundary.

Phases of the state machine (see `ponder.agent.loop`):
  generating ──action with calls or a parse error──▶ calling_tools ──▶ observing ──▶ generating
  generating ──action with a final answer──▶ answering ──valid──▶ done (answered)
                                                    └──invalid, corrections left──▶ generating
  generating ──answer text cut off at the token cap──▶ done (stopped, stop_reason "length")
  any phase ──a limit reached──▶ done (stopped) · model failure ──▶ done (error)

Everything a later step reads lives here: the transcript, the pending action and its
calls, the tool results not yet shown, counters, elapsed time and memory handles. So
`AgentState.from_json(state.to_json())` continues exactly where `state` was.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ponder.agent.runner import ToolAttempt
from ponder.fileio import write_text_atomic
from ponder.types import ToolCall, ToolResult, Trajectory, Turn

STATE_VERSION = 1
PHASES = ("generating", "calling_tools", "observing", "answering", "done")
# status of a finished run
ANSWERED, STOPPED, FAILED, ERROR = "answered", "stopped", "failed", "error"


class StateError(ValueError):
    """A saved agent state cannot be read; the message says why."""


@dataclass
class Counters:
    """Step counters. `turns`: model actions; `corrections`: invalid final answers so far."""

    steps: int = 0
    turns: int = 0
    model_calls: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    corrections: int = 0


@dataclass
class AgentState:
    """One run of one agent. `messages` is the full transcript (the prompt may show less)."""

    key: str
    task: str
    messages: list[dict[str, Any]]
    phase: str = "generating"
    status: str = "running"
    stop_reason: str = ""
    error: str | None = None
    answer: Any = None
    turns: list[Turn] = field(default_factory=list)
    pending_action: str | None = None
    pending_calls: list[ToolCall] = field(default_factory=list)
    pending_results: list[ToolResult] = field(default_factory=list)
    pending_observation: str | None = None
    trace: list[ToolAttempt] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    elapsed_s: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.phase == "done"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = STATE_VERSION
        data["turns"] = [t.to_dict() for t in self.turns]
        data["pending_calls"] = [c.to_dict() for c in self.pending_calls]
        data["pending_results"] = [r.to_dict() for r in self.pending_results]
        data["trace"] = [a.to_dict() for a in self.trace]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentState:
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise StateError(f"not an agent state of version {STATE_VERSION}")
        data = dict(data)
        data.pop("version")
        if data.get("phase") not in PHASES:
            raise StateError(f"unknown phase {data.get('phase')!r} (valid: {', '.join(PHASES)})")
        try:
            data["turns"] = [Turn.from_dict(t) for t in data.get("turns") or []]
            data["pending_calls"] = [ToolCall.from_dict(c) for c in data.get("pending_calls") or []]
            data["pending_results"] = [ToolResult.from_dict(r) for r in data.get("pending_results") or []]
            data["trace"] = [ToolAttempt.from_dict(a) for a in data.get("trace") or []]
            data["counters"] = Counters(**(data.get("counters") or {}))
            return cls(**data)
        except (TypeError, KeyError) as exc:
            raise StateError(f"malformed agent state: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> AgentState:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"agent state is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state as JSON, atomically (a crash mid-write leaves the old file)."""
        write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AgentState:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"{path}: cannot read agent state ({exc})") from exc
        return cls.from_json(text)

    def result(self) -> dict[str, Any]:
        """The outcome as JSON-ready data (what `ponder run-agent` prints)."""
        return {
            "status": self.status,
            "answer": self.answer,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "turns": self.counters.turns,
            "tool_attempts": [a.to_dict() for a in self.trace],
            "generated_tokens": self.counters.generated_tokens,
            "elapsed_s": round(self.elapsed_s, 3),
            "transcript": self.messages,
        }

    def to_trajectory(self) -> Trajectory:
        """The run as a rollout record (no token ids: the agent works on text)."""
        trajectory = Trajectory(task_id=self.key, prompt_ids=[], turns=list(self.turns), stop_reason=self.stop_reason)
        trajectory.metrics = {
            "turns": float(self.counters.turns),
            "tool_calls": float(sum(len(t.tool_calls) for t in self.turns)),
            "tool_errors": float(sum(r.is_error for t in self.turns for r in t.tool_results)),
            "parse_errors": float(sum(t.error is not None for t in self.turns)),
            "generated_tokens": float(self.counters.generated_tokens),
            "answered": float(self.status == ANSWERED),
        }
        return trajectory
