"""The agent runtime: a small explicit state machine over any chat policy.

Each `Agent.step(state)` makes one transition (see `ponder.agent.state` for the
diagram) and leaves the state at a boundary where it can be saved as JSON and
resumed, in this process or another. Tool calls go through `run_tool_step`, the
parse → validate → call → observe step rollouts use, with a `ToolRunner` adding
retries, backoff and fallbacks. Nothing the model or a tool does raises out of the
loop: parse errors and tool failures become observations, limits end the run with
`stopped` (an answer cut off at the token cap: stop reason `length`), a failing model
ends it with `error`, and the transcript is kept.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from ponder.agent.config import AgentConfig
from ponder.agent.policy import ChatPolicy, PolicyError
from ponder.agent.prompt import system_prompt
from ponder.agent.runner import ToolRunner
from ponder.agent.schema import check_answer, correction_message
from ponder.agent.state import ANSWERED, ERROR, FAILED, STOPPED, AgentState
from ponder.agent.window import fit_window
from ponder.tools import ToolRegistry, get_parser, run_tool_step
from ponder.tools.parsers import Parser
from ponder.tools.safety import Guard
from ponder.types import Turn

logger = logging.getLogger(__name__)

EventCallback = Callable[[str, Any], None]


class ToolSelector(Protocol):
    """Ranks tools for a query: `search(queries, topk)` → per query, hits with a `.spec`
    (ponder.tools.retrieval.ToolIndex is one)."""

    def search(self, queries: list[str], topk: int) -> list[list[Any]]: ...

TRUNCATION_MARK = "…[truncated: {n} more characters]"
_NUDGE = "No tool call and no answer found; call a tool or give your final answer."


class Agent:
    """An agent: a policy, tools and a config. Reusable across runs; the run lives in AgentState.

    `on_event(kind, payload)` sees the run as it happens: "text" (streamed model text),
    "action", "tool_result", "observation", "correction", "answer", "done".
    `guard` (ponder.tools.safety.Guard) checks every tool call and output of a run, and
    (with a conversation layer) every user turn before it runs; its per-run record lives
    in `state.memory["guard"]`.
    """

    def __init__(
        self,
        policy: ChatPolicy,
        tools: ToolRegistry | list[Any] | None = None,
        config: AgentConfig | None = None,
        on_event: EventCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tool_retriever: ToolSelector | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.policy = policy
        self.tool_retriever = tool_retriever
        self.guard = guard
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools or [])
        self.config = config or AgentConfig()
        self.on_event = on_event
        self.clock = clock
        self.sleep = sleep
        options: dict[str, Any] = {"specs": self.registry.specs()} if self.config.style == "react" else {}
        if self.config.raw_tool_output:
            options.update(escape=False, mark_source=False)
        self.parser: Parser = get_parser(self.config.style, **options)

    def start(self, task: str, key: str | None = None, lessons: list[str] | None = None) -> AgentState:
        """A fresh state for `task`; `lessons` (reflection memory) go into the system prompt."""
        config = self.config
        system = self._system_prompt(self.registry.specs(), lessons)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        state = AgentState(key=key or uuid.uuid4().hex[:12], task=task, messages=messages)
        if lessons:
            state.memory["lessons"] = list(lessons)
        schema_error = config.schema_error()
        if schema_error is not None:
            self._finish(state, ERROR, "invalid_schema", schema_error)
        else:
            self._check_turn(state, task)
        return state

    def run(self, task: str | AgentState, max_steps: int | None = None, key: str | None = None) -> AgentState:
        """Step until the run is done, or `max_steps` steps were made (an interruption:
        the returned state is at a step boundary and `run(state)` resumes it)."""
        state = self.start(task, key) if isinstance(task, str) else task
        made = 0
        while not state.finished and (max_steps is None or made < max_steps):
            self.step(state)
            made += 1
        return state

    def follow_up(self, state: AgentState, message: str) -> AgentState:
        """Continue a finished conversation with a new user message (chat). Turn, token,
        correction and time limits apply afresh to the new request; the transcript stays."""
        state.messages.append({"role": "user", "content": message})
        state.phase, state.status, state.stop_reason, state.error, state.answer = "generating", "running", "", None, None
        state.counters.turns = state.counters.corrections = state.counters.generated_tokens = 0
        state.elapsed_s = 0.0
        self._check_turn(state, message)
        return state

    def _check_turn(self, state: AgentState, message: str) -> None:
        """The guard's conversation layer: a turn it refuses ends this request with the
        refusal as the answer (stopped, stop reason `refused`) before the model sees it."""
        if self.guard is None or self.guard.conversation is None:
            return
        refusal = self.guard.check_turn(message, state.memory.setdefault("guard", {}))
        if refusal is not None:
            state.messages.append({"role": "assistant", "content": refusal})
            self._finish(state, STOPPED, "refused", None, refusal)

    def step(self, state: AgentState) -> AgentState:
        """One transition of the state machine; never raises for model or tool failures."""
        if state.finished:
            return state
        started = self.clock()
        handlers = {
            "generating": self._generate,
            "calling_tools": self._call_tools,
            "observing": self._observe,
            "answering": self._answer,
        }
        try:
            handlers[state.phase](state, started)
        except PolicyError as exc:
            self._finish(state, ERROR, "model_error", str(exc))
        except Exception as exc:  # a bug must end the run with its transcript, not lose it
            logger.exception("agent step failed in phase %s", state.phase)
            self._finish(state, ERROR, "internal_error", f"{type(exc).__name__}: {exc}")
        state.elapsed_s += self.clock() - started
        state.counters.steps += 1
        return state

    def _remaining(self, state: AgentState, started: float) -> float:
        return self.config.wall_clock_s - state.elapsed_s - (self.clock() - started)

    def _limit_reached(self, state: AgentState, started: float) -> str | None:
        config, counters = self.config, state.counters
        if self._remaining(state, started) <= 0:
            return "timeout"
        if counters.turns >= config.max_turns:
            return "max_turns"
        if counters.generated_tokens >= config.max_generated_tokens:
            return "max_tokens"
        return None

    def _generate(self, state: AgentState, started: float) -> None:
        reason = self._limit_reached(state, started)
        if reason is not None:
            return self._finish(state, STOPPED, reason, None)
        config = self.config
        offered = self.retrieve_tools(state)
        shown = fit_window(state.messages, config.window_tokens, self.policy.count_tokens, config.window_mode)
        if sum(self.policy.count_tokens(str(m.get("content") or "")) for m in shown) > config.max_context_tokens:
            return self._finish(state, STOPPED, "max_context", None)
        budget = min(config.max_new_tokens_per_turn, config.max_generated_tokens - state.counters.generated_tokens)
        on_text = (lambda text: self._emit("text", text)) if self.on_event else None
        constrained = {"constraint": self._call_grammar(offered)} if config.constrain_calls else {}
        try:
            completion = self.policy.complete(
                shown, list(self.parser.stop_strings), budget, state.key, on_text, self._remaining(state, started),
                **constrained,
            )
        except PolicyError:
            raise
        except Exception as exc:  # any model failure ends the run the same readable way
            raise PolicyError(f"the model failed: {type(exc).__name__}: {exc}") from exc
        counters = state.counters
        counters.model_calls += 1
        counters.turns += 1
        counters.generated_tokens += completion.completion_tokens
        counters.prompt_tokens = completion.prompt_tokens
        action = completion.text
        state.messages.append({"role": "assistant", "content": action})
        parsed = self.parser.parse(action)
        state.turns.append(Turn(index=len(state.turns), action=action, answer=parsed.answer, error=parsed.error,
                                tool_calls=list(parsed.calls), n_action_tokens=completion.completion_tokens,
                                offered_tools=offered))
        self._emit("action", action)
        if parsed.answer is not None and completion.finish_reason == "length":
            # Plain text cut off at the token cap parses as an answer, but it is only the
            # start of one: report the cut-off, not a finished answer.
            per_turn = budget == config.max_new_tokens_per_turn
            cap = "max_new_tokens_per_turn" if per_turn else "max_generated_tokens"
            message = (f"the reply was cut off at {completion.completion_tokens} new tokens ({cap}); "
                       "the partial reply is the last assistant message")
            return self._finish(state, STOPPED, "length", message)
        state.pending_action = action
        state.pending_calls = list(parsed.calls)
        state.phase = "answering" if parsed.answer is not None else "calling_tools"

    def interrupt(self, state: AgentState) -> AgentState:
        """End a run the user stopped (Ctrl-C in `ponder chat`) as `stopped` / `interrupted`.

        A KeyboardInterrupt leaves the state at its last step boundary (each handler
        changes the state only after the model or tool returned), so the transcript so
        far stays whole and `follow_up` can continue the conversation."""
        if not state.finished:
            self._clear_pending(state)
            self._finish(state, STOPPED, "interrupted", None)
        return state

    def retrieve_tools(self, state: AgentState) -> list[str]:
        """The `retrieve_tools` step: with a tool retriever, rank the registered tools for
        the task and the latest observation and rewrite the system prompt to list the top
        `retrieve_tools_topk`; returns their names ([] when every tool is listed)."""
        topk = self.config.retrieve_tools_topk
        if self.tool_retriever is None or topk <= 0:
            return []
        query = state.task
        if state.turns and state.turns[-1].observation:
            query += "\n" + state.turns[-1].observation
        hits = self.tool_retriever.search([query], topk)[0]
        offered = [hit.spec.name for hit in hits if hit.spec.name in self.registry][:topk]
        specs = {spec.name: spec for spec in self.registry.specs()}
        state.messages[0]["content"] = self._system_prompt([specs[name] for name in offered],
                                                           state.memory.get("lessons"))
        self._emit("tools_offered", offered)
        return offered

    def _call_grammar(self, offered: list[str]) -> Any:
        """constrain_calls: the grammar of a call to the tools the prompt lists this turn
        (`offered`, or every registered tool), switched on when the model opens a call."""
        from ponder.rollout.constrain import tool_calls

        specs = [spec for spec in self.registry.specs() if not offered or spec.name in offered]
        return tool_calls(specs, strict=False, opened=True) if specs else None

    def _system_prompt(self, specs: list[Any], lessons: list[str] | None) -> str:
        # Tools the guard's allow-list refuses are not offered: the model is not invited to call them.
        config = self.config
        shown = self.guard.offered(specs) if self.guard is not None else specs
        return system_prompt(config.style, shown, config.instructions, config.answer_schema, lessons,
                             config.untrusted_rule)

    def _call_tools(self, state: AgentState, started: float) -> None:
        runner = ToolRunner(self.registry, self.config, lambda: self._remaining(state, started), self.sleep)
        runner.turn = len(state.turns) - 1
        tools: Any = runner
        if self.guard is not None:
            tools = self.guard.session(runner, state.memory.setdefault("guard", {}), state.task, runner.turn)
        outcome = run_tool_step(state.pending_action or "", self.parser, tools, truncate=self._truncate)
        state.trace.extend(runner.attempts)
        state.pending_results = list(outcome.results)
        state.pending_observation = outcome.observation if outcome.observation is not None else _NUDGE
        for result in outcome.results:
            self._emit("tool_result", result)
        state.phase = "observing"

    def _observe(self, state: AgentState, started: float) -> None:
        observation = (state.pending_observation or "").strip("\n")
        turn = state.turns[-1]
        turn.tool_results = list(state.pending_results)
        turn.observation = observation
        state.messages.append({"role": "user", "content": observation})
        self._emit("observation", observation)
        self._clear_pending(state)
        state.phase = "generating"

    def _answer(self, state: AgentState, started: float) -> None:
        text = state.turns[-1].answer or ""
        self._clear_pending(state)
        if self.config.answer_schema is None:
            return self._finish(state, ANSWERED, "answer", None, text)
        value, error = check_answer(text, self.config.answer_schema)
        if error is None:
            return self._finish(state, ANSWERED, "answer", None, value)
        state.turns[-1].error = f"answer does not match the schema: {error}"
        state.counters.corrections += 1
        allowed = self.config.max_corrections
        if state.counters.corrections > allowed:
            message = f"the final answer did not match the schema after {allowed} corrections: {error}"
            return self._finish(state, FAILED, "schema_failed", message, None)
        feedback = correction_message(error, state.counters.corrections, allowed)
        state.turns[-1].observation = feedback
        state.messages.append({"role": "user", "content": feedback})
        self._emit("correction", feedback)
        state.phase = "generating"

    def _truncate(self, text: str) -> str:
        limit = self.config.max_observation_chars
        if len(text) <= limit:
            return text
        return text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)

    def _clear_pending(self, state: AgentState) -> None:
        state.pending_action, state.pending_calls = None, []
        state.pending_results, state.pending_observation = [], None

    def _finish(self, state: AgentState, status: str, reason: str, error: str | None, answer: Any = None) -> None:
        state.status, state.stop_reason, state.error, state.answer = status, reason, error, answer
        state.phase = "done"
        self._emit("done", state)

    def _emit(self, kind: str, payload: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, payload)
            except Exception:  # a display callback must not end the run
                logger.exception("agent event callback failed on %r", kind)


def replace_config(agent: Agent, **changes: Any) -> Agent:
    """A copy of `agent` with some config fields changed (same policy and tools)."""
    config = dataclasses.replace(agent.config, **changes)
    return Agent(agent.policy, agent.registry, config, agent.on_event, agent.clock, agent.sleep, agent.tool_retriever,
                 agent.guard)
