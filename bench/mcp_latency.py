"""Per-call cost of a tool served over MCP: `ToolRegistry.call` of the calculator
(`2+3*4`) built in, through `ponder mcp-serve` over stdio, and over streamable HTTP;
plus the time to start the stdio server and connect.

    python bench/mcp_latency.py [--calls 200]

Prints medians in milliseconds (connect in seconds) as JSON; docs/guide/tools.md ("MCP")
quotes it.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

from ponder.tools import ToolRegistry
from ponder.tools.builtin import calculator
from ponder.tools.mcp.client import McpConnection, McpServerError, McpServerSpec
from ponder.types import ToolCall

SERVE = ("python", "-m", "ponder.cli", "mcp-serve", "--tools", "calculator")


def median_ms(registry: ToolRegistry, calls: int) -> float:
    call = ToolCall("calculator", {"expression": "2+3*4"})
    registry.call(call)  # warm-up
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        result = registry.call(call)
        times.append(time.perf_counter() - started)
        assert result.content == "14", result
    return round(statistics.median(times) * 1000, 3)


def over_http(calls: int) -> float:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, *SERVE[1:], "--transport", "http", "--port", str(port)],
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = McpConnection(McpServerSpec("http", url=f"http://127.0.0.1:{port}/mcp")).open()
                break
            except McpServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        with connection:
            return median_ms(ToolRegistry(connection.tools()), calls)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    report = {"built_in_ms": median_ms(ToolRegistry([calculator]), args.calls)}
    started = time.perf_counter()
    with McpConnection(McpServerSpec("stdio", SERVE)) as connection:
        report["stdio_connect_s"] = round(time.perf_counter() - started, 2)
        report["stdio_ms"] = median_ms(ToolRegistry(connection.tools()), args.calls)
    report["http_ms"] = over_http(args.calls)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
