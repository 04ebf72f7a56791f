"""MCP both ways, with real processes: ponder's client lists and calls ponder's own tools
through `ponder mcp-serve` (stdio and streamable HTTP) and a third-party server written
with the SDK's MCPServer; values, schema validation, isError results, timeouts, lost
servers and bad server specs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ponder.tools import ToolRegistry
from ponder.tools.mcp.client import McpConnection, McpServerError, McpServerSpec, parse_server_specs
from ponder.types import ToolCall

HERE = Path(__file__).parent
SERVE = ("python", "-m", "ponder.cli", "mcp-serve")


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _check_ponder_tools(connection: McpConnection, log: Path) -> None:
    """What both transports must do with `mcp-serve --tools calculator,python,echo`."""
    registry = ToolRegistry(connection.tools())
    assert registry.names() == ["calculator", "python", "echo"]
    schema = registry.get("calculator").spec.parameters
    assert schema["required"] == ["expression"] and schema["additionalProperties"] is False
    assert registry.call(ToolCall("calculator", {"expression": "2+3*4"})).content == "14"
    assert registry.call(ToolCall("echo", {"text": "héllo"})).content == "héllo"
    ran = registry.call(ToolCall("python", {"code": "print(6 * 7)"}))
    assert not ran.is_error and "42" in ran.content
    # the client's registry refuses a bad call before it is sent ...
    refused = registry.call(ToolCall("calculator", {"expression": 7}))
    assert refused.is_error and refused.content == "calculator: argument 'expression' must be string, got 7"
    extra = registry.call(ToolCall("calculator", {"expression": "1", "x": 2}))
    assert extra.is_error and "unexpected argument 'x'" in extra.content
    # ... and the server's own registry refuses one sent past it, as an isError result
    direct = connection.call("calculator", {})
    assert direct.is_error and direct.content == "calculator: missing required argument 'expression'"
    failing = registry.call(ToolCall("calculator", {"expression": "1/0"}))
    assert failing.is_error and failing.content == "calculator raised CalculatorError: division by zero"
    started = time.monotonic()
    slow = registry.call(ToolCall("python", {"code": "import time; time.sleep(8)"}), timeout_s=1.0)
    assert slow.is_error and slow.content == "tool 'python' timed out after 1 s"
    assert time.monotonic() - started < 2.5
    # the connection survives the timeout
    assert registry.call(ToolCall("calculator", {"expression": "sqrt(16)"})).content == "4"
    logged = [(c["tool"], c["arguments"], c["is_error"]) for c in _calls(log)]
    assert ("calculator", {"expression": "2+3*4"}, False) in logged
    assert ("calculator", {}, True) in logged and ("calculator", {"expression": "1/0"}, True) in logged
    assert not any(args == {"expression": 7} for _, args, _ in logged)  # refused on the client's side


def test_ponder_tools_over_stdio(tmp_path):
    log = tmp_path / "calls.jsonl"
    spec = McpServerSpec("ponder", (*SERVE, "--tools", "calculator,python,echo", "--call-log", str(log)))
    with McpConnection(spec) as connection:
        _check_ponder_tools(connection, log)
    assert connection.call("calculator", {"expression": "1"}).is_error  # closed: an error result, no crash


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_http(spec: McpServerSpec, process: subprocess.Popen, seconds: float = 60.0) -> McpConnection:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return McpConnection(spec).open()
        except McpServerError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_ponder_tools_over_streamable_http(tmp_path):
    log, port = tmp_path / "calls.jsonl", _free_port()
    command = [sys.executable, "-m", "ponder.cli", "mcp-serve", "--transport", "http", "--port", str(port),
               "--tools", "calculator,python,echo", "--call-log", str(log)]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        connection = _wait_for_http(McpServerSpec("http", url=f"http://127.0.0.1:{port}/mcp"), process)
        with connection:
            _check_ponder_tools(connection, log)
            process.terminate()
            process.wait(10)
            lost = connection.call("calculator", {"expression": "1"})
            assert lost.is_error and "MCP server 'http'" in lost.content
    finally:
        process.kill()
        process.wait()
    assert "at http://127.0.0.1:" in process.stderr.read()


def test_a_third_party_server_written_with_the_sdk(tmp_path):
    counts = tmp_path / "counts.txt"
    spec = McpServerSpec("units", ("python", str(HERE / "units_server.py"), str(counts)), timeout_s=1.0)
    with McpConnection(spec) as connection:
        registry = ToolRegistry(connection.tools())
        assert registry.names() == ["convert", "slow"]
        assert registry.call(ToolCall("convert", {"value": 3, "from_unit": "km", "to_unit": "m"})).content == "3000 m"
        wrong = registry.call(ToolCall("convert", {"value": 3, "from_unit": "km", "to_unit": "kg"}))
        assert wrong.is_error and wrong.content == "Error executing tool convert: cannot convert km to kg"  # isError
        bad = registry.call(ToolCall("convert", {"value": "three", "from_unit": "km", "to_unit": "m"}))
        assert bad.is_error and bad.content == "convert: argument 'value' must be number, got \"three\""
        slow = registry.call(ToolCall("slow", {"seconds": 5}))  # the spec's timeout_s is the tool's limit
        assert slow.is_error and slow.content == "tool 'slow' timed out after 1 s"
        assert registry.call(ToolCall("convert", {"value": 1, "from_unit": "mi", "to_unit": "km"})).content == "1.60934 km"
    assert counts.read_text().split() == ["convert", "convert", "slow", "convert"]  # the refused call never ran


def test_taking_some_tools_of_a_server():
    spec = McpServerSpec("units", ("python", str(HERE / "units_server.py")), tools=("convert",))
    with McpConnection(spec) as connection:
        assert [tool.name for tool in connection.tools()] == ["convert"]
    missing = McpServerSpec("units", ("python", str(HERE / "units_server.py")), tools=("weigh",))
    with McpConnection(missing) as connection, pytest.raises(McpServerError, match="has no tool 'weigh'; it lists: convert, slow"):
        connection.tools()


@pytest.mark.parametrize(("spec", "message"), [
    (McpServerSpec("gone", ("/nonexistent/server",)), r"MCP server 'gone' \(/nonexistent/server\): could not connect: FileNotFoundError"),
    (McpServerSpec("quits", ("python", "-c", "raise SystemExit(3)")), "MCP server 'quits' .*could not connect"),
    (McpServerSpec("mute", ("python", "-c", "import time; time.sleep(30)"), connect_timeout_s=1.0), "MCP server 'mute' .*no answer within 1 s"),
    (McpServerSpec("nobody", url="http://127.0.0.1:9/mcp"), "MCP server 'nobody' .*could not connect: ConnectError"),
])  # fmt: skip
def test_a_server_that_cannot_start_is_one_line_naming_it(spec, message):
    with pytest.raises(McpServerError, match=message) as caught:
        McpConnection(spec).open()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("entries", "message"), [
    ({"name": "x"}, "want a list of servers"),
    (["calc"], r"env.mcp_servers\[0\]: want a mapping"),
    ([{"command": ["a"]}], r"env.mcp_servers\[0\]: every server needs a non-empty `name`"),
    ([{"name": "calc"}], r"\[0\] \(calc\): give exactly one of `command`"),
    ([{"name": "calc", "command": ["a"], "url": "http://h/mcp"}], r"\(calc\): give exactly one of"),
    ([{"name": "calc", "url": "ftp://h"}], r"\(calc\): `url` must start with http"),
    ([{"name": "calc", "command": ["a"], "timeout": 3}], r"\(calc\): unknown key 'timeout'"),
    ([{"name": "calc", "command": ["a"], "timeout_s": 0}], r"\(calc\): `timeout_s` must be a number of seconds > 0"),
    ([{"name": "calc", "command": ["a"]}, {"name": "calc", "url": "http://h/mcp"}], "'calc' is used more than once"),
])  # fmt: skip
def test_bad_server_specs(entries, message):
    with pytest.raises(McpServerError, match=message):
        parse_server_specs(entries)


def test_a_good_spec_parses():
    (spec,) = parse_server_specs([{"name": "calc", "command": "python -m ponder.cli mcp-serve", "tools": "calculator",
                                   "timeout_s": 2, "env": {"A": 1}}])  # fmt: skip
    assert spec == McpServerSpec("calc", ("python", "-m", "ponder.cli", "mcp-serve"), tools=("calculator",),
                                 timeout_s=2.0, env=(("A", "1"),))  # fmt: skip


@pytest.mark.parametrize(("args", "message"), [
    (["--tools", "calculator,teleport"], "ponder mcp-serve: error: unknown built-in tool 'teleport'; valid: calculator, echo, "),
    (["--tools", "search"], "ponder mcp-serve: error: tool search needs --corpus FILE.jsonl"),
])  # fmt: skip
def test_mcp_serve_refuses_bad_tools_in_one_line(args, message):
    done = subprocess.run([sys.executable, "-m", "ponder.cli", "mcp-serve", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1
