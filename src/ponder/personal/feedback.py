"""Feedback -> preference pairs (pure functions, no model).

An interaction's rating is its latest up, down or outcome row (outcome >= 0.5 counts
as up, < 0.5 as down). Pairs (prompt messages, chosen text, rejected text):

- rewrite / correction: the text the user wrote ≻ the model's response;
- ratings: within one prompt (the same messages), every up-rated response ≻ every
  down-rated one.

Nothing else makes a pair: a thumbs-down with neither a rewrite of its own nor an
up-rated answer to the same prompt says what is wrong but not what is right, so it
is counted ("down without alternative") and reported, not trained on. Pairs whose two
sides are the same text are dropped, and a pair found twice is kept once.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ponder.personal.store import Feedback, Interaction

OUTCOME_SUCCESS = 0.5


@dataclass(frozen=True)
class PreferencePair:
    """chosen ≻ rejected as replies to `messages`; source: rewrite, correction or rating."""

    messages: list[dict[str, Any]]
    chosen: str
    rejected: str
    source: str


def rating(rows: list[Feedback]) -> int:
    """+1 (up), -1 (down) or 0 (not rated) from an interaction's rows: the latest rating row wins."""
    rated = [row for row in rows if row.kind in ("up", "down", "outcome")]
    if not rated:
        return 0
    last = max(rated, key=lambda row: row.id)
    if last.kind == "outcome":
        return 1 if (last.value or 0.0) >= OUTCOME_SUCCESS else -1
    return 1 if last.kind == "up" else -1


def preference_pairs(
    interactions: list[Interaction], feedback: list[Feedback]
) -> tuple[list[PreferencePair], Counter]:
    """The pairs the rules above give, in interaction order, and a report counting pairs
    by source and what gave none."""
    rows: dict[str, list[Feedback]] = {}
    for row in feedback:
        rows.setdefault(row.interaction_id, []).append(row)
    report: Counter = Counter()
    pairs: list[PreferencePair] = []
    seen: set[tuple[str, str, str]] = set()

    def add(pair: PreferencePair) -> None:
        key = (_prompt_key(pair.messages), pair.chosen, pair.rejected)
        if pair.chosen.strip() == pair.rejected.strip():
            report["same text on both sides"] += 1
        elif key in seen:
            report["duplicate pair"] += 1
        else:
            seen.add(key)
            pairs.append(pair)
            report[f"pairs from {pair.source}"] += 1

    by_prompt: dict[str, list[Interaction]] = {}
    for interaction in interactions:
        by_prompt.setdefault(_prompt_key(interaction.messages), []).append(interaction)
        for row in rows.get(interaction.id, []):
            if row.kind in ("rewrite", "correction") and row.text:
                add(PreferencePair(interaction.messages, row.text, interaction.response, row.kind))
    for group in by_prompt.values():
        ups = [i for i in group if rating(rows.get(i.id, [])) > 0]
        downs = [i for i in group if rating(rows.get(i.id, [])) < 0]
        for down in downs:
            rewritten = any(r.kind in ("rewrite", "correction") for r in rows.get(down.id, []))
            if not ups and not rewritten:
                report["down without alternative"] += 1
            for up in ups:
                add(PreferencePair(up.messages, up.response, down.response, "rating"))
    return pairs, report


def _prompt_key(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)
