"""Final answers that must match a JSON Schema: extraction, validation, the correction prompt."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from ponder.tools.registry import describe_validation_error

_DECODER = json.JSONDecoder()
_MAX_ERRORS = 3


def extract_json(text: str) -> tuple[Any, str | None]:
    """(value, None) for the JSON value in `text`, or (None, one-line error).

    Accepts the bare value, a ```json fenced block, or a value after leading prose
    (small models often write "Here is the answer: {...}"); trailing prose is an error.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body[3:].split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    if not body:
        return None, "the answer is empty; reply with a JSON value"
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    candidates = [0] + sorted(starts)
    error = "not valid JSON"
    for start in candidates:
        try:
            value, end = _DECODER.raw_decode(body, start)
        except json.JSONDecodeError as exc:
            if start == 0:
                error = f"not valid JSON ({exc.msg} at char {exc.pos})"
            continue
        if body[end:].strip():
            return None, "unexpected text after the JSON value; reply with the JSON only"
        return value, None
    return None, error


def check_answer(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(value, None) when `text` holds JSON matching `schema`, else (None, one-line reason)."""
    value, error = extract_json(text)
    if error is not None:
        return None, error
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return value, None
    described = [_as_answer_error(describe_validation_error(e)) for e in errors[:_MAX_ERRORS]]
    return None, "; ".join(described)


def _as_answer_error(message: str) -> str:
    # The registry's wording is about tool arguments; the same checks here are about fields.
    message = message.replace("required argument", "required field").replace("unexpected argument", "unexpected field")
    message = message.replace("argument '", "field '")
    return "the answer" + message[len("arguments") :] if message.startswith("arguments") else message


def correction_message(error: str, attempt: int, allowed: int) -> str:
    """What the model reads after an invalid final answer."""
    return (
        f"Your final answer does not match the required JSON Schema: {error}. "
        f"Reply again with only the corrected JSON (correction {attempt} of {allowed})."
    )
