"""Read conversational datasets from JSONL, Parquet, a saved `datasets` directory
or an in-memory `datasets.Dataset`; write them as JSONL."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ponder.data.records import Conversation, DataError, LoadReport, PreferencePair, parse_rows
from ponder.fileio import write_text_atomic


def read_rows(source: Any, max_rows: int = 0) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .parquet file, a `datasets` directory, or a Dataset / list of dicts."""
    if isinstance(source, list):
        rows = source
    elif hasattr(source, "to_list"):  # datasets.Dataset
        rows = source.to_list()
    else:
        rows = _read_path(Path(os.fspath(source)))
    return rows[:max_rows] if max_rows > 0 else rows


def _read_path(path: Path) -> list[dict[str, Any]]:
    if path.is_dir():
        from datasets import load_from_disk

        try:
            return load_from_disk(str(path)).to_list()
        except (FileNotFoundError, ValueError) as err:
            raise DataError(f"{path}: not a saved `datasets` directory ({str(err).splitlines()[0]})") from err
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"{path}: unknown data format (use .jsonl, .parquet or a datasets directory)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:  # a broken file, not an unusable example: stop here
            raise DataError(f"{path}:{number}: invalid JSON ({err.msg} at column {err.colno})") from None
    return rows


def load_conversations(source: Any, max_rows: int = 0) -> tuple[list[Conversation], LoadReport]:
    """SFT conversations from `source`; unusable rows are skipped and counted."""
    return parse_rows(
        read_rows(source, max_rows), "sft", str(source) if not isinstance(source, list) else "rows"
    )


def load_preferences(source: Any, max_rows: int = 0) -> tuple[list[PreferencePair], LoadReport]:
    """Preference pairs from `source`; unusable rows are skipped and counted."""
    what = str(source) if not isinstance(source, list) else "rows"
    return parse_rows(read_rows(source, max_rows), "preference", what)


def write_jsonl(path: str | os.PathLike[str], records: list[Conversation] | list[PreferencePair]) -> None:
    """One JSON object per line, atomically."""
    text = "".join(json.dumps(record.to_row(), ensure_ascii=False) + "\n" for record in records)
    write_text_atomic(Path(path), text)
