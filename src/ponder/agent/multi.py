"""Several agents on one task: a coordinator with role agents, or peers in a shared chat.

Both keep a shared transcript of `TeamMessage`s and both always terminate:
- `max_rounds` bounds the rounds (a plan-and-dispatch round, or one message per peer);
- loop detection stops a run whose plan, or a peer's message, repeats one seen before;
- `wall_clock_s` bounds the whole run: each sub-agent gets only the time that is left,
  and a run out of time returns `timeout` with everything gathered so far.
Every sub-agent is an ordinary `Agent` (its own tools, limits and schema), run on a
key of its name, so scripted tests drive each role separately, or a remote A2A agent
(`ponder.agent.a2a_peer.RemoteAgent`: same `run`, a failed call is an `error` run with a
one-line reason, its reply marked as untrusted data).

A `TrustBoundary` (ponder.agent.trust) makes every member's output data for the others
(escaped, under its sender's header, through the injection detector) and keeps
privileges from flowing: member runs after a reply was read start tainted by it, with
the user's request as their authority.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ponder.agent.loop import Agent, replace_config
from ponder.agent.state import AgentState
from ponder.agent.trust import PeerReply, TrustBoundary, render_reply, seed_record, with_guard

# A team member: a local Agent, or anything with `config.wall_clock_s`, `run(task, key)`
# and `with_time_limit(seconds)` (a remote A2A agent).
Member = Any


@dataclass
class TeamConfig:
    """Limits of a multi-agent run.

    max_rounds: plan-and-dispatch rounds (coordinator) or message rounds (peers).
    max_subtasks: subtasks one plan may dispatch.
    wall_clock_s: time limit of the whole run, shared by every sub-agent.
    final_marker: a peer message starting with this ends the chat with its answer.
    """

    max_rounds: int = 3
    max_subtasks: int = 4
    wall_clock_s: float = 300.0
    final_marker: str = "FINAL:"


@dataclass
class TeamMessage:
    """One entry of the shared transcript; `to` is a name or "all"."""

    sender: str
    to: str
    content: str
    round: int


@dataclass
class TeamResult:
    """How the run ended: status `answered` or `stopped`; stop_reason `answer`, `merged`,
    `max_rounds`, `loop_detected` or `timeout`; `runs` are the sub-agents' results."""

    status: str
    stop_reason: str
    answer: Any
    rounds: int
    transcript: list[TeamMessage] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_schema(roles: list[str], max_subtasks: int) -> dict[str, Any]:
    """A plan is either subtasks for the roles or the final answer."""
    subtask = {
        "type": "object",
        "properties": {"role": {"enum": roles}, "task": {"type": "string", "minLength": 1}},
        "required": ["role", "task"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "subtasks": {"type": "array", "items": subtask, "minItems": 1, "maxItems": max_subtasks},
            "answer": {"type": "string", "minLength": 1},
        },
        "oneOf": [{"required": ["subtasks"]}, {"required": ["answer"]}],
        "additionalProperties": False,
    }


