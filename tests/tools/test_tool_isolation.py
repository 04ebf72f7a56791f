"""A timed-out tool never keeps running; tool output is made safe in one place; one
action runs at most max_calls_per_action calls (issue 21, item 6)."""

import os
import re
import subprocess
import threading
import time

import pytest

from ponder.tools import StatefulTool, ToolRegistry, run_tool_step, tool
from ponder.tools.limits import check_json_value, safe_text
from ponder.tools.parsers import HermesParser
from ponder.tools.registry import TimedOut
from ponder.types import ToolCall


def tool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ponder-tool-")]


def test_a_spinning_thread_tool_is_stopped_at_its_limit_and_gives_back_its_core():
    @tool(timeout_s=0.2, isolation="thread")
    def spin() -> str:
        """Loops for ever."""
        while True:
            pass

    started = time.monotonic()
    result = ToolRegistry([spin]).call(ToolCall("spin", {}))
    assert time.monotonic() - started < 1.0
    assert isinstance(result, TimedOut) and result.content == "tool 'spin' timed out after 0.2 s"
    assert tool_threads() == []
    cpu = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - cpu < 0.1  # nothing of the call is still spinning


def test_a_thread_tool_swallowing_exceptions_is_still_stopped():
    @tool(timeout_s=0.1, isolation="thread")
    def stubborn() -> str:
        """Catches every Exception and goes on."""
        while True:
            try:
                sum(range(1000))
            except Exception:
                pass

    assert ToolRegistry([stubborn]).call(ToolCall("stubborn", {})).content == "tool 'stubborn' timed out after 0.1 s"
    assert tool_threads() == []


def test_a_thread_tool_blocked_in_c_is_waited_for_never_left_running(tmp_path):
    marker = tmp_path / "after-sleep"

    @tool(timeout_s=0.1, isolation="thread")
    def doze() -> str:
        """Sleeps, then writes a file."""
        time.sleep(0.5)
        marker.write_text("written")  # never reached: the timeout is raised as sleep returns
        return "rested"

    started = time.monotonic()
    result = ToolRegistry([doze]).call(ToolCall("doze", {}))
    assert 0.45 < time.monotonic() - started < 2.0
    assert result.content == "tool 'doze' timed out after 0.1 s"
    assert tool_threads() == [] and not marker.exists()


def test_a_process_tool_is_killed_at_its_limit_with_the_processes_it_started(tmp_path):
    marker, pid_file = tmp_path / "late-write", tmp_path / "child.pid"

    @tool(timeout_s=0.3, isolation="process")
    def slow_job() -> str:
        """Starts a helper process, sleeps, then writes a file."""
        helper = subprocess.Popen(["sleep", "30"])
        pid_file.write_text(str(helper.pid))
        time.sleep(1.0)
        marker.write_text("late")
        return "done"

    started = time.monotonic()
    result = ToolRegistry([slow_job]).call(ToolCall("slow_job", {}))
    assert time.monotonic() - started < 1.0
    assert isinstance(result, TimedOut)
    time.sleep(1.2)  # past the moment the tool would have written its file
    assert not marker.exists()
    helper_pid = int(pid_file.read_text())
    assert not os.path.exists(f"/proc/{helper_pid}") or "Z" in _state(helper_pid)


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
    except OSError:
        return "gone"


def test_a_process_tool_spinning_in_c_is_killed():
    @tool(timeout_s=0.3, isolation="process")
    def backtrack(text: str) -> str:
        """A catastrophic regex: hours of C code without a Python instruction.

        Args:
            text: The subject.
        """
        return str(bool(re.match(r"(a+)+$", text)))

    started = time.monotonic()
    result = ToolRegistry([backtrack]).call(ToolCall("backtrack", {"text": "a" * 40 + "b"}))
    assert time.monotonic() - started < 1.5 and isinstance(result, TimedOut)


@tool(isolation="process")
def stats(values: list[int]) -> dict:
    """Summarise numbers.

    Args:
        values: The numbers.
    """
    if not values:
        raise ValueError("no values")
    return {"n": len(values), "total": sum(values)}


def test_a_process_tool_returns_results_and_errors_like_a_thread_tool():
    registry = ToolRegistry([stats])
    assert registry.isolation_of("stats") == "process"
    assert registry.call(ToolCall("stats", {"values": [1, 2]})).content == '{"n": 2, "total": 3}'
    failed = registry.call(ToolCall("stats", {"values": []}))
    assert (failed.is_error, failed.content) == (True, "stats raised ValueError: no values")


