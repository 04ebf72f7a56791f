"""Limits on what crosses between the model and its tools, kept in one place.

- `safe_text`: any text a tool returns, before anything tokenises, encodes or saves it.
  Python strings may hold lone surrogates (from `\\ud800`-`\\udfff` JSON escapes, `surrogateescape`
  decoding, C extensions) and NULs; tokenizers, UTF-8 files, JSON and Parquet writers
  refuse the first, C strings end at the second, and a 10 MB result must not reach a
  tokenizer at all.
- `check_json_value`: arguments decoded from model output: nesting depth bounded (deep
  structures overflow the recursive code that later validates, prints and saves them)
  and every string made encodable.
- `DEFAULT_MAX_CALLS_PER_ACTION`: one action may ask for at most this many calls; the
  rest get an error result and are not run.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_CALLS_PER_ACTION = 8
DEFAULT_MAX_RESULT_CHARS = 100_000
MAX_ARGUMENT_DEPTH = 32
CUT_MARK = "…[cut: {n} more characters]"
REPLACEMENT = "\ufffd"


def encodable(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD; a high+low pair becomes its character."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def safe_text(text: Any, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> str:
    """Tool output made safe to tokenise, encode and store: a str, surrogates replaced,
    NULs removed, at most `max_chars` characters (plus a mark saying how many were cut)."""
    if not isinstance(text, str):
        text = str(text)
    if len(text) > max_chars:
        text = text[:max_chars] + CUT_MARK.format(n=len(text) - max_chars)
    return encodable(text).replace("\x00", "")


def check_json_value(value: Any, max_depth: int = MAX_ARGUMENT_DEPTH) -> tuple[Any, str | None]:
    """(value with every string and key made encodable, None), or (None, why) when it is
    nested deeper than `max_depth`. Iterative, so no input can exhaust the stack."""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any, int]] = [(root, 0, 0)]  # (container, key in it, depth of the value)
    while stack:
        container, key, depth = stack.pop()
        item = container[key]
        if isinstance(item, str):
            container[key] = encodable(item)
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                return None, f"nested deeper than {max_depth} levels"
            if isinstance(item, dict):
                item = container[key] = {encodable(str(k)): v for k, v in item.items()}
                stack.extend((item, k, depth + 1) for k in item)
            else:
                stack.extend((item, i, depth + 1) for i in range(len(item)))
    return root[0], None
