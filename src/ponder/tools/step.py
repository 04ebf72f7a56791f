"""The one tool-calling step shared by the agent runtime and the rollout engine.

parse → validate → call → observe. Both callers use `run_tool_step` so a model
sees the same observations at inference time as during training.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ponder.tools.limits import DEFAULT_MAX_CALLS_PER_ACTION
from ponder.tools.parsers import ParseResult, Parser
from ponder.tools.registry import ToolRegistry
from ponder.types import ToolCall, ToolResult, Turn

logger = logging.getLogger(__name__)
_SPACE_AT_SYMBOL = re.compile(r"\s*([^\w\s])\s*")  # "12 * 7" and "12*7" are one call; "new york" stays two words
REPEATED_CALL = "repeated_call"  # the stop reason of an episode ended by RepeatedCalls


@dataclass
class StepOutcome:
    """What one action did.

    `observation` is the text to append after the action: tool results, or the
    parse error for the model to correct. It is None when the action gave a final
    answer, or when there was nothing to run and no error to report.
    """

    parse: ParseResult
    results: list[ToolResult]
    observation: str | None
    stopped: str | None = None  # why the episode must end here (REPEATED_CALL), else None

    def turn(self, index: int, action: str) -> Turn:
        """The Turn record of this step (its observation is set by the caller)."""
        parse = self.parse
        return Turn(
            index=index,
            action=action,
            tool_calls=list(parse.calls),
            tool_results=list(self.results),
            answer=parse.answer,
            error=parse.error,
        )


def _normalised(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE_AT_SYMBOL.sub(r"\1", " ".join(value.split()))
    if isinstance(value, dict):
        return {str(key): _normalised(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(item) for item in value]
    return value


def call_key(call: ToolCall) -> str:
    """The call as compared for repeats: its tool name and arguments (keys sorted;
    whitespace runs in strings made one space, none next to a symbol), as JSON."""
    return json.dumps([call.name, _normalised(call.arguments)], sort_keys=True, default=str)


@dataclass
class RepeatedCalls:
    """One episode's identical tool calls (by call_key), and the limit that stops a loop:
    `check` reports the call that would be made the `limit`-th time. limit 0 = off."""

    limit: int = 0
    counts: Counter[str] = field(default_factory=Counter)

    def check(self, calls: Sequence[ToolCall]) -> ToolCall | None:
        """The first of `calls` that reaches the limit (counting the earlier ones of
        `calls`), or None; the calls are counted only when none does (they will run)."""
        counts = Counter(self.counts)
        for call in calls:
            counts[call_key(call)] += 1
            if self.limit and counts[call_key(call)] >= self.limit:
                return call
        self.counts = counts
        return None


def run_tool_step(
    text: str,
    parser: Parser,
    registry: ToolRegistry,
    timeout_s: float | None = None,
    truncate: Callable[[str], str] | None = None,
    repeats: RepeatedCalls | None = None,
) -> StepOutcome:
    """Parse `text`, run its calls through `registry`, and format the observation. Never raises.

    `truncate` shortens each result's content (error messages included) before it
    is formatted, e.g. to a token budget; `timeout_s` overrides every tool's limit.
    Calls past the registry's `max_calls_per_action` get an error result and are not run.
    With `repeats`, an action whose call would be made its limit-th time runs nothing:
    every call gets an error result and the outcome is `stopped` (REPEATED_CALL).
    """
    parsed = _safe_parse(text, parser)
    if parsed.answer is not None:
        return StepOutcome(parsed, [], None)
    repeated = repeats.check(parsed.calls) if repeats is not None and parsed.calls else None
    if repeats is not None and repeated is not None:
        return _stopped(parsed, repeated, repeats.limit)
    if parsed.calls:
        cap = getattr(registry, "max_calls_per_action", DEFAULT_MAX_CALLS_PER_ACTION)
        results = [
            registry.call(call, timeout_s=timeout_s) if position < cap else _over_cap(call, cap)
            for position, call in enumerate(parsed.calls)
        ]
        if truncate is not None:
            results = [_truncated(result, truncate) for result in results]
        return StepOutcome(parsed, results, _safe_format(lambda: parser.format_results(results), parser))
    if parsed.error is not None:
        error = parsed.error
        return StepOutcome(parsed, [], _safe_format(lambda: parser.format_error(error), parser))
    return StepOutcome(parsed, [], None)


def _stopped(parsed: ParseResult, repeated: ToolCall, limit: int) -> StepOutcome:
    shown = repeated.raw.strip() or call_key(repeated)
    message = f"stopped: the same {repeated.name} call ({shown}) was made {limit} times without an answer"
    results = [ToolResult(f"not run: {message}", is_error=True, name=call.name) for call in parsed.calls]
    return StepOutcome(parsed, results, message, stopped=REPEATED_CALL)


def _safe_parse(text: str, parser: Parser) -> ParseResult:
    # Built-in parsers never raise; a user parser that does must not end the episode.
    try:
        return parser.parse(text)
    except Exception as exc:
        logger.exception("parser %r raised on an action", getattr(parser, "name", parser))
        return ParseResult([], error=f"could not parse the action ({type(exc).__name__}: {exc})")


def _over_cap(call: ToolCall, cap: int) -> ToolResult:
    message = f"not run: at most {cap} tool calls per action; make the others in your next action"
    return ToolResult(message, is_error=True, name=call.name)


def _truncated(result: ToolResult, truncate: Callable[[str], str]) -> ToolResult:
    try:
        return dataclasses.replace(result, content=truncate(result.content))
    except Exception as exc:
        logger.exception("truncate raised on the result of %r", result.name)
        message = f"could not shorten the result ({type(exc).__name__})"
        return dataclasses.replace(result, content=message, is_error=True)


def _safe_format(format_text: Callable[[], str], parser: Parser) -> str | None:
    try:
        return format_text()
    except Exception:
        logger.exception("parser %r failed to format an observation", getattr(parser, "name", parser))
        return None