class _Clocked:
    """The time left in a team run, and sub-agents limited to it."""

    def __init__(self, config: TeamConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.started = clock()

    def remaining(self) -> float:
        return self.config.wall_clock_s - (self.clock() - self.started)

    def run(self, agent: Member, task: str, key: str, result: TeamResult,
            record: dict[str, Any] | None = None) -> AgentState:  # fmt: skip
        """`agent` on `task` in the time left; `record` seeds a local agent's guard record."""
        budget = max(0.001, min(agent.config.wall_clock_s, self.remaining()))
        # a remote member (ponder.agent.a2a_peer.RemoteAgent) limits its own call
        limit = getattr(agent, "with_time_limit", None)
        limited = limit(budget) if limit is not None else replace_config(agent, wall_clock_s=budget)
        if record is not None and limit is None:
            state = limited.start(task, key=key)
            state.memory.setdefault("guard", {}).update(copy.deepcopy(record))
            state = limited.run(state)
        else:
            state = limited.run(task, key=key)
        result.runs.append({"agent": key, **state.result()})
        return state


class Coordinator:
    """Plans with `planner`, dispatches subtasks to `roles`, merges with `merger`.

    Each round the planner sees the task and every result so far, and answers with a
    JSON plan (`plan_schema`): subtasks for named roles, or the final answer. When
    rounds end without an answer (max_rounds, a repeated plan, or time), the merger,
    if given, writes the answer from the results gathered.
    """

    def __init__(self, planner: Agent, roles: dict[str, Member], merger: Agent | None = None,
                 config: TeamConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 boundary: TrustBoundary | None = None) -> None:  # fmt: skip
        if not roles:
            raise ValueError("a coordinator needs at least one role agent")
        self.config = config or TeamConfig()
        self.boundary = boundary
        guard = boundary.member_guard if boundary is not None else None
        planner = with_guard(planner, guard)
        self.planner = replace_config(planner, answer_schema=plan_schema(sorted(roles), self.config.max_subtasks))
        self.roles = {name: with_guard(member, guard) for name, member in roles.items()}
        self.merger = with_guard(merger, guard) if merger is not None else None
        self.clock = clock

    def run(self, task: str) -> TeamResult:
        timer = _Clocked(self.config, self.clock)
        result = TeamResult("stopped", "max_rounds", None, 0)
        results: list[str] = []
        read: list[PeerReply] = []  # the replies the team has read (with a boundary)
        seen_plans: set[str] = set()
        while result.rounds < self.config.max_rounds:
            if timer.remaining() <= 0:
                result.stop_reason = "timeout"
                break
            result.rounds += 1
            plan = timer.run(self.planner, _planner_prompt(task, results), "planner", result,
                             self._record(task, read))  # fmt: skip
            if plan.status != "answered":
                result.stop_reason = "timeout" if plan.stop_reason == "timeout" else "planner_failed"
                break
            if "answer" in plan.answer:
                result.transcript.append(TeamMessage("planner", "user", plan.answer["answer"], result.rounds))
                result.status, result.stop_reason, result.answer = "answered", "answer", plan.answer["answer"]
                return result
            fingerprint = json.dumps(plan.answer["subtasks"], sort_keys=True)
            if fingerprint in seen_plans:
                result.stop_reason = "loop_detected"
                break
            seen_plans.add(fingerprint)
            self._dispatch(plan.answer["subtasks"], timer, result, results, task, read)
        return self._merge(task, results, timer, result, read)

    def _record(self, task: str, read: list[PeerReply]) -> dict[str, Any] | None:
        """The guard record a member run starts with: tainted by the replies read (carry_taint)."""
        if self.boundary is None or not self.boundary.carry_taint or not read:
            return None
        return seed_record(task, read)

    def _dispatch(self, subtasks: list[dict[str, str]], timer: _Clocked, result: TeamResult, results: list[str],
                  task: str, read: list[PeerReply]) -> None:  # fmt: skip
        for subtask in subtasks:
            role, text = subtask["role"], subtask["task"]
            result.transcript.append(TeamMessage("planner", role, text, result.rounds))
            if timer.remaining() <= 0:
                results.append(f"[{role}] {text} -> not run: out of time")
                continue
            state = timer.run(self.roles[role], text, role, result, self._record(task, read))
            reply = _reply_text(state)
            result.transcript.append(TeamMessage(role, "planner", reply, result.rounds))
            shown = reply
            if self.boundary is not None:
                shown, flagged = render_reply(self.boundary, role, reply, bool(state.memory.get("reply_marked")))
                read.append(PeerReply(role, reply, flagged))
            results.append(f"[{role}] {text} -> {shown}")

    def _merge(self, task: str, results: list[str], timer: _Clocked, result: TeamResult,
               read: list[PeerReply]) -> TeamResult:  # fmt: skip
        if self.merger is None or not results or timer.remaining() <= 0:
            result.answer = "\n".join(results) or None  # what was gathered, clearly marked as not merged
            return result
        state = timer.run(self.merger, _merge_prompt(task, results), "merger", result, self._record(task, read))
        if state.status == "answered":
            result.transcript.append(TeamMessage("merger", "user", str(state.answer), result.rounds))
            result.status, result.answer = "answered", state.answer
            result.stop_reason = f"merged_after_{result.stop_reason}"
        else:
            result.answer = "\n".join(results)
        return result


def _reply_text(state: AgentState) -> str:
    if state.status == "answered":
        return state.answer if isinstance(state.answer, str) else json.dumps(state.answer)
    return f"(no answer: {state.status}, {state.stop_reason}{': ' + state.error if state.error else ''})"


def _planner_prompt(task: str, results: list[str]) -> str:
    done = "\n".join(results) if results else "(none yet)"
    return (f"Task: {task}\nResults so far:\n{done}\n"
            'Reply with {"subtasks": [{"role": ..., "task": ...}]} to delegate, or {"answer": ...} when you can answer.')


def _merge_prompt(task: str, results: list[str]) -> str:
    return f"Task: {task}\nResults from the team:\n" + "\n".join(results) + "\nWrite the final answer to the task."


class PeerChat:
    """Agents take turns writing to a shared transcript until one writes the final answer.

    Each turn an agent reads the task and the whole transcript and writes one message
    (its run's answer); `@name` at the start addresses one peer, otherwise all. A
    message starting with `final_marker` ends the chat with the rest as the answer.
    """

    def __init__(self, agents: dict[str, Member], config: TeamConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, boundary: TrustBoundary | None = None) -> None:
        if len(agents) < 2:
            raise ValueError("a peer chat needs at least two agents")
        guard = boundary.member_guard if boundary is not None else None
        self.agents = {name: with_guard(agent, guard) for name, agent in agents.items()}
        self.config = config or TeamConfig()
        self.clock = clock
        self.boundary = boundary

    def run(self, task: str) -> TeamResult:
        timer = _Clocked(self.config, self.clock)
        result = TeamResult("stopped", "max_rounds", None, 0)
        seen: set[str] = set()
        marked: set[int] = set()  # transcript entries already escaped under a header (remote replies)
        while result.rounds < self.config.max_rounds:
            result.rounds += 1
            for name, agent in self.agents.items():
                if timer.remaining() <= 0:
                    result.stop_reason = "timeout"
                    return result
                prompt = self._prompt(task, name, result.transcript, marked)
                state = timer.run(agent, prompt, name, result, self._record(task, name, result.transcript))
                message = _reply_text(state).strip()
                to = message[1:].split(maxsplit=1)[0] if message.startswith("@") and len(message) > 1 else "all"
                if state.memory.get("reply_marked"):
                    marked.add(len(result.transcript))
                result.transcript.append(TeamMessage(name, to, message, result.rounds))
                if message.startswith(self.config.final_marker):
                    result.status, result.stop_reason = "answered", "answer"
                    result.answer = message[len(self.config.final_marker) :].strip()
                    return result
                normalised = " ".join(message.lower().split())
                if normalised in seen:
                    result.stop_reason = "loop_detected"
                    return result
                seen.add(normalised)
        return result

    def _record(self, task: str, name: str, transcript: list[TeamMessage]) -> dict[str, Any] | None:
        """The guard record of `name`'s run: tainted by the other peers' messages (carry_taint)."""
        boundary = self.boundary
        if boundary is None or not boundary.carry_taint:
            return None
        detector = boundary.detector
        replies = [PeerReply(m.sender, m.content, bool(detector and detector.scan(m.content).flagged))
                   for m in transcript if m.sender != name]  # fmt: skip
        return seed_record(task, replies) if replies else None

    def _line(self, name: str, index: int, message: TeamMessage, marked: set[int]) -> str:
        if self.boundary is None or message.sender == name:
            return f"{message.sender} -> {message.to}: {message.content}"
        shown, _ = render_reply(self.boundary, message.sender, message.content, index in marked)
        return f"{message.sender} -> {message.to}:\n{shown}"

    def _prompt(self, task: str, name: str, transcript: list[TeamMessage], marked: set[int] | None = None) -> str:
        peers = ", ".join(n for n in self.agents if n != name)
        lines = "\n".join(self._line(name, i, m, marked or set()) for i, m in enumerate(transcript))
        lines = lines or "(no messages yet)"
        return (f"You are {name}, working with {peers} on this task: {task}\nConversation so far:\n{lines}\n"
                f"Write your next message. Start it with {self.config.final_marker} when you have the final answer.")
