"""A small third-party MCP server for tests, written with the SDK's own high-level API
(MCPServer, FastMCP's successor): a unit converter, a tool that fails, and a slow one.
Run as `python units_server.py [CALL_COUNT_FILE]`; each call appends its tool name to
that file, so a test can tell that a call really reached this process."""

import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

FACTORS = {("km", "m"): 1000.0, ("m", "km"): 0.001, ("mi", "km"): 1.609344, ("kg", "g"): 1000.0}
server = MCPServer("units", log_level="WARNING")


def _count(name: str) -> None:
    if len(sys.argv) > 1:
        with open(sys.argv[1], "a", encoding="utf-8") as handle:
            handle.write(name + "\n")


@server.tool()
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a value between units (km, m, mi, kg, g)."""
    _count("convert")
    if (from_unit, to_unit) not in FACTORS:
        raise ToolError(f"cannot convert {from_unit} to {to_unit}")
    return f"{value * FACTORS[(from_unit, to_unit)]:g} {to_unit}"


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then say so."""
    _count("slow")
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    server.run("stdio")
