"""Tools of MCP servers as ponder tools.

An MCP server is named in a recipe (`env.mcp_servers`) or in code as an
`McpServerSpec`: a command line started as a subprocess and spoken to over its
stdin/stdout, or the URL of a streamable-HTTP server. `McpConnection` holds one
session with one server; each tool the server lists becomes a plain ponder `Tool`
(its name, description and `inputSchema` as the JSON Schema), so a `ToolRegistry`
validates its arguments, times its calls and renders its results exactly as it does
for a built-in tool.

The SDK is async and ponder's tool calls are sync: the session lives on an event loop
of its own thread, and a call waits for its answer in short slices, so the registry's
limit stops it like any thread-mode tool (and the pending request is cancelled). A
server that cannot be started or reached is a one-line `McpServerError` naming it at
connect time; once running, its failures (an `isError` result, a protocol error, a
lost connection, a timeout) are error results the episode sees, never a crash.

What a server says about its tools is untrusted too (tool poisoning): the listed tools
go through a `ToolScreen` (ponder.tools.safety.poisoning) before they become ponder
tools, by the spec's `screen` (default `quarantine`: a tool whose definition reads as
instructions, or whose name imitates an earlier tool's, is left out with a one-line
warning naming the server and the tool).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from ponder.extras import require
from ponder.tools.base import Tool
from ponder.tools.safety.poisoning import SCREEN_ACTIONS, ScreenOptions, ToolScreen, ToolVerdict, screen_tools
from ponder.types import ToolResult, ToolSpec

logger = logging.getLogger(__name__)

SPEC_KEYS = ("name", "command", "url", "tools", "timeout_s", "connect_timeout_s", "env", "cwd", "screen")
# How often a waiting call wakes up: the registry's timeout can only stop it between waits.
_POLL_S = 0.05
_CLOSE_WAIT_S = 5.0
MCP_FEATURE = "env.mcp_servers (tools of MCP servers)"


class McpServerError(ValueError):
    """A server named in a recipe or spec that is malformed, cannot start or cannot be reached.
    A ValueError, so `ponder` commands print it as one line with exit code 2."""


@dataclass(frozen=True)
class McpServerSpec:
    """One MCP server.

    name: what errors and logs call it (also the key of a shared connection).
    command: the server's command line, started as a subprocess spoken to over stdio; a
        first word `python` is this interpreter (so `python -m ponder.cli mcp-serve`
        works without an activated virtual environment).
    url: a streamable-HTTP endpoint (`http://127.0.0.1:8765/mcp`) instead of a command.
    tools: the tool names to take from it; empty = every tool it lists.
    timeout_s: the limit of each call of its tools; None = the registry's default.
    connect_timeout_s: how long starting, the handshake and listing tools may take.
    env: extra environment variables for the command (the SDK passes only a safe few
        of ponder's own, such as PATH and HOME).
    cwd: the command's working directory; empty = ponder's.
    screen: what the tool-poisoning screen does with a tool whose definition reads as
        instructions: `quarantine` (left out), `strip` (cleaned), `flag` (kept, with the
        warning) or `off`.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    tools: tuple[str, ...] = ()
    timeout_s: float | None = None
    connect_timeout_s: float = 30.0
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    screen: str = "quarantine"

    def describe(self) -> str:
        return self.url or " ".join(self.command)


def parse_server_specs(entries: Any, where: str = "env.mcp_servers") -> list[McpServerSpec]:
    """Specs from a recipe's list of mappings; McpServerError (one line) naming the bad entry."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise McpServerError(f"{where}: want a list of servers ({{name, command | url}}), "
                             f"got {type(entries).__name__}")  # fmt: skip
    specs = [_parse_one(entry, f"{where}[{index}]") for index, entry in enumerate(entries)]
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise McpServerError(f"{where}: server name {repeated[0]!r} is used more than once")
    return specs


def _parse_one(entry: Any, where: str) -> McpServerSpec:
    if not isinstance(entry, Mapping):
        raise McpServerError(f"{where}: want a mapping {{name, command | url, ...}}, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise McpServerError(f"{where}: every server needs a non-empty `name`")
    where = f"{where} ({name})"
    unknown = sorted(set(entry) - set(SPEC_KEYS))
    if unknown:
        raise McpServerError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(SPEC_KEYS)}")
    command, url = entry.get("command"), entry.get("url") or ""
    if isinstance(command, str):
        command = command.split()
    if bool(command) == bool(url):
        raise McpServerError(f"{where}: give exactly one of `command` (a list of words) and `url`")
    if command and not all(isinstance(word, str) and word for word in command):
        raise McpServerError(f"{where}: `command` must be a list of non-empty strings, got {command!r}")
    if url and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise McpServerError(f"{where}: `url` must start with http:// or https://, got {url!r}")
    tools = entry.get("tools") or []
    if isinstance(tools, str):
        tools = [part.strip() for part in tools.split(",") if part.strip()]
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise McpServerError(f"{where}: `tools` must be a list of tool names, got {tools!r}")
    env = entry.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(v, (str, int, float)) for v in env.values()):
        raise McpServerError(f"{where}: `env` must map variable names to strings, got {env!r}")
    timeout_s = _positive(entry.get("timeout_s"), "timeout_s", where, allow_none=True)
    connect_s = _positive(entry.get("connect_timeout_s", 30.0), "connect_timeout_s", where)
    env_pairs = tuple((str(key), str(value)) for key, value in env.items())
    cwd = str(entry.get("cwd") or "")
    command = tuple(command or ())
    screen = entry.get("screen", "quarantine")
    if screen not in SCREEN_ACTIONS:
        raise McpServerError(f"{where}: `screen` must be one of {', '.join(SCREEN_ACTIONS)}, got {screen!r}")
    return McpServerSpec(name.strip(), command, url, tuple(tools), timeout_s, connect_s, env_pairs, cwd, screen)


def _positive(value: Any, key: str, where: str, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise McpServerError(f"{where}: `{key}` must be a number of seconds > 0, got {value!r}")
    return float(value)


class McpConnection:
    """One session with one MCP server, on an event loop in a thread of its own.

    `open()` starts (or reaches) the server, does the handshake and lists its tools;
    `tools()` gives them as ponder Tools; `call()` is the sync call they make;
    `close()` ends the session (and stops a server it started). Calls from several
    threads at once are fine: they all run on the connection's loop.
    """

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.listed: list[Any] = []  # the server's mcp_types.Tool records
        self.verdicts: list[ToolVerdict] = []  # the poisoning screen's, from the last tools()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._holder: concurrent.futures.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[Any] | None = None
        self._finished = threading.Event()
        self._client: Any = None
        self._lost: str = ""

    def open(self) -> McpConnection:
        """Connect and list the tools; McpServerError naming the server when that fails."""
        require("mcp", "mcp", MCP_FEATURE)  # here, not on the session's thread: one line, at once
        spec = self.spec
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{spec.name}", daemon=True)
        self._thread.start()
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._holder = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        try:
            self.listed = ready.result(timeout=spec.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpServerError(f"MCP server '{spec.name}' ({spec.describe()}): no answer within "
                                 f"{spec.connect_timeout_s:g} s") from None  # fmt: skip
        except Exception as exc:
            self.close()
            raise McpServerError(f"MCP server '{spec.name}' ({spec.describe()}): could not connect: "
                                 f"{_summary(exc)}") from None  # fmt: skip
        return self

    async def _hold(self, ready: concurrent.futures.Future[list[Any]]) -> None:
        """Enter the SDK client, hand its tool list to `open`, and keep the session until
        `close` (the SDK wants its context entered and left in one task)."""
        from mcp import Client

        self._stop, self._task = asyncio.Event(), asyncio.current_task()
        try:
            async with Client(self._target(), client_info=_client_info()) as client:
                listed = await _list_all_tools(client)
                self._client = client
                ready.set_result(listed)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to open(), or logged once as a lost session
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(type(exc).__name__))
            elif not self._stop.is_set():
                self._lost = _summary(exc)
                logger.warning("MCP server '%s' disconnected: %s", self.spec.name, self._lost)
        finally:
            self._client = None
            self._finished.set()

    def _target(self) -> Any:
        if self.spec.url:
            return self.spec.url
        from mcp import StdioServerParameters

        first, *rest = self.spec.command
        command = [sys.executable if first == "python" else first, *rest]
        return StdioServerParameters(command=command[0], args=command[1:], env=dict(self.spec.env) or None,
                                     cwd=self.spec.cwd or None)  # fmt: skip

    def tools(self, screen: ToolScreen | None = None, known: Mapping[str, str] | None = None) -> list[Tool]:
        """The server's tools (those `spec.tools` names, or all) as ponder Tools, through
        the poisoning screen: `screen`, else one acting as `spec.screen` says. `known` maps
        the names of tools registered before these to their source (for name shadowing)."""
        by_name = {listed.name: listed for listed in self.listed}
        missing = [name for name in self.spec.tools if name not in by_name]
        if missing:
            raise McpServerError(f"MCP server '{self.spec.name}' has no tool {missing[0]!r}; it lists: "
                                 f"{', '.join(by_name) or '(none)'}")  # fmt: skip
        wanted = self.spec.tools or tuple(by_name)
        tools = [self._as_tool(by_name[name]) for name in wanted]
        screen = screen or ToolScreen(ScreenOptions(action=self.spec.screen))
        kept, self.verdicts = screen_tools(tools, screen, f"MCP server '{self.spec.name}'", known)
        return kept

    def _as_tool(self, listed: Any) -> Tool:
        where = f"MCP server '{self.spec.name}', tool {listed.name!r}"
        schema = dict(listed.input_schema or {"type": "object"})
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as err:
            raise McpServerError(f"{where}: its inputSchema is not a JSON Schema ({err.message})") from None
        description = listed.description or getattr(listed, "title", None) or listed.name
        spec = ToolSpec(name=listed.name, description=" ".join(description.split()), parameters=schema)
        name = listed.name

        def call_remote(**arguments: Any) -> ToolResult:
            return self.call(name, arguments)

        try:
            return Tool(spec, call_remote, timeout_s=self.spec.timeout_s, isolation="thread")
        except ValueError as err:
            raise McpServerError(f"{where}: {err}") from None

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call tool `name` and wait for its result; never raises an error of the server's.

        The wait is sliced so that a registry timeout (raised into this thread) stops it;
        the request is then cancelled on the server's side."""
        client, loop, holder = self._client, self._loop, self._holder
        if client is None or loop is None or holder is None or holder.done():
            reason = f" ({self._lost})" if self._lost else ""
            return ToolResult(f"MCP server '{self.spec.name}' is not connected{reason}", is_error=True)
        future = asyncio.run_coroutine_threadsafe(client.call_tool(name, arguments), loop)
        try:
            while True:
                try:
                    return result_text(future.result(timeout=_POLL_S))
                except concurrent.futures.TimeoutError:
                    if holder.done():
                        return ToolResult(f"MCP server '{self.spec.name}' disconnected during the call", True)
                except Exception as exc:
                    return ToolResult(f"{name}: MCP server '{self.spec.name}' answered with an error: "
                                      f"{_summary(exc)}", is_error=True)  # fmt: skip
        finally:
            if not future.done():
                future.cancel()

    def close(self) -> None:
        """End the session and stop the loop; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._holder is not None and not self._finished.is_set():
            # A live session ends cleanly; one still connecting is cancelled. Either way wait
            # for the SDK's own cleanup, which stops a server it started.
            connected = self._client is not None and self._stop is not None
            end = self._stop.set if connected else self._cancel_hold  # type: ignore[union-attr]
            loop.call_soon_threadsafe(end)
            if not self._finished.wait(_CLOSE_WAIT_S):
                loop.call_soon_threadsafe(self._cancel_hold)
                self._finished.wait(_CLOSE_WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_CLOSE_WAIT_S)
        if self._thread is None or not self._thread.is_alive():
            loop.close()

    def _cancel_hold(self) -> None:  # runs on the loop
        if self._task is not None:
            self._task.cancel()
        elif self._holder is not None:  # not started yet
            self._holder.cancel()
            self._finished.set()

    def __enter__(self) -> McpConnection:
        return self.open() if self._loop is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _list_all_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):  # a server whose pages never end must not hang the connect
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _client_info() -> Any:
    from mcp import Implementation

    return Implementation(name="ponder", version="0.1.0")


def result_text(result: Any) -> ToolResult:
    """An MCP CallToolResult as the text the model reads; `isError` makes it an error result."""
    parts = [_block_text(block) for block in result.content or []]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    if result.is_error:
        return ToolResult(text or "the tool reported an error without a message", is_error=True)
    return ToolResult(text)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if kind == "resource":
        resource = block.resource
        return getattr(resource, "text", None) or f"[resource {resource.uri}]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    return f"[{kind or type(block).__name__} content]"


def _summary(exc: BaseException) -> str:
    """One line for an exception, looking inside the SDK's exception groups."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (a builtin from Python 3.11 on)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_OPEN: dict[McpServerSpec, McpConnection] = {}
_OPEN_LOCK = threading.Lock()


def shared_connection(spec: McpServerSpec) -> McpConnection:
    """The process's open connection to `spec` (opened on first use, closed at exit), so
    that building a recipe's parts twice (a check, then the run) starts one server."""
    with _OPEN_LOCK:
        connection = _OPEN.get(spec)
        if connection is None or connection._client is None:
            if connection is not None:
                connection.close()
            connection = _OPEN[spec] = McpConnection(spec).open()
        return connection


@atexit.register
def close_shared_connections() -> None:
    """Close every shared connection (stopping the servers they started)."""
    with _OPEN_LOCK:
        connections = list(_OPEN.values())
        _OPEN.clear()
    for connection in connections:
        connection.close()


def mcp_tools(specs: Iterable[McpServerSpec], known: Mapping[str, str] | None = None) -> list[Tool]:
    """The tools of every server in `specs`, through shared connections and each one's
    poisoning screen (`known`: names registered before them → their source; each server's
    tools are known to the next); McpServerError when one cannot be reached or two servers
    offer a tool of the same name."""
    tools: list[Tool] = []
    owner: dict[str, str] = {}
    seen = dict(known or {})
    for spec in specs:
        connection = shared_connection(spec)
        for name in spec.tools or [listed.name for listed in connection.listed]:
            if name in owner:  # a plain clash is a recipe's mistake, said so before any screening
                raise McpServerError(f"MCP servers '{owner[name]}' and '{spec.name}' both offer a tool "
                                     f"named {name!r}; pick one with `tools:`")  # fmt: skip
            owner[name] = spec.name
        kept = connection.tools(known=seen)
        seen.update((item.name, f"MCP server '{spec.name}'") for item in kept)
        tools.extend(kept)
    return tools
