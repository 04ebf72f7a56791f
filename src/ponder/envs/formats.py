"""Tasks from the datasets people already hold: their own column names, a transform,
a `datasets` builder already in the local cache, and verl's and TRL's RL layouts.

A task source (env.train_tasks / env.eval_tasks) is read in four steps; each fails
with one line naming the file, and the row and column where there is one:

1. rows: a JSONL file, a Parquet file, a saved `datasets` directory, or
   `hf:NAME[:CONFIG]:SPLIT` (`datasets.load_dataset` offline: a dataset already in
   the local cache, or a local directory of data files; never the network). No rows
   is an error (an empty split).
2. env.transform (`module:function`): each row dict → a row dict (None drops the row),
   on the dataset's own columns.
3. env.format: `ponder` (the task schema, ponder.envs.taskfile), `verl` (verl's RL
   Parquet: `prompt` as chat messages, `reward_model.ground_truth`, `data_source` as
   the kind, `extra_info.split`-`extra_info.index` as the id, or `extra_info.id` where
   ponder wrote one) or `trl` (TRL's prompt-only and conversational datasets:
   `prompt` as text or as messages, an optional `completion`, every other column
   kept for reward functions); `auto` tells them apart by the first row's columns.
4. env.columns (task field → dataset column, `a.b` for a nested one): e.g.
   `{question: problem, answers: solution, kind: level, id: uid}`; the columns stay
   in the row too (unknown ones go to the task's metadata).

After a mapping or a verl / TRL layout, a single answer (text or a number) is a
one-item list, a number-valued kind or id is text, a text oracle is a one-item list,
and a row with no id is numbered after its file or split from 0 (`train-0`,
`train-1` …, as verl numbers each split's `extra_info.index`). A verl or TRL row
keeps what the layout says in metadata: `messages` (the opening chat, used as is by
the environment), `prompt` (TRL's prompt as given) and `columns` (the row's other
columns, for TRL-signature rewards).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.envs.taskfile import TaskFileError, parse_task_rows
from ponder.fileio import read_jsonl
from ponder.plugins import import_object
from ponder.types import Task

FORMATS = ("auto", "ponder", "verl", "trl")
FIELDS = ("id", "question", "answers", "kind", "context", "oracle_actions")
_HF = re.compile(r"^hf:(?P<name>[^:]+)(?::(?P<config>[^:\[]+))?:(?P<split>[^:\[]+(?:\[.*\])?)$")
Rows = list[tuple[str, Any]]  # ("file:line" / "file:row N", the row)
# Where each layout takes a task field from (named in errors).
ORIGINS = {
    "ponder": {},
    "verl": {"id": "extra_info.index", "question": "prompt", "answers": "reward_model.ground_truth",
             "kind": "data_source"},
    "trl": {"question": "prompt", "oracle_actions": "completion"},
}  # fmt: skip


@dataclass
class TaskSource:
    """How to read a task source: env.columns, env.transform and env.format."""

    columns: dict[str, str] = field(default_factory=dict)
    transform: str = ""
    format: str = "auto"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"env.format: want one of {', '.join(FORMATS)}, got {self.format!r}")
        unknown = sorted(set(self.columns) - set(FIELDS))
        if unknown:
            raise ValueError(f"env.columns: unknown task field {unknown[0]!r}; valid: {', '.join(FIELDS)}")
        bad = [key for key, column in self.columns.items() if not isinstance(column, str) or not column]
        if bad:
            raise ValueError(f"env.columns.{bad[0]}: want a column name, got {self.columns[bad[0]]!r}")


def load_source(source: str | os.PathLike[str], spec: TaskSource | None = None) -> list[Task]:
    """The tasks of `source` read as `spec` says (see the module docstring)."""
    spec = spec or TaskSource()
    name = os.fspath(source)
    rows = read_source_rows(name)
    if spec.transform:
        rows = transformed(rows, spec.transform)
    if not rows:
        raise TaskFileError(f"{name}: no rows (an empty file or split)")
    layout = spec.format if spec.format != "auto" else detect_format(rows[0][1])
    if layout == "ponder" and not spec.columns and not spec.transform:  # the task schema as it is
        return parse_task_rows(rows, require_answers=name.endswith((".jsonl", ".json")))
    label = source_label(name)
    converted = [(where, task_row(row, where, f"{label}-{position}", layout, spec.columns))
                 for position, (where, row) in enumerate(rows)]  # fmt: skip
    return parse_task_rows(converted, require_answers=False)


def source_label(name: str) -> str:
    """What numbered task ids start with: the file's stem, or an `hf:` source's split."""
    match = _HF.match(name)
    if match is not None:
        return match["split"].split("[", 1)[0]
    return Path(name).stem or "row"


def read_source_rows(name: str) -> Rows:
    """Every row of a JSONL / Parquet file, a saved `datasets` directory or `hf:…`."""
    if name.startswith("hf:"):
        return [(f"{name}:row {i}", row) for i, row in enumerate(hf_rows(name), start=1)]
    path = Path(name)
    if path.suffix in (".jsonl", ".json"):
        return list(read_jsonl(path, TaskFileError, "task file"))
    try:
        if path.is_dir():
            rows = _saved_dataset_rows(path)
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        else:
            raise TaskFileError(f"{path}: unknown task file type (use .jsonl, .parquet, a datasets directory "
                                "or hf:NAME[:CONFIG]:SPLIT)")  # fmt: skip
    except (OSError, ValueError) as err:
        if isinstance(err, TaskFileError):
            raise
        raise TaskFileError(f"{path}: cannot read tasks ({_first_line(err)})") from None
    return [(f"{path}:row {index}", _decoded(row)) for index, row in enumerate(rows, start=1)]


def _saved_dataset_rows(path: Path) -> list[dict[str, Any]]:
    from datasets import DatasetDict, load_from_disk

    state = path / "state.json"
    if state.is_file() and json.loads(state.read_text(encoding="utf-8")).get("_data_files") == []:
        return []  # an empty split saved by save_to_disk: load_from_disk fails on it with an IndexError
    saved = load_from_disk(str(path))
    if isinstance(saved, DatasetDict):
        splits = list(saved)
        if len(splits) != 1:
            raise TaskFileError(f"{path}: a DatasetDict with splits {', '.join(splits)}; give one, e.g. "
                                f"{path / splits[0]}")  # fmt: skip
        saved = saved[splits[0]]
    return saved.to_list()


def hf_rows(name: str) -> list[dict[str, Any]]:
    """`hf:NAME[:CONFIG]:SPLIT` by `datasets.load_dataset` with the network off: a
    dataset already in the local cache ($HF_DATASETS_CACHE), or a local directory of
    data files. Anything else is a one-line TaskFileError, never a download."""
    match = _HF.match(name)
    if match is None:
        raise TaskFileError(f"{name}: want hf:NAME[:CONFIG]:SPLIT, e.g. hf:openai/gsm8k:main:train")
    import datasets

    cache = os.environ.get("HF_DATASETS_CACHE") or None
    with _offline():
        try:
            loaded = datasets.load_dataset(match["name"], match["config"], split=match["split"], cache_dir=cache)
        except Exception as err:  # noqa: BLE001 - datasets raises a dozen types; each becomes the one line
            raise TaskFileError(f"{name}: cannot load it offline ({_first_line(err)}); only a dataset already "
                                "in the local cache or a local directory loads") from None  # fmt: skip
    return loaded.to_list()


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """The Hub off for datasets and huggingface_hub, whatever they read at import."""
    import datasets.config
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE = saved


def transformed(rows: Rows, path: str) -> Rows:
    """env.transform applied to every row; a row it maps to None is dropped."""
    transform: Callable[[dict[str, Any]], Any] = import_object(path, "env.transform")
    if not callable(transform):
        raise ValueError(f"env.transform '{path}': not callable")
    out = []
    for where, row in rows:
        try:
            result = transform(dict(row)) if isinstance(row, dict) else row
        except Exception as err:  # noqa: BLE001 - the user's code: name the row it failed on
            raise TaskFileError(f"{where}: env.transform {path} failed ({type(err).__name__}: "
                                f"{_first_line(err)})") from None  # fmt: skip
        if result is None:
            continue
        if not isinstance(result, dict):
            raise TaskFileError(f"{where}: env.transform {path} returned {type(result).__name__}, not a row dict")
        out.append((where, result))
    return out


def detect_format(row: Any) -> str:
    """`verl` for a row with `prompt` and `reward_model`, `trl` for one with a `prompt`
    and no `question`, else `ponder`."""
    if not isinstance(row, dict) or "prompt" not in row:
        return "ponder"
    if "reward_model" in row:
        return "verl"
    return "ponder" if "question" in row else "trl"


def task_row(row: Any, where: str, default_id: str, layout: str, columns: dict[str, str]) -> Any:
    """A row of the task schema from a dataset row: the layout's fields, then the
    mapped columns, with the usual types (see the module docstring)."""
    if not isinstance(row, dict):
        return row  # parse_task_row names what it is
    fields = {"ponder": dict, "verl": verl_fields, "trl": trl_fields}[layout]
    out = fields(row) if layout == "ponder" else fields(row, where)
    origins = {name: f"column {column!r}" for name, column in ORIGINS[layout].items()}
    for name, column in columns.items():
        found, value = lookup(row, column)
        if not found:
            raise TaskFileError(f"{where}: no column {column!r} (env.columns.{name}); the row has "
                                f"{', '.join(sorted(map(str, row))) or 'no columns'}")  # fmt: skip
        out[name], origins[name] = value, f"column {column!r} (env.columns.{name})"
    out = coerced(out, where, origins)
    out.setdefault("id", default_id)
    return out


def lookup(row: dict[str, Any], column: str) -> tuple[bool, Any]:
    """(found, value) of `column` in `row`; `a.b` reaches into a nested dict."""
    if column in row:
        return True, row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def coerced(row: dict[str, Any], where: str, origins: dict[str, str]) -> dict[str, Any]:
    """Single answers and oracles as one-item lists, number kinds and ids as text; a
    value of another type is a TaskFileError naming the row and the column."""
    out = dict(row)

    def wrong(name: str, want: str) -> TaskFileError:
        origin = origins.get(name, f"column {name!r}")
        return TaskFileError(f"{where}: {origin} holds {type(row[name]).__name__}, want {want}")

    for name in ("id", "kind"):
        if name in out and out[name] is None:
            del out[name]
        elif name in out and _scalar(out[name]):
            out[name] = _text(out[name])
        elif name in out:
            raise wrong(name, "text or a number")
    if "question" in out and not isinstance(out["question"], str):
        raise wrong("question", "text")
    for name in ("answers", "oracle_actions"):
        value = out.get(name)
        if value is None:
            out.pop(name, None)
        elif _scalar(value) and (name == "answers" or isinstance(value, str)):
            out[name] = [_text(value)]
        elif isinstance(value, list) and all(_scalar(item) for item in value):
            out[name] = [_text(item) for item in value]
        else:
            raise wrong(name, "text, a number or a list of them" if name == "answers" else "text or a list of text")
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str:
    """A number as its shortest text: 42.0 → "42", 0.5 → "0.5"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def verl_fields(row: dict[str, Any], where: str) -> dict[str, Any]:
    """Task fields from a verl RL row: the opening chat, ground truth, data source."""
    messages = chat_messages(row.get("prompt"), where, "verl 'prompt'")
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if truth is None or (isinstance(truth, (str, list)) and not truth):
        raise TaskFileError(f"{where}: verl row has no reward_model.ground_truth")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    columns = {key: value for key, value in row.items() if key != "prompt"}
    index = extra.get("index")
    if isinstance(extra.get("split"), str) and _scalar(index):  # verl numbers each split from 0
        index = f"{extra['split']}-{_text(index)}"
    out = {"id": extra.get("id", index), "question": last_user_text(messages, where), "answers": truth,
           "metadata": {"messages": messages, "columns": columns}}  # fmt: skip
    if row.get("data_source") is not None:
        out["kind"] = row["data_source"]
    return out


