"""Task and corpus files as JSON Lines: atomic writes, and reads that fail early with
one line naming the file and line, before anything heavy (a model) has loaded."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ponder.fileio import atomic_path, read_jsonl
from ponder.types import Task


class TaskFileError(ValueError):
    """A task file is unreadable or a row is not a valid task; the message is `file:line: why`."""


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line, atomically: a reader never sees half a file."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def load_tasks(path: str | os.PathLike[str], require_answers: bool = True) -> list[Task]:
    """Read tasks ({"id", "question", "answers", ...} per line); blank lines are skipped.
    Unknown keys go into metadata. Raises TaskFileError for the first bad line."""
    return parse_task_rows(read_jsonl(path, TaskFileError, "task file"), require_answers)


def parse_task_rows(rows: Iterable[tuple[str, Any]], require_answers: bool = False) -> list[Task]:
    """Tasks from ("file:line" or "file:row N", row) pairs; TaskFileError for the first
    bad row or a task id seen before."""
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for where, row in rows:
        task = parse_task_row(row, where, require_answers)
        if task.id in first_seen:
            raise TaskFileError(f"{where}: duplicate task id {task.id!r} (first on {first_seen[task.id]})")
        place = where.rsplit(":", 1)[1]
        first_seen[task.id] = place if place.startswith("row ") else f"line {place}"
        tasks.append(task)
    return tasks


def _check_optional_fields(row: dict[str, Any], where: str, task_id: str) -> None:
    # A wrong type here would load and fail far later (a prompt built from an int kind).
    expected = {"kind": (str,), "context": (str, type(None)), "needs_search": (bool,)}
    for key, types in expected.items():
        if key in row and not isinstance(row[key], types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise TaskFileError(f"{where}: task {task_id!r}: {key!r} must be {names}, got {type(row[key]).__name__}")
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone-surrogate escape (\ud800-\udfff) decoded to half a character
        raise TaskFileError(f"{where}: task {task_id!r} holds a lone surrogate (a \\ud800-\\udfff escape)") from None


def parse_task_row(row: Any, where: str, require_answers: bool = False) -> Task:
    """One task from a row (dict); TaskFileError naming `where` when it is not one."""
    if not isinstance(row, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    task_id = row.get("id")
    if isinstance(task_id, bool) or not isinstance(task_id, (str, int)) or str(task_id) == "":
        raise TaskFileError(f"{where}: missing 'id' (a non-empty string)")
    task_id = str(task_id)
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise TaskFileError(f"{where}: task {task_id!r} has no 'question'")
    answers = row.get("answers", [] if not require_answers else None)
    if not isinstance(answers, list) or (require_answers and not answers):
        raise TaskFileError(f"{where}: task {task_id!r} has no gold answer")
    if not all(isinstance(a, str) and a.strip() for a in answers):
        raise TaskFileError(
            f"{where}: task {task_id!r} has an empty or non-string gold answer in {answers!r}"
        )
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TaskFileError(f"{where}: task {task_id!r}: 'metadata' must be an object")
    actions = row.get("oracle_actions") or []
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise TaskFileError(f"{where}: task {task_id!r}: 'oracle_actions' must be a list of strings")
    _check_optional_fields(row, where, task_id)
    extra = {k: v for k, v in row.items() if k not in Task.__dataclass_fields__}
    return Task.from_dict({**row, "id": task_id, "answers": answers, "oracle_actions": actions,
                           "metadata": {**extra, **metadata}})  # fmt: skip
