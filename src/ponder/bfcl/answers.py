"""BFCL's possible answers as calls: one acceptable value per argument, the reference
calls of a question, and the reply a prompt-mode model would write. Used by the
function-calling environment (demonstrations) and by the evaluation's oracle."""

from __future__ import annotations

from typing import Any

from ponder.bfcl.data import BfclQuestion


def _first_choice(options: Any) -> tuple[bool, Any]:
    """(present, value): BFCL lists the acceptable values of an argument, "" meaning "may
    be left out"; the first real value is used (some required arguments list "" first)."""
    choices = options if isinstance(options, list) else [options]
    real = [value for value in choices if value != ""]
    if not real:
        return False, None
    return True, _resolve(real[0])


def _resolve(value: Any) -> Any:
    """Nested answers: a dict holds possible values per key, also inside lists."""
    if isinstance(value, dict):
        return pick_arguments(value)
    if isinstance(value, list):
        return [_resolve(item) if isinstance(item, dict) else item for item in value]
    return value


def pick_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """One acceptable value per argument of a BFCL answer (name → its possible values):
    the first real one, nested answers resolved; arguments that may be left out and
    list no real value are left out."""
    picked = {}
    for name, options in arguments.items():
        present, value = _first_choice(options)
        if present:
            picked[name] = value
    return picked


def reference_calls(question: BfclQuestion) -> list[tuple[str, dict[str, Any]]]:
    """The first possible answer as (function name, arguments) pairs; none for questions
    without answers (irrelevance). Arguments the function does not declare are left out
    (a few answers list one, optionally)."""
    declared = {f["name"]: set((f.get("parameters") or {}).get("properties") or {}) for f in question.functions}
    calls = []
    for call in question.ground_truth:
        for name, arguments in call.items():
            known = declared.get(name)
            picked = pick_arguments(arguments)
            calls.append((name, {k: v for k, v in picked.items() if known is None or k in known}))
    return calls


def oracle_reply(question: BfclQuestion) -> str:
    """A possible answer as a prompt-mode model writes it: `[f(a=1), g(b='x')]`; plain
    text that calls nothing for questions without answers (irrelevance)."""
    if not question.ground_truth:
        return "None of the given functions can answer this question."
    rendered = [f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
                for name, arguments in reference_calls(question)]
    return "[" + ", ".join(rendered) + "]"
