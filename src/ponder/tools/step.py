"""The one tool-calling step shared by the agent runtime and the rollout engine.

parse → validate → call → observe. Both callers use `run_tool_step` so a model
sees the same observations at inference time as during training.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ponder.tools.limits import DEFAULT_MAX_CALLS_PER_ACTION
from ponder.tools.parsers import ParseResult, Parser
from ponder.tools.registry import ToolRegistry
from ponder.types import ToolCall, ToolResult, Turn

logger = logging.getLogger(__name__)


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


def run_tool_step(
    text: str,
    parser: Parser,
    registry: ToolRegistry,
    timeout_s: float | None = None,
    truncate: Callable[[str], str] | None = None,
) -> StepOutcome:
    """Parse `text`, run its calls through `registry`, and format the observation. Never raises.

    `truncate` shortens each result's content (error messages included) before it
    is formatted, e.g. to a token budget; `timeout_s` overrides every tool's limit.
    Calls past the registry's `max_calls_per_action` get an error result and are not run.
    """
    parsed = _safe_parse(text, parser)
    if parsed.answer is not None:
        return StepOutcome(parsed, [], None)
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