def trl_fields(row: dict[str, Any], where: str) -> dict[str, Any]:
    """Task fields from a TRL prompt-only / conversational row (plus its `completion`,
    when it has one, as the oracle)."""
    prompt = row.get("prompt")
    columns = {key: value for key, value in row.items() if key not in ("prompt", "completion")}
    metadata: dict[str, Any] = {"prompt": prompt, "columns": columns}
    if isinstance(prompt, str):
        question = prompt
    else:
        metadata["messages"] = chat_messages(prompt, where, "TRL 'prompt'")
        question = last_user_text(metadata["messages"], where)
    out: dict[str, Any] = {"id": row.get("id"), "question": question, "metadata": metadata}
    completion = row.get("completion")
    if isinstance(completion, str):
        out["oracle_actions"] = [completion]
    elif completion is not None:
        replies = chat_messages(completion, where, "TRL 'completion'")
        out["oracle_actions"] = [m["content"] for m in replies if m["role"] == "assistant"]
    return out


def chat_messages(value: Any, where: str, what: str) -> list[dict[str, Any]]:
    """`value` as chat messages ({"role", "content"} each, content text); TaskFileError if not."""
    if not isinstance(value, list) or not value:
        raise TaskFileError(f"{where}: {what} must be a list of chat messages, got {type(value).__name__}")
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
            message.get("content"), str
        ):
            raise TaskFileError(f"{where}: {what} holds a message that is not {{role, content}} text")
    return [{key: item for key, item in message.items() if item is not None} for message in value]


def last_user_text(messages: list[dict[str, Any]], where: str) -> str:
    """The content of the last user message: the task's question."""
    users = [m["content"] for m in messages if m["role"] == "user" and m["content"].strip()]
    if not users:
        raise TaskFileError(f"{where}: the prompt has no user message")
    return users[-1]


def _decoded(row: Any) -> Any:
    """Parquet and datasets columns hold nested values as JSON text at times (metadata)."""
    if not isinstance(row, dict):
        return row
    out = dict(row)
    if isinstance(out.get("metadata"), str):
        with contextlib.suppress(json.JSONDecodeError):
            out["metadata"] = json.loads(out["metadata"])
    return out


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
