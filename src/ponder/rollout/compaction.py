"""Context compaction: an episode's context started again when it would outgrow the
window (rollout.context, ContextConfig; the engine decides when and calls these).

The new context is the opening prompt with one more user message (a heading and a
summary of the turns left out, or a one-line note that they were), then the ids of the
last turns exactly as the policy read them (each turn's action and observation, sliced
from the response by the turn's token counts). Nothing the policy sampled is ever
re-tokenised: the policy summariser's summary is carried over as its sampled ids.

- turn_spans / kept_ids: where each turn's action and observation sit in the response;
  the ids of the last k turns.
- rule_summary_ids: the agent runtime's extractive summary of the left-out turns, its
  newest lines within a token budget.
- summary_block: the opening prompt plus the summary message, as ids.
- restart_context: the new context, with as many kept turns as fit.
"""

from __future__ import annotations

from typing import Any

from ponder.agent.window import SUMMARY_HEADING, dropped_note, extractive_summary
from ponder.config import ContextConfig
from ponder.models.chat import encode_chat
from ponder.types import Trajectory, Turn

# A private-use character standing in for the summary while the template renders.
_MARK = "\ue002"
# The shortest rule summary worth a restart that keeps turns (else fewer are kept).
RULE_LEAST = 16


def turn_spans(turns: list[Turn]) -> list[tuple[slice, slice]]:
    """Each turn's action and observation as slices of the response (the summary block
    between them, Turn.n_summary_tokens, is neither)."""
    spans, position = [], 0
    for turn in turns:
        action = slice(position, position + turn.n_action_tokens)
        start = action.stop + turn.n_summary_tokens
        spans.append((action, slice(start, start + turn.n_observation_tokens)))
        position = start + turn.n_observation_tokens
    return spans


def kept_ids(response_ids: list[int], turns: list[Turn], keep: int) -> list[int]:
    """The ids of the last `keep` turns as the policy read them: action, observation, …"""
    ids: list[int] = []
    for action, observation in turn_spans(turns)[len(turns) - keep :] if keep > 0 else []:
        ids += response_ids[action] + response_ids[observation]
    return ids


def turn_messages(turns: list[Turn], pending: Turn | None = None) -> list[dict[str, Any]]:
    """The turns as messages for a summary: each action (assistant), then its observation
    (environment), but not the observation of `pending`, which is shown after the summary."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.action})
        if turn.observation and turn is not pending:
            messages.append({"role": "environment", "content": turn.observation})
    return messages


def rule_summary_ids(tokenizer: Any, messages: list[dict[str, Any]], max_tokens: int) -> list[int]:
    """The extractive summary (one line per message) of the newest messages whose summary
    fits in max_tokens ids; the newest message's alone, cut, when not even that fits."""
    ids: list[int] = []
    for start in range(len(messages)):
        ids = _content_ids(tokenizer, extractive_summary(messages[start:]))
        if len(ids) <= max_tokens:
            return ids
    return ids[:max_tokens]


def summary_block(tokenizer: Any, messages: list[dict[str, Any]], heading: str, summary_ids: list[int]) -> list[int]:
    """The opening `messages` with one more user message, `heading` then `summary_ids`
    verbatim, and the generation prompt, as ids under the chat template."""
    base = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    full = tokenizer.apply_chat_template([*messages, {"role": "user", "content": _MARK}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    before, found, after = full[len(base) :].partition(_MARK)
    if not full.startswith(base) or not found:
        raise ValueError("rollout.context: the chat template does not render a conversation as the start of "
                         "its continuation, so ponder cannot place the summary message")  # fmt: skip
    head = encode_chat(tokenizer, messages, add_generation_prompt=False)
    return head + _template_ids(tokenizer, before) + _content_ids(tokenizer, heading) + list(summary_ids) + \
        _template_ids(tokenizer, after)  # fmt: skip


def restart_context(
    tokenizer: Any, messages: list[dict[str, Any]], trajectory: Trajectory, config: ContextConfig, room: int,
    summary_ids: list[int] | None = None,
) -> list[int] | None:  # fmt: skip
    """The new context of an episode compacting at its last turn (whose observation is
    still to come): the summary block and the most kept turns, up to keep_last_turns,
    that leave it within `room` tokens; None when not even no kept turn does.

    summary_ids: the policy's summary; None = the rule's (also the policy summariser's
    fallback), its newest lines within what room is left (at least RULE_LEAST tokens
    while turns are kept), or, for `drop`, the note."""
    turns, current = trajectory.turns, trajectory.turns[-1] if trajectory.turns else None
    for keep in range(min(config.keep_last_turns, len(turns)), -1, -1):
        left_out, kept = turns[: len(turns) - keep], kept_ids(trajectory.response_ids, turns, keep)
        if config.summariser == "drop":
            context = summary_block(tokenizer, messages, dropped_note(len(left_out), "turns"), []) + kept
        elif summary_ids is None:
            bare = len(summary_block(tokenizer, messages, SUMMARY_HEADING, [])) + len(kept)
            budget = min(config.summary_max_tokens, room - bare)
            if budget < (min(RULE_LEAST, config.summary_max_tokens) if keep else 0):
                continue
            ids = rule_summary_ids(tokenizer, turn_messages(left_out, current), budget)
            context = summary_block(tokenizer, messages, SUMMARY_HEADING, ids) + kept
        else:
            context = summary_block(tokenizer, messages, SUMMARY_HEADING, summary_ids) + kept
        if len(context) <= room:
            return context
    return None


def without_eos(token_ids: list[int], eos_ids: set[int]) -> list[int]:
    """`token_ids` without the end-of-turn tokens that close them (the summary message
    closes with the template's own)."""
    end = len(token_ids)
    while end and token_ids[end - 1] in eos_ids:
        end -= 1
    return list(token_ids[:end])


def _template_ids(tokenizer: Any, text: str) -> list[int]:
    """The template's own text: its special tokens are the control tokens."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _content_ids(tokenizer: Any, text: str) -> list[int]:
    """Message text: a special token's spelling in it is characters, not the token."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []
