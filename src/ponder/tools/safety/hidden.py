"""Text a person does not see but a model reads: Unicode tag characters, zero-width and
direction controls.

Unicode's tag block (U+E0000–U+E007F) shadows ASCII one to one: `U+E0041` is an invisible
`A`. Tokenizers keep these characters, and models read the words they spell, so a tool
description or a tool result can carry a whole instruction that no reviewer sees
("ASCII smuggling"). Zero-width characters (U+200B …) inside a word hide it from a
pattern match ("ig\u200bnore") without changing what it says to the model; direction
controls (U+202A …) reorder what is shown. `reveal` gives the three readings of a text:
what a model may read (tag text decoded, invisible characters dropped), what a person
sees (everything hidden dropped), and the hidden text itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAG_FIRST, TAG_LAST = 0xE0000, 0xE007F
# Zero-width, word-joiner, invisible-operator, BOM, Mongolian vowel separator, and the
# bidirectional embedding / override / isolate controls and marks.
_INVISIBLE = "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u202a\u202b\u202c\u202d\u202e" \
             "\u2066\u2067\u2068\u2069\u200e\u200f"  # fmt: skip
_HIDDEN = re.compile(f"[{_INVISIBLE}\U000e0000-\U000e007f]")
_TAG_RUN = re.compile("[\U000e0000-\U000e007f]+")
# U+1F3F4 (the black flag), a few tags and the cancel tag: a subdivision flag emoji (England's),
# shown as the flag alone here.
_FLAG = re.compile("\U0001f3f4[\U000e0020-\U000e007e]{1,8}\U000e007f")
_INVISIBLE_RUN = re.compile(f"[{_INVISIBLE}]+")
# An invisible character with a Latin letter or digit on both sides: inside a word.
_IN_WORD = re.compile(f"(?<=[A-Za-z0-9])[{_INVISIBLE}]+(?=[A-Za-z0-9])")


@dataclass(frozen=True)
class Revealed:
    """The readings of one text (see the module docstring).

    readable: tag runs decoded to the ASCII they spell, invisible characters dropped;
    visible: every hidden character dropped (what a person sees);
    tagged: the decoded tag text alone (runs joined by spaces);
    in_word: invisible characters found inside words.
    """

    readable: str
    visible: str
    tagged: str
    in_word: int

    @property
    def hidden(self) -> bool:
        return bool(self.tagged.strip()) or self.in_word > 0


def _decode_tags(run: str) -> str:
    # U+E0020..U+E007E spell ASCII; the others (language tag, cancel tag) spell nothing.
    return "".join(chr(ord(c) - TAG_FIRST) for c in run if 0x20 <= ord(c) - TAG_FIRST <= 0x7E)


def has_hidden(text: str) -> bool:
    """Whether `text` holds any tag, zero-width or direction-control character."""
    return _HIDDEN.search(text) is not None


def reveal(text: str) -> Revealed:
    """The readings of `text`; a text without hidden characters is returned as is."""
    if not has_hidden(text):
        return Revealed(text, text, "", 0)
    text = _FLAG.sub("\U0001f3f4", text)
    in_word = sum(len(match.group(0)) for match in _IN_WORD.finditer(text))
    tagged = [_decode_tags(match.group(0)) for match in _TAG_RUN.finditer(text)]
    readable = _TAG_RUN.sub(lambda match: " " + _decode_tags(match.group(0)) + " ", text)
    readable = _INVISIBLE_RUN.sub("", readable)
    visible = _INVISIBLE_RUN.sub("", _TAG_RUN.sub("", text))
    return Revealed(readable, visible, " ".join(t for t in tagged if t.strip()), in_word)


def strip_hidden(text: str) -> str:
    """`text` as a person sees it: every tag, zero-width and direction character removed."""
    return reveal(text).visible
