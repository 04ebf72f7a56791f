"""ponder's data in the field's dataset layouts, so it moves to TRL or verl as it is.

Layouts (registered by name; each is `layout(records) -> rows`):

- `trl-messages`: TRL's conversational language-modeling rows, `{"messages": [...]}`
  (SFTTrainer).
- `trl-prompt-completion`: TRL's conversational prompt-completion rows, `{"prompt":
  [messages before the first reply], "completion": [the rest]}` (SFTTrainer).
- `trl-preference`: TRL's conversational preference rows, `{"prompt", "chosen",
  "rejected"}` (DPOTrainer).
- `trl-prompt`: TRL's conversational prompt-only rows for GRPO, `{"prompt": [the
  opening messages], "answers", "id", "kind"}`; a TRL reward function gets the other
  columns as keyword lists.
- `verl-rl`: verl's RL Parquet rows, `{"data_source", "prompt": [messages], "ability",
  "reward_model": {"style": "rule", "ground_truth"}, "extra_info": {"split", "index",
  "id", "question", "answers"}}`; ground_truth is the answer text when every task has
  one answer, else the list of them.
- `verl-sft`: verl's multi-turn SFT Parquet rows, `{"messages": [...], "data_source",
  "extra_info": {"split", "index", "id"}}` (`data.multiturn.messages_key=messages`).

Messages hold `role` and `content` (and `tool_calls`, as OpenAI function calls with
their arguments as JSON text, where a reply made calls in a structured form; ponder's
tag protocols keep their calls in the reply's text, as the model wrote them).
Files are written atomically: `.parquet` (pyarrow) or `.jsonl`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.data.records import Conversation, DataError, PreferencePair, call_arguments, call_name
from ponder.fileio import atomic_path
from ponder.registry import Registry
from ponder.types import Task


@dataclass
class ExportRecords:
    """What a layout is made from: conversations (SFT), preference pairs (DPO), and
    tasks with their opening messages (RL prompts). `data_source` names the data for
    verl (empty: each task's kind); `split` goes into verl's extra_info."""

    conversations: list[Conversation] = field(default_factory=list)
    preferences: list[PreferencePair] = field(default_factory=list)
    prompts: list[tuple[Task, list[dict[str, Any]]]] = field(default_factory=list)
    data_source: str = ""
    split: str = "train"


Layout = Callable[[ExportRecords], list[dict[str, Any]]]
LAYOUTS: Registry[Layout] = Registry("export layout")


def chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with role and content only (plus structured tool calls, arguments as JSON text)."""
    out = []
    for message in messages:
        row: dict[str, Any] = {"role": str(message["role"]), "content": str(message.get("content") or "")}
        calls = [call for call in message.get("tool_calls") or [] if call_name(call)]
        if calls and message["role"] == "assistant":
            row["tool_calls"] = [{"type": "function", "function": {"name": call_name(call),
                                  "arguments": json.dumps(call_arguments(call), ensure_ascii=False)}}
                                 for call in calls]  # fmt: skip
        out.append(row)
    return out


def _needs(records: list[Any], what: str, layout: str) -> None:
    if not records:
        raise DataError(f"{layout}: nothing to export: the source has no {what}")


@LAYOUTS.register("trl-messages")
def trl_messages(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.conversations, "conversations (SFT data or episodes that answered)", "trl-messages")
    return [{"messages": chat(c.messages)} for c in records.conversations]


@LAYOUTS.register("trl-prompt-completion")
def trl_prompt_completion(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.conversations, "conversations (SFT data or episodes that answered)", "trl-prompt-completion")
    rows = []
    for conversation in records.conversations:
        messages = chat(conversation.messages)
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        rows.append({"prompt": messages[:first], "completion": messages[first:]})
    return rows


@LAYOUTS.register("trl-preference")
def trl_preference(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.preferences, "preference pairs (DPO data, or groups of episodes that scored apart)",
           "trl-preference")  # fmt: skip
    return [{"prompt": chat(p.prompt), "chosen": chat(p.chosen), "rejected": chat(p.rejected)}
            for p in records.preferences]  # fmt: skip


@LAYOUTS.register("trl-prompt")
def trl_prompt(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.prompts, "tasks", "trl-prompt")
    return [{"prompt": chat(messages), "answers": list(task.answers), "id": task.id, "kind": task.kind}
            for task, messages in records.prompts]  # fmt: skip


@LAYOUTS.register("verl-rl")
def verl_rl(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.prompts, "tasks", "verl-rl")
    missing = [task.id for task, _ in records.prompts if not task.answers]
    if missing:
        raise DataError(f"verl-rl: task {missing[0]!r} has no gold answer (verl's reward_model.ground_truth)")
    single = all(len(task.answers) == 1 for task, _ in records.prompts)
    return [
        {"data_source": records.data_source or task.kind, "prompt": chat(messages), "ability": task.kind,
         "reward_model": {"style": "rule", "ground_truth": task.answers[0] if single else list(task.answers)},
         "extra_info": {"split": records.split, "index": index, "id": task.id, "question": task.question,
                        "answers": list(task.answers)}}
        for index, (task, messages) in enumerate(records.prompts)
    ]  # fmt: skip


@LAYOUTS.register("verl-sft")
def verl_sft(records: ExportRecords) -> list[dict[str, Any]]:
    _needs(records.conversations, "conversations (SFT data or episodes that answered)", "verl-sft")
    return [{"messages": chat(c.messages), "data_source": records.data_source or c.task_type,
             "extra_info": {"split": records.split, "index": index, "id": c.id}}
            for index, c in enumerate(records.conversations)]  # fmt: skip


def write_rows(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """`rows` as a Parquet file or JSON Lines (by the suffix), atomically."""
    target = Path(path)
    if target.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DataError(f"{target}: the rows do not fit one Parquet schema ({first})") from None
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp)
    elif target.suffix == ".jsonl":
        with atomic_path(target) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise DataError(f"{target}: write .parquet or .jsonl")


def export_rows(records: ExportRecords, layout: str, out: str | os.PathLike[str]) -> int:
    """Write `records` in `layout` to `out`; the number of rows written."""
    rows = LAYOUTS.get(layout, "--layout")(records)
    write_rows(rows, out)
    return len(rows)
