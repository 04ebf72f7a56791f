"""Per-step training metrics: a crash-safe JSONL file, mirrored to trackers.

`run_dir/metrics.jsonl` is the source of truth (plots, reports and resume read
it); the trackers (ponder.runlog.tracking: TensorBoard under `run_dir/tb`, Weights &
Biases offline under `run_dir/wandb`) are live views of the same numbers, plus
histograms and tables of sampled episodes, which only they receive.

Each line is `{"step": int, "time": float (unix seconds), <key>: value, ...}` with
flat keys whose "/" groups become TensorBoard sections ("reward/em",
"time/generation_s"). Values are floats; strings are kept in the JSON but not sent
to TensorBoard. NaN and ±inf are written as JSON `null` (fileio.dumps_strict)
because standard JSON has no NaN (json.dumps would emit the non-standard `NaN`
token that other readers reject); `read_metrics` turns `null` back into
`float("nan")`, so the sign of an infinity is lost — an infinite metric is a bug
to look at, not a value to plot.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ponder.fileio import atomic_path, dumps_strict
from ponder.runlog.tracking import TENSORBOARD_DIR, Tracker, build_trackers  # noqa: F401 (TENSORBOARD_DIR: re-exported)

METRICS_FILE = "metrics.jsonl"
RESERVED_KEYS = ("step", "time")


class MetricsLog:
    """Append-only metrics log for one run directory.

    `resume_step`: the step of the checkpoint a resumed run starts from. Lines
    after it (logged by the killed run after its last checkpoint) are removed from
    metrics.jsonl, and TensorBoard is told to hide its events after that step, so
    the resumed run's steps are not shown twice.
    `trackers`: back-end names (ponder.runlog.tracking.TRACKERS); None = TensorBoard
    when `tensorboard`, else none. `project` and `config`: the wandb run's.
    """

    def __init__(self, run_dir: str | os.PathLike[str], tensorboard: bool = True, *, resume_step: int | None = None,
                 trackers: list[str] | None = None, project: str = "ponder",
                 config: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if resume_step is not None:
            self.truncate_after(self.run_dir, resume_step)
        elif self.path.exists():
            # A line cut short by a kill would otherwise glue onto the next one.
            _drop_partial_tail(self.path)
        names = trackers if trackers is not None else (["tensorboard"] if tensorboard else [])
        self._trackers: list[Tracker] = build_trackers(names, self.run_dir, resume_step, project, config)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write one line for `step` (fsynced) and send each number to the trackers."""
        if self._file is None:
            raise RuntimeError(f"MetricsLog for {self.run_dir} is closed")
        now = time.time()
        values = {key: _clean_value(key, value) for key, value in metrics.items()}
        record = {"step": int(step), "time": now, **values}
        self._file.write(dumps_strict(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        numbers = {key: value for key, value in values.items() if isinstance(value, float)}
        for tracker in self._trackers:
            tracker.scalars(int(step), numbers, now)

    def histogram(self, step: int, name: str, values: Any) -> None:
        """A distribution (e.g. the step's advantages) to the trackers; not in the JSONL."""
        array = np.asarray(values, dtype=np.float64).ravel()
        array = array[np.isfinite(array)]
        for tracker in self._trackers:
            tracker.histogram(int(step), name, array)

    def table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A small table (e.g. sampled episodes) to the trackers; not in the JSONL."""
        for tracker in self._trackers:
            tracker.table(int(step), name, columns, rows)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def truncate_after(run_dir: str | os.PathLike[str], step: int) -> int:
        """Keep only lines with `step <= step` (and no partial last line); returns lines kept.

        The file is rewritten atomically, so a kill during the rewrite leaves the
        old file whole. A run directory without metrics.jsonl is left as it is.
        """
        path = Path(run_dir) / METRICS_FILE
        if not path.exists():
            return 0
        kept = [line for line, record in _complete_records(path) if record["step"] <= step]
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in kept)
                out.flush()
                os.fsync(out.fileno())
        return len(kept)


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete lines of `run_dir/metrics.jsonl` in file order; `null` becomes NaN.

    Raises FileNotFoundError when the file is absent and ValueError for a broken
    line that is not the last one (that is corruption, not an interrupted write).
    """
    path = Path(run_dir) / METRICS_FILE
    return [
        {key: float("nan") if value is None else value for key, value in record.items()}
        for _, record in _complete_records(path)
    ]


def _complete_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line text, parsed record) for every newline-terminated line.

    Each line is written with its newline in one write, so a line without one is
    the remains of a write cut off by a kill and is ignored.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the piece after the last newline is partial or empty
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON object ({error})") from error
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{number}: expected an object with an integer 'step'")
        records.append((line, record))
    return records


def _drop_partial_tail(path: Path) -> None:
    with open(path, "rb+") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


def _clean_value(key: str, value: Any) -> float | str:
    """A metric as a float (numpy and 0-d torch scalars included) or a string."""
    if key in RESERVED_KEYS:
        raise ValueError(f"metric key {key!r} is reserved; MetricsLog writes it itself")
    if isinstance(value, str):
        return value
    if value is None:
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"metric {key!r} must be a number or a string, got {type(value).__name__}; "
            "flatten nested values into 'group/name' keys"
        ) from error
