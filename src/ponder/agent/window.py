"""Short-term memory: the part of the transcript the model reads, under a token budget.

The system message and the first user message (the task) always stay. The rest is
grouped into exchanges (an assistant message with the messages that answer it); the
newest exchanges that fit the budget stay, and the older ones are either dropped,
with a note saying so, or replaced by a summary. The full transcript is never
changed: the window is recomputed from it for every prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Message = dict[str, Any]
_SUMMARY_LINE_CHARS = 120
SUMMARY_HEADING = "Summary of the earlier conversation:\n"


def dropped_note(count: int, what: str = "messages") -> str:
    """The one line shown in place of `count` left-out messages (or turns)."""
    return f"({count} earlier {what} were left out to fit the context window.)"


def _exchanges(messages: list[Message]) -> list[list[Message]]:
    groups: list[list[Message]] = []
    for message in messages:
        if message["role"] == "assistant" or not groups:
            groups.append([message])
        else:
            groups[-1].append(message)
    return groups


def extractive_summary(messages: list[Message]) -> str:
    """One line per message: its role and the start of its text (no model call needed)."""
    lines = []
    for message in messages:
        text = " ".join(str(message.get("content") or "").split())
        if len(text) > _SUMMARY_LINE_CHARS:
            text = text[: _SUMMARY_LINE_CHARS - 1] + "…"
        lines.append(f"{message['role']}: {text}")
    return "\n".join(lines)


def fit_window(
    messages: list[Message],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    mode: str = "drop",
    summarize: Callable[[list[Message]], str] = extractive_summary,
) -> list[Message]:
    """The messages to show: head (system + task), then the newest exchanges within budget.

    `budget_tokens` counts the exchanges after the head (0 = no limit). The newest
    exchange is always kept, even when it alone exceeds the budget.
    """
    head_size = next((i + 1 for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    head, rest = messages[:head_size], messages[head_size:]
    if budget_tokens <= 0 or not rest:
        return list(messages)
    groups = _exchanges(rest)
    sizes = [sum(count_tokens(str(m.get("content") or "")) for m in group) for group in groups]
    kept, used = 0, 0
    for size in reversed(sizes):
        if kept and used + size > budget_tokens:
            break
        kept, used = kept + 1, used + size
    dropped = [m for group in groups[: len(groups) - kept] for m in group]
    shown = [m for group in groups[len(groups) - kept :] for m in group]
    if not dropped:
        return list(messages)
    note = SUMMARY_HEADING + summarize(dropped) if mode == "summarize" else dropped_note(len(dropped))
    return head + [{"role": "user", "content": note}] + shown
