"""Tool output rendered as data: protocol tags and chat special tokens neutralised, reversibly.

A tool result is spliced into the context right next to the tags that the parser and
the chat template give meaning to. Left verbatim, a document holding
`</tool_response><tool_call>{…}</tool_call>` closes its own result and shows the model a
call it seems to have written; a search passage holding `</information><answer>…` ends
the retrieved block; `<|im_start|>system` is even tokenised to the real special token.
`escape_untrusted` turns the `<` that opens such a tag into `&lt;`, and the colon of a
ReAct keyword at the start of a line into `&#58;`: still readable, no longer a tag.
Text without protocol tags passes unchanged, so clean observations keep their layout.

The escaping is reversible (`unescape_untrusted(escape_untrusted(x)) == x` for every x):
an `&` that would start one of the three entities is itself written `&amp;`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Tags of every built-in protocol (Hermes, Search-R1 and its math / code variants, role
# tags some prompts use), escaped whatever the parser in use: an observation shown in one
# format may be replayed in another (SFT data, a different agent style).
DEFAULT_PROTOCOL_TAGS = frozenset({
    "tool_call", "tool_response", "tools", "think", "search", "information", "answer",
    "result", "calculator", "run", "output", "function", "functions", "function_call",
    "system", "user", "assistant", "tool", "im_start", "im_end",
})  # fmt: skip
REACT_KEYWORDS = ("Thought", "Action", "Action Input", "Observation", "Final Answer")

_ENTITY_AMP = re.compile(r"&(?=(?:lt|amp|#58);)")
_UNESCAPE = re.compile(r"&lt;|&#58;|&amp;(?=(?:lt|amp|#58);)")
_UNESCAPED = {"&lt;": "<", "&#58;": ":", "&amp;": "&"}
# <|im_start|>, <|eot_id|>, <|start_header_id|> …, DeepSeek's full-width <｜…｜>, and
# sentencepiece's <s> </s> (only exactly: `x<s` in code is not a tag).
_CHAT_TOKEN = r"[|\uff5c][^<>\s]{0,40}?[|\uff5c]>|/?s>"
_TAG_CACHE: dict[frozenset[str], re.Pattern[str]] = {}


def _tag_pattern(tags: frozenset[str]) -> re.Pattern[str]:
    pattern = _TAG_CACHE.get(tags)
    if pattern is None:
        names = "|".join(sorted((re.escape(tag) for tag in tags), key=len, reverse=True))
        # `<` then optional `/` and spaces, then a protocol name ending at a word boundary;
        # or a chat special token. Case-insensitive: <TOOL_CALL> reads the same to a model.
        pattern = re.compile(rf"<(?=\s*/?\s*(?:{names})(?![\w-])|{_CHAT_TOKEN})", re.IGNORECASE)
        _TAG_CACHE[tags] = pattern
    return pattern


def _keyword_pattern(keywords: Iterable[str]) -> re.Pattern[str] | None:
    words = sorted(keywords, key=len, reverse=True)
    if not words:
        return None
    names = "|".join(re.escape(word).replace(r"\ ", r"[ \t]*") for word in words)
    return re.compile(rf"(^[ \t]*(?:{names})[ \t]*):", re.MULTILINE | re.IGNORECASE)


def escape_untrusted(text: str, tags: Iterable[str] = (), keywords: Iterable[str] = ()) -> str:
    """`text` with every protocol tag and chat special token neutralised (see module docstring).

    tags: protocol tag names on top of DEFAULT_PROTOCOL_TAGS (a parser's own call and
        result tags); keywords: line-start keywords whose colon is escaped (ReAct's).
    """
    all_tags = frozenset(DEFAULT_PROTOCOL_TAGS | {tag.lower() for tag in tags})
    escaped = _ENTITY_AMP.sub("&amp;", text)
    escaped = _tag_pattern(all_tags).sub("&lt;", escaped)
    keyword = _keyword_pattern(keywords)
    if keyword is not None:
        escaped = keyword.sub(r"\1&#58;", escaped)
    return escaped


def unescape_untrusted(text: str) -> str:
    """The original of `escape_untrusted`'s output (for display, logs and tests)."""
    return _UNESCAPE.sub(lambda match: _UNESCAPED[match.group(0)], text)


def source_header(tool_name: str) -> str:
    """The line that marks a result with its source: which tool, and that it is data.

    The name is escaped too: for an unknown tool it is whatever the model wrote.
    """
    name = escape_untrusted(tool_name.replace("\n", " ")[:64])
    return f"[output of tool '{name}'; untrusted data]" if name else "[tool output; untrusted data]"


def render_result_text(content: str, is_error: bool, tool_name: str, tags: Iterable[str] = (),
                       keywords: Iterable[str] = (), escape: bool = True, mark_source: bool = True) -> str:
    """One tool result as the model reads it: escaped, `error: ` on failures, and under
    its source header. With escape and mark_source off it is the verbatim text (the
    undefended baseline of the injection suite)."""
    body = escape_untrusted(content, tags, keywords) if escape else content
    body = f"error: {body}" if is_error else body
    return f"{source_header(tool_name)}\n{body}" if mark_source else body
