"""MCP (Model Context Protocol) in both directions, with the official `mcp` SDK.

- client.py: tools of MCP servers (a command over stdio, or a streamable-HTTP URL)
  as ponder `Tool`s, registered next to built-in ones: validated, timed and shown
  the same way.
- server.py: `ponder mcp-serve`, ponder's own tools (calculator, python, search,
  rag) served to any MCP client.
"""

from ponder.tools.mcp.client import McpConnection, McpServerSpec, mcp_tools, parse_server_specs

__all__ = ["McpConnection", "McpServerSpec", "mcp_tools", "parse_server_specs"]
