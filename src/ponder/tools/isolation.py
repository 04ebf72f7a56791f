"""Running one tool call so that its time limit really stops it.

A tool is run one of two ways, chosen per tool (`@tool(isolation=...)`) or per
registry (`ToolRegistry(isolation=...)`, "thread" by default):

- "thread": the call runs in a worker thread of this process. At the limit a
  `ToolTimedOut` is raised inside it, which stops Python code at its next
  instruction (a spinning loop gives back its core and the GIL at once), and the
  caller waits until the thread has ended: no thread of a timed-out call is ever
  left running, and nothing of it runs after the caller moved on. A call blocked in
  C (time.sleep, a socket read without a timeout, a huge regex) cannot be stopped
  that way and is waited for, with a warning: such tools declare "process". Fine for
  cheap, pure tools (calculator, echo), for tools whose blocking calls carry their
  own limits (the sandbox, retrievers with HTTP timeouts), and for tools that must
  change state in this process. StatefulTools always run this way, because their
  handle lives here.
- "process": the call runs in a child process forked for it and is SIGKILLed, with
  every process it started, at the limit. The child sees this process's memory as
  it is at the call; what it changes there is lost. One fork per call costs a few
  milliseconds in a small process and about 50 ms next to a loaded 135M model
  (measured in docs/results/safety.md), so it is for tools that may block or spin
  in C, or that are unsafe to leave half-run.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from ponder.types import ToolResult

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("process", "thread")
# A tool with a bare `except:` may swallow the first ToolTimedOut; it gets another this often.
_REFIRE_S = 0.05
# A thread still running this long after its limit is blocked outside Python: say so once.
_STUCK_WARNING_S = 2.0
# A child's answer larger than this is refused (the registry caps the text far lower anyway).
MAX_CHILD_BYTES = 64 * 1024 * 1024


class ToolTimedOut(BaseException):
    """Raised inside a thread-mode tool at its limit. A BaseException, like
    KeyboardInterrupt, so that a tool's `except Exception` cannot swallow it."""


def can_fork() -> bool:
    """Process isolation needs os.fork (Linux, macOS); elsewhere tools run in threads."""
    return hasattr(os, "fork")


def call_in_thread(invoke: Callable[[], ToolResult], limit: float, name: str) -> ToolResult | None:
    """`invoke()` in a worker thread, stopped at `limit` seconds; None when it timed out.

    Returns only once the worker thread has ended (see the module docstring)."""
    outcome: list[ToolResult] = []

    def work() -> None:
        try:
            outcome.append(invoke())
        except ToolTimedOut:
            pass  # the caller reports the timeout
        except BaseException as exc:  # noqa: BLE001 - invoke() catches the tool's own errors; this is ours
            outcome.append(ToolResult(f"tool '{name}' failed: {type(exc).__name__}: {exc}", is_error=True))

    worker = threading.Thread(target=_swallow_late_timeout(work), name=f"ponder-tool-{name}", daemon=True)
    worker.start()
    timed_out = True
    try:
        worker.join(max(limit, 0.0))
        timed_out = worker.is_alive()
    finally:
        # Also on KeyboardInterrupt in the caller: the tool must not run on behind it.
        if worker.is_alive():
            _stop_thread(worker, name)
    return None if timed_out or not outcome else outcome[0]


def _stop_thread(worker: threading.Thread, name: str) -> None:
    """Raise ToolTimedOut in `worker` until it ends; wait for it (never abandon it)."""
    started = time.monotonic()
    warned = False
    while worker.is_alive():
        if worker.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(ToolTimedOut))
        worker.join(_REFIRE_S)
        if not warned and worker.is_alive() and time.monotonic() - started > _STUCK_WARNING_S:
            logger.warning("tool %r is blocked outside Python past its limit; waiting for it to return "
                           "(declare it isolation='process' to have it killed instead)", name)
            warned = True


def _swallow_late_timeout(work: Callable[[], None]) -> Callable[[], None]:
    # A ToolTimedOut fired just as the tool returned lands here, after its result was kept.
    def run() -> None:
        try:
            work()
        except ToolTimedOut:
            pass

    return run


def call_in_process(invoke: Callable[[], ToolResult], limit: float, name: str) -> ToolResult | None:
    """`invoke()` in a forked child process, SIGKILLed with its process group at `limit`
    seconds; None when it timed out. The result comes back as JSON over a pipe."""
    for stream in (sys.stdout, sys.stderr):  # else the child would print our buffered text again
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(invoke, read_fd, write_fd)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)  # also done in the child; whichever runs first wins the race
    except OSError:
        pass
    finished = False
    try:
        data, finished = _read_until(read_fd, time.monotonic() + max(limit, 0.0))
    finally:
        os.close(read_fd)
        if not finished:
            _kill_group(pid)
        _, status = os.waitpid(pid, 0)
    if not finished:
        return None
    return _child_result(data, status, name)


def _child(invoke: Callable[[], ToolResult], read_fd: int, write_fd: int) -> None:
    code = 0
    try:
        os.close(read_fd)
        try:
            os.setpgid(0, 0)  # its own group, so that the kill at the limit reaches its children too
        except OSError:
            pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        result = invoke()
        payload = json.dumps([result.content, result.is_error]).encode("ascii")  # surrogates escaped
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except BaseException:  # noqa: BLE001 - the parent reports a child that gave no answer
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)  # no atexit handlers, no parent buffers flushed twice


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything the child writes, or (partial, False) at the deadline or past the size cap."""
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), True
        size += len(chunk)
        if size > MAX_CHILD_BYTES:
            return b"", False
        chunks.append(chunk)


def _kill_group(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass


def _child_result(data: bytes, status: int, name: str) -> ToolResult:
    try:
        content, is_error = json.loads(data.decode("ascii"))
        return ToolResult(str(content), bool(is_error))
    except (ValueError, TypeError):
        pass
    if os.WIFSIGNALED(status):
        how = f"was killed by signal {os.WTERMSIG(status)}"
    else:
        how = f"exited with code {os.WEXITSTATUS(status)}"
    return ToolResult(f"tool '{name}' {how} before returning a result", is_error=True)
