"""`ponder mcp-serve`: ponder's own tools served to any MCP client.

The tools sit in a `ToolRegistry`, so a call over MCP is validated against the same
JSON Schema, stopped at the same limit and rendered to the same text as a call from a
ponder rollout; a bad call or a failing tool comes back as an `isError` result, never
as a protocol error. The `python` tool runs in ponder's jailed sandbox as everywhere.
Calls run in worker threads, so a slow call does not hold up the others.

Built on the SDK's low-level `Server`, which takes each tool's JSON Schema as it is
(FastMCP would derive schemas from Python signatures, and ponder already has them).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ponder.extras import require
from ponder.tools.registry import ToolRegistry
from ponder.types import ToolCall

TRANSPORTS = ("stdio", "http")
MCP_PATH = "/mcp"


class CallLog:
    """Appends one JSON line per call (tool, arguments, is_error, elapsed_s) to a file:
    a record of what clients ran, and the proof in tests that calls came over MCP."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    def write(self, call: ToolCall, is_error: bool, elapsed_s: float) -> None:
        if self.path is None:
            return
        line = json.dumps({"tool": call.name, "arguments": call.arguments, "is_error": is_error,
                           "elapsed_s": round(elapsed_s, 4)}, ensure_ascii=False, default=str)  # fmt: skip
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def build_server(registry: ToolRegistry, call_log: CallLog | None = None, name: str = "ponder") -> Any:
    """An MCP `Server` listing `registry`'s tools and running calls through it."""
    require("mcp", "mcp", "ponder mcp-serve")
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel.server import Server

    log = call_log or CallLog(None)
    listing = [types.Tool(name=spec.name, description=spec.description, input_schema=spec.parameters)
               for spec in registry.specs()]  # fmt: skip

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listing)

    async def call_tool(ctx: Any, params: Any) -> Any:
        call = ToolCall(params.name, dict(params.arguments or {}))
        started = time.perf_counter()
        # registry.call never raises and stops the tool at its limit; a thread keeps the loop free
        result = await anyio.to_thread.run_sync(registry.call, call)
        log.write(call, result.is_error, time.perf_counter() - started)
        content = [types.TextContent(text=result.content)]
        return types.CallToolResult(content=content, is_error=result.is_error)

    return Server(name, version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool)


def serve_stdio(registry: ToolRegistry, call_log: CallLog | None = None) -> None:
    """Serve over this process's stdin/stdout until the client closes stdin."""
    require("mcp", "mcp", "ponder mcp-serve")
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(registry, call_log)

    async def run() -> None:
        # stdio_server points fd 1 at stderr while serving: a stray print cannot break the wire
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


def serve_http(registry: ToolRegistry, host: str, port: int, call_log: CallLog | None = None) -> None:
    """Serve over streamable HTTP at http://HOST:PORT/mcp until interrupted."""
    require("mcp", "mcp", "ponder mcp-serve")
    import uvicorn

    app = build_server(registry, call_log).streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    print(f"ponder mcp-serve: tools {', '.join(registry.names())} at http://{host}:{port}{MCP_PATH}",
          file=sys.stderr, flush=True)  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level="warning")
