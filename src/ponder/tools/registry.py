"""The set of tools an agent may call: lookup, argument validation and guarded calls.

`ToolRegistry.call` is the only place a model's tool call touches user code. It
never raises: unknown tools, invalid arguments, exceptions and timeouts all come
back as `ToolResult(is_error=True)` with a one-line message the model can act on,
because a bad call is part of an episode, not a crash of the rollout. A call is
stopped at its limit, never left running (ponder.tools.isolation says how), and
every text it returns passes `limits.safe_text` here, the one place tool output
enters ponder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from ponder.tools.base import StatefulTool, Tool, tool
from ponder.tools.isolation import ISOLATION_MODES, ToolTimedOut, call_in_process, call_in_thread, can_fork
from ponder.tools.limits import DEFAULT_MAX_CALLS_PER_ACTION, DEFAULT_MAX_RESULT_CHARS, safe_text
from ponder.types import ToolCall, ToolResult, ToolSpec

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# Several errors on one line let the model fix them all in its next turn; more is noise.
_MAX_REPORTED_ERRORS = 3
_MAX_SHOWN_VALUE_CHARS = 60

AnyTool = Tool | StatefulTool


class TimedOut(ToolResult):
    """The result of a call stopped at its limit. Its type, not its text, tells retry
    logic that the call may have half-run (ToolRunner retries only idempotent tools)."""


class ToolRegistry:
    """Tools by name, with validation against their JSON Schemas and timed calls.

    Stateful tools get one handle per registry, created on first call and released
    by `close()`; use `fresh_copy()` (or a new registry) per episode so episodes
    do not share state.

    isolation: how plain function tools that do not declare their own run: "thread"
        (in this process, stopped at the limit at their next Python instruction) or
        "process" (a forked child, killed at the limit); see ponder.tools.isolation.
    max_calls_per_action: calls one action may make; `run_tool_step` answers the rest
        with an error result instead of running them.
    max_result_chars: longest text a call may return; longer is cut, with a mark.
    """

    def __init__(
        self, tools: Iterable[AnyTool | Callable[..., Any]] = (), default_timeout_s: float = DEFAULT_TIMEOUT_S,
        isolation: str = "thread", max_calls_per_action: int = DEFAULT_MAX_CALLS_PER_ACTION,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:  # fmt: skip
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        if max_calls_per_action < 1 or max_result_chars < 1:
            raise ValueError("max_calls_per_action and max_result_chars must be >= 1")
        self.default_timeout_s = default_timeout_s
        self.isolation = isolation
        self.max_calls_per_action = max_calls_per_action
        self.max_result_chars = max_result_chars
        self._tools: dict[str, AnyTool] = {}
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        self._create_kwargs: dict[str, dict[str, Any]] = {}
        self._handles: dict[str, Any] = {}
        self._create_locks: dict[str, threading.Lock] = {}
        for item in tools:
            self.register(item)

    def register(self, item: AnyTool | Callable[..., Any], create_kwargs: dict[str, Any] | None = None) -> AnyTool:
        """Add a tool (a plain function is wrapped with @tool). Returns the registered tool.

        `create_kwargs` are passed to a StatefulTool's `create` when its handle is built.
        """
        registered = item if isinstance(item, (Tool, StatefulTool)) else tool(item)
        if registered.name in self._tools:
            raise ValueError(f"a tool named {registered.name!r} is already registered")
        if create_kwargs and not isinstance(registered, StatefulTool):
            raise ValueError(f"create_kwargs given for {registered.name!r}, which is not a StatefulTool")
        jsonschema.Draft202012Validator.check_schema(registered.spec.parameters)
        self._tools[registered.name] = registered
        self._validators[registered.name] = jsonschema.Draft202012Validator(registered.spec.parameters)
        self._create_kwargs[registered.name] = dict(create_kwargs or {})
        self._create_locks[registered.name] = threading.Lock()
        return registered

    def get(self, name: str) -> AnyTool:
        if name not in self._tools:
            raise KeyError(self._unknown_message(name))
        return self._tools[name]

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        """What the model is shown, in registration order."""
        return [registered.spec for registered in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def fresh_copy(self) -> ToolRegistry:
        """The same tools and timeouts with no live handles: a registry for a new episode."""
        copy = ToolRegistry(default_timeout_s=self.default_timeout_s, isolation=self.isolation,
                            max_calls_per_action=self.max_calls_per_action, max_result_chars=self.max_result_chars)
        for name, registered in self._tools.items():
            copy.register(registered, create_kwargs=self._create_kwargs[name])
        return copy

    def validate(self, call: ToolCall) -> str | None:
        """One line naming what is wrong with the call's arguments, or None when they are valid."""
        if call.name not in self._tools:
            return self._unknown_message(call.name)
        errors = list(self._validators[call.name].iter_errors(call.arguments))
        if not errors:
            return None
        described = [describe_validation_error(error) for error in errors[:_MAX_REPORTED_ERRORS]]
        return f"{call.name}: " + "; ".join(described)

    def call(self, call: ToolCall, timeout_s: float | None = None) -> ToolResult:
        """Validate and run one call with a timeout. Never raises.

        The limit is `timeout_s`, else the tool's own `timeout_s`, else the
        registry's `default_timeout_s`.
        """
        started = time.perf_counter()
        try:
            result = self._validated_call(call, timeout_s)
        except Exception as exc:  # a registry bug must still not end the episode
            logger.exception("tool registry failed on %r", call.name)
            result = ToolResult(f"tool '{call.name}' failed in the registry: {type(exc).__name__}: {exc}", True)
        content = safe_text(result.content, self.max_result_chars)
        return dataclasses.replace(result, content=content, name=call.name, elapsed_s=time.perf_counter() - started)

    def isolation_of(self, name: str) -> str:
        """How calls to tool `name` run: "process" or "thread" (see ponder.tools.isolation)."""
        registered = self.get(name)
        mode = registered.isolation or self.isolation
        return mode if mode == "thread" or can_fork() else "thread"

    def close(self) -> None:
        """Release every stateful tool's handle; the registry may be used again afterwards.

        A failing release is logged, not raised, so the other handles still get released.
        """
        handles, self._handles = self._handles, {}
        for name, handle in handles.items():
            try:
                self._tools[name].release(handle)  # type: ignore[union-attr]  # only StatefulTools hold handles
            except Exception:
                logger.exception("releasing the handle of tool %r failed", name)

    def __enter__(self) -> ToolRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _validated_call(self, call: ToolCall, timeout_s: float | None) -> ToolResult:
        error = self.validate(call)
        if error is not None:
            return ToolResult(error, is_error=True)
        registered = self._tools[call.name]
        limits = (timeout_s, registered.timeout_s, self.default_timeout_s)
        limit = next(value for value in limits if value is not None)
        return self._run_with_timeout(registered, dict(call.arguments), limit)

    def _run_with_timeout(self, registered: AnyTool, arguments: dict[str, Any], limit: float) -> ToolResult:
        def invoke() -> ToolResult:
            return self._outcome(registered, arguments)

        mode = self.isolation_of(registered.name)
        if mode == "process":
            with warnings.catch_warnings():  # Python 3.12+ warns on any fork of a threaded process
                warnings.simplefilter("ignore", DeprecationWarning)
                result = call_in_process(invoke, limit, registered.name)
        else:
            result = call_in_thread(invoke, limit, registered.name)
        if result is not None:
            return result
        if isinstance(registered, StatefulTool):
            self._drop_handle(registered.name)  # stopped mid-call: its state may be half-updated
        return TimedOut(f"tool '{registered.name}' timed out after {limit:g} s", is_error=True)

    def _outcome(self, registered: AnyTool, arguments: dict[str, Any]) -> ToolResult:
        """One call's result or error as text; runs in the worker thread or child process."""
        try:
            return render_result(self._invoke(registered, arguments))
        except ToolTimedOut:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a tool is still the tool's error
            return ToolResult(describe_exception(registered.name, exc), is_error=True)

    def _invoke(self, registered: AnyTool, arguments: dict[str, Any]) -> Any:
        if isinstance(registered, StatefulTool):
            return registered.call(self._handle_for(registered), **arguments)
        return registered(**arguments)

    def _drop_handle(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is None:
            return
        try:
            self._tools[name].release(handle)  # type: ignore[union-attr]  # only StatefulTools hold handles
        except Exception:
            logger.exception("releasing the handle of timed-out tool %r failed", name)

    def _handle_for(self, registered: StatefulTool) -> Any:
        # A lock per tool: a slow create() of one tool must not stall calls to the others.
        with self._create_locks[registered.name]:
            if registered.name not in self._handles:
                self._handles[registered.name] = registered.create(**self._create_kwargs[registered.name])
            return self._handles[registered.name]

    def _unknown_message(self, name: str) -> str:
        available = ", ".join(self._tools) or "(none)"
        return f"unknown tool '{name}'; available: {available}"


def describe_exception(name: str, exc: BaseException) -> str:
    """'name raised Type: message', even for an exception whose str() itself fails."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    message = f"{name} raised {type(exc).__name__}"
    return f"{message}: {text}" if text else message


def render_result(value: Any) -> ToolResult:
    """A tool's return value as the text the model reads; a returned ToolResult passes through."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(value)
    try:
        return ToolResult(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):  # circular or non-string keys: show Python's view instead
        return ToolResult(repr(value))


def describe_validation_error(error: ValidationError) -> str:
    """A jsonschema error as a short sentence about the argument, e.g. "argument 'k' must be integer, got "3"."""
    path = _format_path(error.absolute_path)
    subject = f"argument '{path}'" if path else "arguments"
    kind, instance = error.validator, error.instance
    if kind == "type":
        return f"{subject} must be {_expected_types(error.validator_value)}, got {_show(instance)}"
    if kind == "required" and isinstance(instance, dict):
        missing = ", ".join(f"'{name}'" for name in error.validator_value if name not in instance)
        return f"missing required argument {missing}" if not path else f"{subject} is missing required key {missing}"
    if kind == "additionalProperties" and isinstance(instance, dict):
        allowed = error.schema.get("properties", {})
        extra = ", ".join(f"'{name}'" for name in instance if name not in allowed)
        return f"unexpected argument {extra}" if not path else f"{subject} has unexpected key {extra}"
    if kind == "enum":
        choices = ", ".join(_show(value) for value in error.validator_value)
        return f"{subject} must be one of {choices}, got {_show(instance)}"
    if kind in ("anyOf", "oneOf") and error.context and all(e.validator == "type" for e in error.context):
        expected = " or ".join(_expected_types(e.validator_value) for e in error.context)
        return f"{subject} must be {expected}, got {_show(instance)}"
    return f"{subject}: {error.message}"


def _format_path(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _expected_types(value: Any) -> str:
    return " or ".join(value) if isinstance(value, list) else str(value)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _MAX_SHOWN_VALUE_CHARS else text[: _MAX_SHOWN_VALUE_CHARS - 1] + "…"
