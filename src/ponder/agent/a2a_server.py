"""A ponder agent as an Agent2Agent (A2A) server, built on the official `a2a-sdk`.

`a2a_app(agent, url, options)` is a Starlette app that serves:
- the agent card at `/.well-known/agent-card.json`: name, description, one skill per
  tool, capabilities (streaming on, push notifications off), the JSON-RPC interface at
  `url` (protocol 1.0, and 0.3 on the same endpoint);
- JSON-RPC at `/`: `SendMessage` / `message/send`, `SendStreamingMessage` /
  `message/stream`, `GetTask` / `tasks/get`, `CancelTask` / `tasks/cancel` (the SDK's
  dispatcher and request handler; errors are its JSON-RPC errors: -32001 for an unknown
  task, -32602 for a malformed message, -32002 for a task that cannot be cancelled).

Every message starts one task, run by `Agent` on a worker thread one at a time (a local
model serves one generation at a time). Each model action and tool result is a
`working` status update while it streams; an answered run ends `completed` with the
answer as the artifact `answer`; a run that stopped without one (a limit, a model error)
ends `failed`, its status message saying why. Cancelling stops the run at its next step
boundary. `serve_a2a` runs the app with uvicorn on a bound loopback socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ponder.agent.loop import Agent, replace_config
from ponder.agent.state import ANSWERED, AgentState
from ponder.extras import require

logger = logging.getLogger(__name__)

A2A_FEATURE = "ponder a2a-serve and A2A peers (the a2a-sdk)"
RPC_PATH = "/"
_EVENT_KINDS = ("started", "action", "tool_result")  # what a run streams as `working` updates


@dataclass
class A2AServeOptions:
    """What the server says about itself and how much it takes.

    name / description: the agent card's; an empty description is written from the
    model and tools. version: the card's agent version.
    max_message_chars: a longer message text is refused as invalid params.
    """

    name: str = "ponder-agent"
    description: str = ""
    version: str = "0.1.0"
    max_message_chars: int = 20_000


def agent_card(agent: Agent, url: str, options: A2AServeOptions) -> Any:
    """The A2A AgentCard of `agent` served at `url` (skills from its tools)."""
    require("a2a", "a2a", A2A_FEATURE)
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

    specs = agent.registry.specs()
    skills = [AgentSkill(id=spec.name, name=spec.name, description=spec.description or spec.name, tags=["tool"])
              for spec in specs]  # fmt: skip
    if not skills:
        skills = [AgentSkill(id="answer", name="answer", description="Answers a task in text.", tags=["chat"])]
    tools = ", ".join(spec.name for spec in specs) or "no tools"
    description = options.description or (
        f"A ponder agent (model {agent.policy.name}, {agent.config.style} tool calling) that answers a task in "
        f"up to {agent.config.max_turns} turns with: {tools}.")  # fmt: skip
    output = "application/json" if agent.config.answer_schema is not None else "text/plain"
    interfaces = [AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=version)
                  for version in ("1.0", "0.3")]  # fmt: skip
    return AgentCard(
        name=options.name, description=description, version=options.version, supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True, push_notifications=False), skills=skills,
        default_input_modes=["text/plain"], default_output_modes=[output],
    )  # fmt: skip


class _Executor:
    """Runs the ponder agent on each message's text; see the module docstring. Mixed into
    the SDK's AgentExecutor by `_executor` (the SDK is imported only when serving)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        # held by the worker thread for the whole run: a cancelled task's run ends at its next step
        # boundary, and the next run waits for that (a local model generates one thing at a time)
        self.lock = threading.Lock()
        self.stops: dict[str, threading.Event] = {}

    async def execute(self, context: Any, event_queue: Any) -> None:
        from a2a.helpers import get_message_text
        from a2a.server.tasks import TaskUpdater
        from a2a.types import Task, TaskState, TaskStatus

        task = context.current_task
        if task is None:
            task = Task(id=context.task_id, context_id=context.context_id, history=[context.message],
                        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))  # fmt: skip
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        stop = self.stops.setdefault(task.id, threading.Event())
        try:
            state = await self._run(get_message_text(context.message), task.id, stop, updater)
            if not stop.is_set():  # a cancelled run's final state was written by cancel()
                await _publish_outcome(state, updater)
        finally:
            self.stops.pop(task.id, None)

    async def _run(self, text: str, key: str, stop: threading.Event, updater: Any) -> AgentState:
        """The run on a worker thread; its events become `working` updates as they happen."""
        from a2a.helpers import new_text_part

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

        def on_event(kind: str, payload: Any) -> None:
            if kind in _EVENT_KINDS:
                loop.call_soon_threadsafe(events.put_nowait, (kind, _event_text(kind, payload)))

        worker = asyncio.ensure_future(asyncio.to_thread(_run_agent, self.agent, text, key, stop, on_event,
                                                         self.lock))  # fmt: skip
        try:
            while not worker.done() or not events.empty():
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait({getter, worker}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                kind, shown = getter.result()
                if kind == "started":
                    await updater.start_work()
                    continue
                message = updater.new_agent_message([new_text_part(shown)], metadata={"ponder_event": kind})
                await updater.update_status(_working(), message=message)
        except asyncio.CancelledError:
            stop.set()  # the run ends at its next step boundary
            raise
        return worker.result()

    async def cancel(self, context: Any, event_queue: Any) -> None:
        from a2a.helpers import new_text_part
        from a2a.server.tasks import TaskUpdater

        stop = self.stops.get(context.task_id or "")
        if stop is not None:
            stop.set()
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(updater.new_agent_message([new_text_part("cancelled by the client")]))


def _executor(agent: Agent) -> Any:
    from a2a.server.agent_execution import AgentExecutor

    return type("PonderExecutor", (_Executor, AgentExecutor), {})(agent)


def _working() -> Any:
    from a2a.types import TaskState

    return TaskState.TASK_STATE_WORKING


def _run_agent(agent: Agent, text: str, key: str, stop: threading.Event, on_event: Callable[[str, Any], None],
               lock: threading.Lock) -> AgentState:  # fmt: skip
    """One run on this thread with its own tool handles, after the runs before it (`lock`),
    ended early when `stop` is set."""
    with lock:
        return _run_alone(agent, text, key, stop, on_event)


def _run_alone(agent: Agent, text: str, key: str, stop: threading.Event,
               on_event: Callable[[str, Any], None]) -> AgentState:  # fmt: skip
    run = replace_config(agent)
    run.on_event, run.registry = on_event, agent.registry.fresh_copy()
    on_event("started", None)
    try:
        state = run.start(text, key=key)
        while not state.finished:
            if stop.is_set():
                return run.interrupt(state)
            run.step(state)
        return state
    finally:
        run.registry.close()


def _event_text(kind: str, payload: Any) -> str:
    if kind == "tool_result":
        prefix = "error from" if payload.is_error else "result of"
        return f"{prefix} {payload.name}: {payload.content}"
    return str(payload)


async def _publish_outcome(state: AgentState, updater: Any) -> None:
    from a2a.helpers import new_text_part

    summary = {"status": state.status, "stop_reason": state.stop_reason, "turns": state.counters.turns,
               "tool_calls": len(state.trace), "generated_tokens": state.counters.generated_tokens,
               "elapsed_s": round(state.elapsed_s, 3)}  # fmt: skip
    if state.status == ANSWERED:
        is_text = isinstance(state.answer, str)
        text = state.answer if is_text else json.dumps(state.answer, ensure_ascii=False)
        part = new_text_part(text, media_type="text/plain" if is_text else "application/json")
        await updater.add_artifact([part], artifact_id="answer", name="answer", metadata=summary, last_chunk=True)
        await updater.complete(updater.new_agent_message([new_text_part(text)], metadata=summary))
        return
    why = f"no answer: {state.status} ({state.stop_reason})" + (f": {state.error}" if state.error else "")
    await updater.failed(updater.new_agent_message([new_text_part(why)], metadata=summary))


class _CheckedHandler:
    """The SDK's request handler, refusing a message without usable text before a task
    starts (mixed into DefaultRequestHandler by `_handler`)."""

    max_message_chars = A2AServeOptions.max_message_chars

    def _check(self, params: Any) -> None:
        from a2a.helpers import get_message_text
        from a2a.utils.errors import InvalidParamsError

        text = get_message_text(params.message).strip()
        if not text:
            raise InvalidParamsError(message="the message has no text: send the task as a text part")
        if len(text) > self.max_message_chars:
            raise InvalidParamsError(
                message=f"the message text has {len(text)} characters; at most {self.max_message_chars}")

    async def on_message_send(self, params: Any, context: Any) -> Any:
        self._check(params)
        return await super().on_message_send(params, context)  # type: ignore[misc]

    async def on_message_send_stream(self, params: Any, context: Any) -> AsyncIterator[Any]:
        self._check(params)
        async for event in super().on_message_send_stream(params, context):  # type: ignore[misc]
            yield event


def _handler(executor: Any, card: Any, max_message_chars: int) -> Any:
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.tasks import InMemoryTaskStore

    handler_class = type("CheckedHandler", (_CheckedHandler, DefaultRequestHandler), {})
    handler = handler_class(executor, InMemoryTaskStore(), card)
    handler.max_message_chars = max_message_chars
    return handler


def a2a_app(agent: Agent, url: str, options: A2AServeOptions | None = None) -> Any:
    """The Starlette app serving `agent` over A2A, its card naming `url` (see module docstring)."""
    options = options or A2AServeOptions()
    card = agent_card(agent, url, options)
    require("starlette", "a2a", A2A_FEATURE)
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from starlette.applications import Starlette

    handler = _handler(_executor(agent), card, options.max_message_chars)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await handler.aclose()

    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, RPC_PATH, enable_v0_3_compat=True)
    return Starlette(routes=routes, lifespan=lifespan)


def bind(host: str, port: int) -> tuple[socket.socket, str]:
    """A socket bound to host:port (0: a free port) and listening, so a client that
    reads the printed URL before uvicorn starts is queued, not refused; and the URL the
    card will name."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown}:{sock.getsockname()[1]}{RPC_PATH}"


def serve_a2a(agent: Agent, host: str, port: int, options: A2AServeOptions | None = None,
              say: Callable[[str], None] = print, log_level: str = "warning") -> None:  # fmt: skip
    """Serve `agent` over A2A until interrupted; `say` gets the line naming the URL."""
    uvicorn = require("uvicorn", "a2a", A2A_FEATURE)
    sock, url = bind(host, port)
    app = a2a_app(agent, url, options)
    say(f"A2A agent '{(options or A2AServeOptions()).name}' on {url} (card: {url}.well-known/agent-card.json)")
    uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
