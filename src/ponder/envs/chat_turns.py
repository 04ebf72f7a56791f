"""Environment messages as the text that follows an assistant turn.

Environments of the shared formats (verifiers, OpenEnv) answer in chat messages — a
user turn, tool results — while ponder's engine appends an observation as text after
the tokens the policy generated. `continuation` renders those messages the way the
policy's chat template would have shown them in one conversation, so a multi-turn
episode reads to the model like the chat it was trained on.

An assistant turn that ended at the template's end-of-turn token (the tokenizer's eos
token: a chat model's turn ends there unless a stop string cut it) has that token in
the context already, so the continuation starts after it; one that a stop string ended
(`ended_at_eos=False`) gets the end-of-turn text in front.
"""

from __future__ import annotations

from typing import Any


def continuation(tokenizer: Any, history: list[dict[str, Any]], action: str, messages: list[dict[str, Any]],
                 ended_at_eos: bool = True) -> str:  # fmt: skip
    """The text after `action` (the assistant's reply to `history`) that shows
    `messages` and opens the next assistant turn, in `tokenizer`'s chat template.
    Without a tokenizer or a chat template: the messages' contents on their own lines."""
    new = [{"role": str(m.get("role") or "user"), "content": str(m.get("content") or "")} for m in messages]
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return "".join(f"\n{m['content']}\n" for m in new)
    past = [{"role": str(m.get("role") or "user"), "content": str(m.get("content") or "")} for m in history]
    turn = [*past, {"role": "assistant", "content": action}]
    before = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=False)
    after = tokenizer.apply_chat_template([*turn, *new], tokenize=False, add_generation_prompt=True)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once more follow; "
                         "ponder cannot append environment messages to the episode")  # fmt: skip
    end_of_turn = getattr(tokenizer, "eos_token", None) or ""
    tail = before[before.rfind(action) + len(action):] if action else before
    cut = tail.find(end_of_turn) if end_of_turn and ended_at_eos else -1
    return (tail[cut + len(end_of_turn):] if cut >= 0 else tail) + after[len(before):]