def test_a_process_tool_that_exits_is_an_error_naming_how_it_ended():
    @tool(isolation="process")
    def quit_hard() -> str:
        """Leaves without a result."""
        os._exit(3)

    result = ToolRegistry([quit_hard]).call(ToolCall("quit_hard", {}))
    assert (result.is_error, result.content) == (True, "tool 'quit_hard' exited with code 3 before returning a result")


def test_a_registry_can_run_every_plain_tool_in_a_process():
    seen_pids = []

    @tool
    def whoami() -> int:
        """This process's id."""
        seen_pids.append(os.getpid())
        return os.getpid()

    assert ToolRegistry([whoami]).call(ToolCall("whoami", {})).content == str(os.getpid())
    isolated = ToolRegistry([whoami], isolation="process")
    assert int(isolated.call(ToolCall("whoami", {})).content) != os.getpid()
    assert seen_pids == [os.getpid()]  # the child's append never reached this process
    assert isolated.fresh_copy().isolation == "process"
    with pytest.raises(ValueError, match="isolation"):
        ToolRegistry([whoami], isolation="fiber")


class Counter(StatefulTool):
    def __init__(self):
        super().__init__(name="counter", timeout_s=0.1)
        self.created, self.released = 0, []

    def create(self):
        self.created += 1
        return {"n": 0, "id": self.created}

    def call(self, handle, spin: bool = False):
        """Count calls; spin for ever when asked.

        Args:
            spin: Loop for ever instead of counting.
        """
        while spin:
            pass
        handle["n"] += 1
        return f"handle {handle['id']}: {handle['n']}"

    def release(self, handle):
        self.released.append(handle["id"])


def test_a_stateful_tool_that_timed_out_gets_a_fresh_handle():
    counter = Counter()
    registry = ToolRegistry([counter])
    assert registry.call(ToolCall("counter", {})).content == "handle 1: 1"
    assert isinstance(registry.call(ToolCall("counter", {"spin": True})), TimedOut)
    assert counter.released == [1]  # its state may be half-updated: released, not reused
    assert registry.call(ToolCall("counter", {})).content == "handle 2: 1"


def test_tool_output_is_made_safe_to_encode_in_one_place():
    @tool(isolation="process")
    def garbled() -> str:
        """Returns text no UTF-8 encoder accepts."""
        return "a\ud800b\x00c \ud83d\ude00"

    @tool
    def firehose() -> str:
        """Returns far too much."""
        return "x" * 250_000

    registry = ToolRegistry([garbled, firehose], max_result_chars=1000)
    content = registry.call(ToolCall("garbled", {})).content
    assert content == "a\ufffdbc \U0001F600"  # lone surrogate replaced, NUL gone, the pair joined
    content.encode("utf-8")
    big = registry.call(ToolCall("firehose", {})).content
    assert big == "x" * 1000 + "…[cut: 249000 more characters]"


def test_safe_text_and_check_json_value():
    assert safe_text("ok") == "ok" and safe_text(12) == "12"
    assert safe_text("\udcff\x00") == "\ufffd"
    value, why = check_json_value({"k\udc80": ["v\ud800", {"x": 1}]})
    assert (value, why) == ({"k\ufffd": ["v\ufffd", {"x": 1}]}, None)
    deep: list = []
    for _ in range(40):
        deep = [deep]
    assert check_json_value(deep) == (None, "nested deeper than 32 levels")


def test_one_action_runs_at_most_max_calls_per_action_calls():
    ran = []

    @tool
    def note(i: int) -> str:
        """Record a number.

        Args:
            i: The number.
        """
        ran.append(i)
        return f"noted {i}"

    action = "".join(f'<tool_call>{{"name": "note", "arguments": {{"i": {i}}}}}</tool_call>' for i in range(50))
    outcome = run_tool_step(action, HermesParser(), ToolRegistry([note]))
    assert ran == list(range(8))
    assert len(outcome.results) == 50 and [r.is_error for r in outcome.results] == [False] * 8 + [True] * 42
    assert outcome.results[8].content == "not run: at most 8 tool calls per action; make the others in your next action"
    ran.clear()
    run_tool_step(action, HermesParser(), ToolRegistry([note], max_calls_per_action=3))
    assert ran == [0, 1, 2]
