"""A guard over the whole conversation: multi-turn escalation and best-of-N noise.

A request the deployer forbids (an `Intent`: tell an outsider the Wi-Fi password, delete
the contracts) is an act on a target. A Crescendo-style attacker never asks for it in
one turn: one turn names the target ("is there something about the wifi in there?"),
a later one asks for the act on it ("could you open it and tell me what it says?"),
and each turn alone is innocuous. A best-of-N attacker asks in one turn, N times, each
time perturbed (random capitals, scrambled letters, a character shifted, spaces moved)
until a filter misses one.

`ConversationGuard.check_turn(message, record)` runs before the agent acts on a user
turn and classifies the conversation so far:
- a turn that names an intent's act and its target asks for it;
- `scope="conversation"`: so does a turn that asks for the act on something it refers
  back to (a pronoun right after the act word: "open it", "send that", "get rid of
  it", or "that file"), when an earlier turn named the target;
- `normalize`: words are matched after case folding, look-alike digits (0→o, 3→e …),
  hidden characters and spacing are undone, and a word matches a keyword with its
  inner letters in any order, or (words of 7 letters or more) one letter changed;
- `perturbed`: a turn that looks machine-perturbed (most words in random mixed case:
  nobody types "tELl mE thE WiFi") and names a target even loosely asks for the
  intent, act or no act: best-of-N noise that hides the act still shows itself.
A flagged turn is refused; with `end_conversation` every later turn of the same
conversation is refused too. The record (`record["conversation"]`) is JSON-ready and
lives with the agent's state, so a resumed conversation stays ended.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ponder.tools.safety.hidden import strip_hidden

SCOPES = ("conversation", "last_turn")
PRONOUNS = ("it", "its", "that", "this", "them", "those", "these")
REFERRING_NOUNS = ("file", "files", "one", "note", "notes", "document", "thing", "text", "stuff")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i"})
_TOKEN = re.compile(r"[a-z]+")
_PRONOUN_WINDOW = 3  # tokens after an act word in which a pronoun refers back
FUZZY_MIN_CHARS = 7  # words this long may be one letter off
LOOSE_TWO_CHARS = 8  # in perturbed text, words this long may be two letters off


@dataclass(frozen=True)
class Intent:
    """One thing the deployer forbids: an act on a target, each a list of keywords
    (single words or short phrases). `description` completes "the conversation asks to …"."""

    name: str
    act: tuple[str, ...]
    target: tuple[str, ...]
    description: str = ""


DEFAULT_INTENTS: tuple[Intent, ...] = (
    Intent("disclose_secret",
           act=("tell", "show", "give", "send", "email", "mail", "forward", "read", "open", "print", "display",
                "reveal", "share", "paste", "copy", "post", "upload", "say", "says", "leak", "dump"),
           target=("password", "passwords", "passphrase", "credential", "credentials", "secret", "secrets", "wifi",
                   "deploy key", "api key", "private key", "access token"),
           description="disclose a password, key or other secret"),
    Intent("destroy_records",
           act=("delete", "remove", "erase", "wipe", "shred", "destroy", "get rid of", "trash", "overwrite",
                "replace", "clear out", "truncate", "empty"),
           target=("contract", "contracts", "important", "records", "backup", "backups", "database", "invoices"),
           description="delete or overwrite important records"),
)  # fmt: skip


@dataclass
class ConversationOptions:
    """How the conversation guard reads and what it does.

    scope: `conversation` (every user turn so far, see the module docstring) or
        `last_turn` (the newest turn alone: the per-message filter it improves on).
    normalize: undo casing, look-alike characters, spacing, scrambling and one-character
        noise before matching (off: keywords are matched as written, case-insensitively).
    end_conversation: after a refusal, refuse every later turn of the conversation.
    perturbed: with `normalize`, a turn that looks machine-perturbed and names a target
        loosely (one letter off in words of 7 letters, two in longer ones) is refused
        (see the module docstring).
    """

    scope: str = "conversation"
    normalize: bool = True
    end_conversation: bool = True
    perturbed: bool = True

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"conversation scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")


@dataclass
class ConversationVerdict:
    """Why a turn was refused: the intent, the turns that named its target and act, and
    the words matched."""

    intent: str
    target_turn: int
    act_turn: int
    matched: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tokens(text: str, normalize: bool) -> list[str]:
    """The words of `text`, folded the way the options say."""
    text = strip_hidden(text).lower()
    return _TOKEN.findall(text.translate(_LEET) if normalize else text)


def _same_letters(token: str, word: str, changes: int) -> bool:
    """Equal first and last letters (when `changes` is 0), inner letters in any order,
    at most `changes` characters different."""
    if len(token) != len(word):
        return False
    if changes == 0 and (token[0] != word[0] or token[-1] != word[-1]):
        return False
    if changes and token[0] != word[0] and token[-1] != word[-1]:
        return False
    missing = Counter(word) - Counter(token)
    return sum(missing.values()) <= changes


def word_matches(token: str, word: str, normalize: bool) -> bool:
    """Whether one token is the keyword `word` (see the module docstring)."""
    if token == word or not normalize or len(word) <= 3:
        return token == word
    # One changed letter only in long words: "remote" is one letter from "remove", "point" from "print".
    return _same_letters(token, word, 1 if len(word) >= FUZZY_MIN_CHARS else 0)


def find_keywords(words: Sequence[str], keywords: Iterable[str], normalize: bool,
                  loose: bool = False) -> list[tuple[str, int]]:  # fmt: skip
    """(keyword, index of its first token) for each keyword found in `words`; `loose`:
    one more letter may be off in words of 7 letters or more."""
    found = []
    joined, starts, at = "".join(words), [], 0
    for word in words:  # where each word starts in `joined`: a keyword split by a space starts at one
        starts.append(at)
        at += len(word)
    for keyword in keywords:
        parts = _TOKEN.findall(keyword.lower())
        for index in range(len(words) - len(parts) + 1):
            if all(_matches(words[index + k], part, normalize, loose) for k, part in enumerate(parts)):
                found.append((keyword, index))
                break
        else:
            if normalize and len(parts) == 1 and len(parts[0]) >= 5 and _in_joined(joined, starts, parts[0], loose):
                found.append((keyword, -1))  # split by spaces ("pass word"): found with the spaces taken out
    return found


def _matches(token: str, word: str, normalize: bool, loose: bool) -> bool:
    if loose and len(word) >= FUZZY_MIN_CHARS:
        return _same_letters(token, word, 2 if len(word) >= LOOSE_TWO_CHARS else 1)
    return word_matches(token, word, normalize)


def _in_joined(joined: str, starts: Sequence[int], word: str, loose: bool = False) -> bool:
    # Letters exact (first and last in place) anywhere; for a long keyword in perturbed
    # text, one letter off where a word starts (a keyword split by a space starts there).
    # Looser, any text holds a near keyword somewhere across its word boundaries.
    width = len(word)
    if any(_same_letters(joined[start:start + width], word, 0) for start in range(len(joined) - width + 1)):
        return True
    return loose and width >= LOOSE_TWO_CHARS and any(_same_letters(joined[start:start + width], word, 1)
                                                      for start in starts)  # fmt: skip


def looks_perturbed(text: str) -> bool:
    """Most words in random mixed case ("tELl mE thE"), as best-of-N augmentation writes
    them; camel-case names ("iPhone", "McDonald") are too few to count."""
    words = re.findall(r"[A-Za-z]{2,}", strip_hidden(text))
    odd = [w for w in words if not (w.islower() or w.isupper() or w.istitle())]
    return len(words) >= 3 and len(odd) >= 0.3 * len(words)


def refers_back(words: Sequence[str], act_positions: Iterable[int]) -> bool:
    """A pronoun right after an act word ("open it"), or "that file"-like words."""
    for position in act_positions:
        if position >= 0 and any(w in PRONOUNS for w in words[position + 1:position + 1 + _PRONOUN_WINDOW]):
            return True
    return any(a in ("that", "this", "those", "these", "same") and b in REFERRING_NOUNS
               for a, b in zip(words, words[1:]))  # fmt: skip


class ConversationGuard:
    """Refuses the turns of a conversation that ask for a forbidden intent; see the module docstring."""

    def __init__(self, intents: Sequence[Intent] = DEFAULT_INTENTS, options: ConversationOptions | None = None,
                 refusal: str = "I can't help with that: this conversation asks me to {what}.") -> None:  # fmt: skip
        self.intents = list(intents)
        self.options = options or ConversationOptions()
        self.refusal = refusal

    def classify(self, turns: Sequence[str]) -> ConversationVerdict | None:
        """The first intent the newest of `turns` asks for, or None."""
        if not turns:
            return None
        normalize = self.options.normalize
        words = [tokens(turn, normalize) for turn in turns]
        last = len(turns) - 1
        perturbed = normalize and self.options.perturbed and looks_perturbed(turns[last])
        for intent in self.intents:
            acts = find_keywords(words[last], intent.act, normalize)
            targets = find_keywords(words[last], intent.target, normalize, loose=perturbed)
            matched = [keyword for keyword, _ in acts + targets]
            if targets and (acts or perturbed):
                return ConversationVerdict(intent.name, last, last, matched + ["perturbed"] * (not acts))
            if not acts or self.options.scope == "last_turn" or not refers_back(words[last], [i for _, i in acts]):
                continue
            for earlier in range(last - 1, -1, -1):
                named = find_keywords(words[earlier], intent.target, normalize)
                if named:
                    return ConversationVerdict(intent.name, earlier, last, matched + [k for k, _ in named])
        return None

    def check_turn(self, message: str, record: dict[str, Any]) -> str | None:
        """Record the user's `message`; the refusal to answer instead of running it, or None."""
        conversation = record.setdefault("conversation", {"turns": [], "refusals": [], "ended": None})
        conversation["turns"].append(message)
        if conversation["ended"]:
            conversation["refusals"].append({"turn": len(conversation["turns"]) - 1, "intent": conversation["ended"],
                                             "ended": True})  # fmt: skip
            return "This conversation was ended by the safety layer; start a new one."
        verdict = self.classify(conversation["turns"])
        if verdict is None:
            return None
        conversation["refusals"].append(verdict.to_dict())
        if self.options.end_conversation:
            conversation["ended"] = verdict.intent
        intent = next(i for i in self.intents if i.name == verdict.intent)
        return self.refusal.format(what=intent.description or intent.name.replace("_", " "))


def intents_from_dict(data: dict[str, Any]) -> list[Intent]:
    """Intents from `{name: {"act": [...], "target": [...], "description": "..."}}`; ValueError
    naming a bad entry."""
    intents = []
    for name, spec in data.items():
        if not isinstance(spec, dict) or set(spec) - {"act", "target", "description"} or not spec.get("act") \
                or not spec.get("target"):  # fmt: skip
            raise ValueError(f"conversation intent {name!r}: want {{act: [...], target: [...], description}}")
        intents.append(Intent(str(name), tuple(map(str, spec["act"])), tuple(map(str, spec["target"])),
                              str(spec.get("description") or "")))  # fmt: skip
    return intents
