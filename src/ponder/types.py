"""Core records that flow through ponder: messages, tools, tasks, turns, trajectories.

Plain data only: this module imports nothing of ponder but the leaf `fileio`. Messages follow the
OpenAI / Hugging Face chat shape; tool-call arguments are dicts inside ponder and
JSON strings only at HTTP boundaries and in Parquet columns.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ponder.fileio import atomic_path


@dataclass
class ToolSpec:
    """A tool as the model sees it: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI / HF `tools=` shape: {"type": "function", "function": {...}}."""
        return {"type": "function", "function": asdict(self)}


@dataclass
class ToolCall:
    """One call the model asked for. `raw` is the exact text it was parsed from."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "raw": self.raw, "id": self.id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(data["name"], dict(data.get("arguments") or {}), data.get("raw", ""), data.get("id"))


@dataclass
class ToolResult:
    """What a tool returned. Exceptions, timeouts and bad arguments become is_error=True."""

    content: str
    is_error: bool = False
    name: str = ""
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        return cls(**data)


@dataclass
class Message:
    """A chat message: {"role", "content", "tool_calls"?, "name"?}."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """HF chat-template shape; tool calls as {"type": "function", "function": {...}}."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass
class Task:
    """One episode's job: a question, its gold answers and the tools it may use.

    `context` is text shown in the prompt (some questions are answerable from it);
    `oracle_actions` are the assistant turns of a known-good episode, used for SFT;
    `metadata` holds what an environment and its rewards know of the task (search-QA's
    `needs_search` and `hops`, math's level …).
    """

    id: str
    question: str
    answers: list[str]
    kind: str = "qa"
    context: str | None = None
    oracle_actions: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class Turn:
    """One model action and what the environment answered.

    `action` is the text the policy generated this turn; `observation` the text the
    environment appended after it (None when the episode ended on this turn).
    In the response a turn is n_action_tokens, then n_summary_tokens (context
    compaction's policy summary written here: its instruction, loss 0, and the summary,
    loss 1; rollout.context), then n_observation_tokens.
    """

    index: int
    action: str
    observation: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None
    n_action_tokens: int = 0
    n_observation_tokens: int = 0
    n_summary_tokens: int = 0
    # Names of the tools shown to the policy this turn when tools were retrieved per turn
    # (empty: every tool was shown), so RL with retrieval in the loop knows what was offered.
    offered_tools: list[str] = field(default_factory=list)
    # The environment's reward for this turn (info["reward"] of its step), if it gives one.
    reward: float | None = None

    @property
    def n_tokens(self) -> int:
        """The turn's tokens in the response: action, summary block, observation."""
        return self.n_action_tokens + self.n_summary_tokens + self.n_observation_tokens

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        data["tool_results"] = [r.to_dict() for r in self.tool_results]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        data = dict(data)
        data["tool_calls"] = [ToolCall.from_dict(c) for c in data.get("tool_calls") or []]
        data["tool_results"] = [ToolResult.from_dict(r) for r in data.get("tool_results") or []]
        return cls(**data)


