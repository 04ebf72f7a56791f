"""What the contamination check compares: items from task files, datasets, SFT and
preference data, trajectories and recipes' own splits, and the embedding encoder.

A source is read by what it is:
- a recipe (`.yaml`): its environment's tasks, the train split as training data, the
  evaluation split (eval.split) as evaluation data, after `key=value` overrides;
- `hf:NAME[:CONFIG]:SPLIT`: a dataset in the local cache, read as task rows;
- a JSONL / JSON-lines / Parquet file or a saved `datasets` directory: one item per row.

A row's text is what a model would read of it: a task's question and context; the
messages of a conversation (TRL's `messages`, `prompt`, `completion`; a preference
pair's `chosen` and `rejected`; verl's `prompt`); a trajectory's actions and
observations (its prompt is stored as token ids only); a `text` column; else every
text value of the row. The pure matching is ponder.eval.contamination.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ponder.eval.contamination import ContaminationConfig, ContaminationReport, Embedder, Item, check_contamination
from ponder.fileio import write_json_atomic
from ponder.types import Task

RECIPE_SUFFIXES = (".yaml", ".yml")
_MESSAGE_KEYS = ("messages", "prompt", "completion", "chosen", "rejected")


def task_text(task: Task) -> str:
    """What the policy reads of a task: its question, then its context when it has one."""
    return "\n".join(part for part in (task.question, task.context or "") if part)


def task_items(tasks: Sequence[Task]) -> list[Item]:
    return [Item(task.id, task_text(task)) for task in tasks]


def _message_texts(value: Any) -> list[str]:
    """The text of a prompt or completion: a string, or chat messages' contents."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        return []
    texts = []
    for message in value:
        content = message.get("content") if isinstance(message, dict) else message
        if isinstance(content, str) and content:
            texts.append(content)
        elif isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}]
            texts += [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return texts


def row_text(row: Any) -> str:
    """The text of one row of any of the layouts the module docstring lists."""
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        return str(row)
    if isinstance(row.get("question"), str):  # a ponder task (or a dataset with a question column)
        context = row.get("context")
        return "\n".join(part for part in (row["question"], context if isinstance(context, str) else "") if part)
    parts = [text for key in _MESSAGE_KEYS for text in _message_texts(row.get(key))]
    for turn in row.get("turns") or []:  # a trajectory row
        if isinstance(turn, dict):
            parts += [turn[key] for key in ("action", "observation") if isinstance(turn.get(key), str)]
    if isinstance(row.get("text"), str):
        parts.append(row["text"])
    if not parts:
        parts = [value for value in row.values() if isinstance(value, str)]
    return "\n".join(part for part in parts if part)


def row_id(row: Any, fallback: str) -> str:
    """A row's id (`id`, a trajectory's `task_id`, verl's `extra_info.index`), else `fallback`."""
    if isinstance(row, dict):
        for key in ("id", "task_id"):
            if isinstance(row.get(key), (str, int)) and not isinstance(row.get(key), bool) and str(row[key]):
                return str(row[key])
        extra = row.get("extra_info")
        if isinstance(extra, dict) and extra.get("index") is not None:
            return f"{extra.get('split', 'row')}-{extra['index']}"
    return fallback


def is_recipe(source: str | os.PathLike[str]) -> bool:
    return Path(os.fspath(source)).suffix in RECIPE_SUFFIXES


def recipe_splits(source: str | os.PathLike[str], overrides: Sequence[str] = ()) -> tuple[list[Task], list[Task]]:
    """(train tasks, evaluation tasks: the eval.split) of a recipe's environment."""
    from ponder.config import load_recipe
    from ponder.wiring import build_env

    recipe = load_recipe(os.fspath(source), list(overrides))
    with build_env(recipe) as spec:
        return list(spec.train), list(spec.split(recipe.eval.split))


def read_items(source: str | os.PathLike[str], role: str, overrides: Sequence[str] = ()) -> list[Item]:
    """The items of `source` (see the module docstring); `role` ("train" or "eval")
    picks a recipe's split. A file with no rows is an error."""
    from ponder.data.io import read_rows

    if role not in ("train", "eval"):
        raise ValueError(f"role must be train or eval, got {role!r}")
    if is_recipe(source):
        train, evaluation = recipe_splits(source, overrides)
        tasks = train if role == "train" else evaluation
        if not tasks:
            raise ValueError(f"{source}: the recipe's environment has no {role} tasks")
        return task_items(tasks)
    if str(source).startswith("hf:"):
        from ponder.envs.base import load_tasks_from

        return task_items(load_tasks_from(str(source)))
    rows = read_rows(source)
    if not rows:
        raise ValueError(f"{source}: no rows")
    stem = Path(os.fspath(source)).stem
    return [Item(row_id(row, f"{stem}:{number}"), row_text(row)) for number, row in enumerate(rows)]


def read_pair(
    train: str | os.PathLike[str], evaluation: str | os.PathLike[str], overrides: Sequence[str] = ()
) -> tuple[list[Item], list[Item]]:
    """(training items, evaluation items) of two sources; one recipe named twice is built once."""
    if is_recipe(train) and os.fspath(train) == os.fspath(evaluation):
        train_tasks, eval_tasks = recipe_splits(train, overrides)
        for role, tasks in (("train", train_tasks), ("eval", eval_tasks)):
            if not tasks:
                raise ValueError(f"{train}: the recipe's environment has no {role} tasks")
        return task_items(train_tasks), task_items(eval_tasks)
    return read_items(train, "train", overrides), read_items(evaluation, "eval", overrides)


def _quietly(load: Any, *args: Any) -> Any:
    """load(*args) without transformers' per-load progress bar (a table follows it)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return load(*args)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load(*args)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def minilm_embedder(batch_size: int = 64, device: str | None = None) -> tuple[Embedder | None, str]:
    """(embed(texts) -> unit vectors [n, 384] by all-MiniLM-L6-v2, "") — the encoder dense
    retrieval uses, loaded offline from its package — or (None, one line saying why not)."""
    try:
        from ponder.tools.retrieval.dense import load_encoder

        model = _quietly(load_encoder, device)
    except (ImportError, RuntimeError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None, f"embedding skipped: {reason}"

    def embed(texts: list[str]) -> np.ndarray:
        vectors = model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                               show_progress_bar=False)  # fmt: skip
        return np.ascontiguousarray(vectors, dtype=np.float32)

    return embed, ""


def check_items(train: Sequence[Item], evaluation: Sequence[Item], config: ContaminationConfig) -> ContaminationReport:
    """check_contamination with the MiniLM encoder when config.embeddings asks for it
    (left out, with the reason in report.skipped, when it cannot load)."""
    embed, skipped = minilm_embedder() if config.embeddings else (None, "")
    return check_contamination(train, evaluation, config, embed, skipped)


def check_run_splits(
    train: Sequence[Task], evaluation: Sequence[Task], config: ContaminationConfig,
    more_train: Sequence[Item] = (),
) -> ContaminationReport:  # fmt: skip
    """A run's own check: its training tasks (and `more_train`, e.g. an SFT data file's
    conversations) against the evaluation tasks it scores."""
    return check_items([*task_items(train), *more_train], task_items(evaluation), config)


def write_report(report: ContaminationReport, path: str | os.PathLike[str]) -> None:
    """The report's JSON (summary, config, every item's matches), written atomically."""
    write_json_atomic(Path(path), report.to_dict(), sort_keys=False)


# The file a run (demo, pipeline) writes its own check to.
RUN_REPORT = "contamination.json"


def check_and_write(
    train: Sequence[Task], evaluation: Sequence[Task], path: str | os.PathLike[str], embeddings: bool = False,
    more_train: Sequence[Item] = (),
) -> ContaminationReport:  # fmt: skip
    """A run's check of its own splits (check_run_splits at the default settings; the
    embedding signal only when asked: it loads an encoder, the n-grams take
    milliseconds), its report written to `path`."""
    report = check_run_splits(train, evaluation, ContaminationConfig(embeddings=embeddings), more_train)
    write_report(report, path)
    return report
