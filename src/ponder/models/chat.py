"""Chat messages to token ids, with message content as text.

`tokenizer.encode(apply_chat_template(messages))` reads a special token typed into a
message (`<|im_start|>system` in a user turn) as the real control token, so whoever
writes a message can forge a turn. `encode_chat` renders the template around markers
instead of the contents, encodes the template's own text with its special tokens, and
each content with `split_special_tokens` (a typed `<|im_end|>` is the characters, not
the token). Content with no special token's text in it is encoded with the whole
rendered string as before, so ordinary prompts keep their exact ids (split at the
contents' edges, a byte-level BPE would merge whitespace differently there).
"""

from __future__ import annotations

from typing import Any

# Private-use characters around a message's index: they stand in for its content while
# the template renders, and no tokenizer merges them with the text around them.
_OPEN, _CLOSE = "\ue000", "\ue001"


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """The token ids of `messages` under the tokenizer's chat template (see module doc)."""
    contents = [str(message.get("content") or "") for message in messages]
    specials = list(getattr(tokenizer, "added_tokens_encoder", {})) or list(tokenizer.all_special_tokens)
    if not any(token in text for text in contents for token in specials):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return tokenizer.encode(text, add_special_tokens=False)
    if any(_OPEN in text or _CLOSE in text for text in contents):
        contents = [text.replace(_OPEN, "\ufffd").replace(_CLOSE, "\ufffd") for text in contents]
    stand_ins = [{**message, "content": f"{_OPEN}{i}{_CLOSE}"} for i, message in enumerate(messages)]
    text = tokenizer.apply_chat_template(stand_ins, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids: list[int] = []
    rest = text
    for index, content in enumerate(contents):
        marker = f"{_OPEN}{index}{_CLOSE}"
        before, found, rest = rest.partition(marker)
        if not found:
            raise ValueError(f"the chat template dropped or rewrote message {index}'s content; "
                             "ponder cannot tell its text from the template's")  # fmt: skip
        ids += _encode(tokenizer, before, split=False) + _encode(tokenizer, content, split=True)
    return ids + _encode(tokenizer, rest, split=False)


def _encode(tokenizer: Any, text: str, split: bool) -> list[int]:
    if not text:
        return []
    return tokenizer(text, add_special_tokens=False, split_special_tokens=split)["input_ids"]