@dataclass
class Trajectory:
    """One episode as token ids plus everything needed to train, evaluate or show it.

    Invariants: len(response_ids) == len(loss_mask) == len(old_logprobs).
    loss_mask[i] == 1 exactly where response_ids[i] was sampled from the policy;
    0 for tool output, retrieved text and any other environment text.
    old_logprobs[i] is the behaviour policy's log-probability of response_ids[i]
    at sampling time (0.0 where loss_mask is 0).
    segments: where context compaction (rollout.context) started the policy's context
    again: (offset, prompt_ids) per restart, response_ids[offset:] (up to the next
    restart) having been sampled after prompt_ids instead of after everything before;
    empty when the episode never compacted (one segment: prompt_ids + response_ids).
    """

    task_id: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    group_id: str = ""
    stop_reason: str = ""
    segments: list[tuple[int, list[int]]] = field(default_factory=list)
    # The grammar its actions were sampled under (a ponder.rollout.constrain.Constraint,
    # rollout.constrain), for the trainer to replay; kept in memory, not written to files.
    constraint: Any = None

    @property
    def final_answer(self) -> str | None:
        """The answer of the last turn that gave one, if any."""
        for turn in reversed(self.turns):
            if turn.answer is not None:
                return turn.answer
        return None

    @property
    def response_text(self) -> str:
        """The response as text: every action followed by its observation."""
        return "".join(t.action + (t.observation or "") for t in self.turns)

    def check(self) -> None:
        """Raise ValueError if the token-level invariants do not hold."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id}: response_ids ({n}), loss_mask ({len(self.loss_mask)}) "
                f"and old_logprobs ({len(self.old_logprobs)}) differ in length"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"trajectory {self.task_id}: loss_mask holds values other than 0/1")
        offsets = [0] + [offset for offset, _ in self.segments]
        if any(not a < b <= n for a, b in zip(offsets, offsets[1:])):
            raise ValueError(f"trajectory {self.task_id}: segment offsets {offsets[1:]} must increase within "
                             f"the response ({n} tokens)")

    def to_row(self) -> dict[str, Any]:
        """A flat dict for Parquet: turns as a list of structs, arguments as JSON text,
        breakdown and metrics as lists of {"key", "value"} structs (see _parquet_schema)."""
        row = asdict(self)
        del row["constraint"]
        row["turns"] = [_turn_row(t) for t in self.turns]
        row["breakdown"] = [{"key": k, "value": v} for k, v in self.breakdown.items()]
        row["metrics"] = [{"key": k, "value": v} for k, v in self.metrics.items()]
        row["segments"] = [{"offset": offset, "prompt_ids": list(ids)} for offset, ids in self.segments]
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        """Inverse of to_row; also reads rows of older files whose breakdown and
        metrics were Parquet maps (pyarrow gives those as (key, value) tuples)."""
        data = dict(row)
        data["turns"] = [_turn_from_row(t) for t in data.get("turns") or []]
        data["breakdown"] = _dict_from_pairs(data.get("breakdown"))
        data["metrics"] = _dict_from_pairs(data.get("metrics"))
        data["segments"] = [(int(s["offset"]), list(s["prompt_ids"])) for s in data.get("segments") or []]
        return cls(**data)


def _dict_from_pairs(pairs: list[Any] | dict[str, float] | None) -> dict[str, float]:
    if isinstance(pairs, dict):
        return dict(pairs)
    return dict((p["key"], p["value"]) if isinstance(p, dict) else p for p in pairs or [])


def _turn_row(turn: Turn) -> dict[str, Any]:
    data = turn.to_dict()
    data["tool_calls"] = [{**c, "arguments": json.dumps(c["arguments"])} for c in data["tool_calls"]]
    return data


def _turn_from_row(row: dict[str, Any]) -> Turn:
    data = dict(row)
    data["tool_calls"] = [{**c, "arguments": json.loads(c["arguments"])} for c in data["tool_calls"] or []]
    return Turn.from_dict(data)


def _parquet_schema():  # pyarrow is imported lazily: plain-data users need not load it
    import pyarrow as pa

    call = pa.struct([("name", pa.string()), ("arguments", pa.string()), ("raw", pa.string()), ("id", pa.string())])
    result = pa.struct(
        [("content", pa.string()), ("is_error", pa.bool_()), ("name", pa.string()), ("elapsed_s", pa.float64())]
    )
    turn = pa.struct(
        [
            ("index", pa.int64()),
            ("action", pa.string()),
            ("observation", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_results", pa.list_(result)),
            ("answer", pa.string()),
            ("error", pa.string()),
            ("n_action_tokens", pa.int64()),
            ("n_observation_tokens", pa.int64()),
            ("n_summary_tokens", pa.int64()),
            ("offered_tools", pa.list_(pa.string())),
            ("reward", pa.float64()),
        ]
    )
    named_value = pa.struct([("key", pa.string()), ("value", pa.float64())])
    segment = pa.struct([("offset", pa.int64()), ("prompt_ids", pa.list_(pa.int64()))])
    return pa.schema(
        [
            ("task_id", pa.string()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("old_logprobs", pa.list_(pa.float64())),
            ("turns", pa.list_(turn)),
            ("reward", pa.float64()),
            # Lists of {key, value} rather than Parquet maps: Hugging Face datasets has no
            # dtype for Arrow maps and refuses to load a file that has one.
            ("breakdown", pa.list_(named_value)),
            ("metrics", pa.list_(named_value)),
            ("group_id", pa.string()),
            ("stop_reason", pa.string()),
            ("segments", pa.list_(segment)),
        ]
    )


def save_trajectories(trajectories: list[Trajectory], path: str | os.PathLike[str]) -> None:
    """Write trajectories as Parquet rows, atomically (temp file, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([t.to_row() for t in trajectories], schema=_parquet_schema())
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def load_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Read trajectories written by save_trajectories."""
    import pyarrow.parquet as pq

    table = pq.read_table(os.fspath(path))
    return [Trajectory.from_row(row) for row in table.to_pylist()]
