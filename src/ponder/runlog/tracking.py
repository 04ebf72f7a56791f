"""Experiment trackers: live views of a run's metrics (TensorBoard, Weights & Biases).

`run_dir/metrics.jsonl` (ponder.runlog.metrics_log) stays the source of truth;
plots, reports and resume read it, never a tracker. A tracker receives the same
scalars, plus what a JSON line holds badly: histograms (the RL step's advantages)
and tables of sampled episodes. The recipe's `tracking.trackers` chooses them
(ponder.config.TrackingConfig).

Weights & Biases runs offline only (files under `run_dir/wandb`; `wandb sync`
uploads them later, by hand): a training run never opens a network connection.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from ponder.extras import available, require
from ponder.registry import Registry

TENSORBOARD_DIR = "tb"
WANDB_DIR = "wandb"
WANDB_ID_FILE = "wandb-run-id"  # in WANDB_DIR: a resumed run keeps its wandb id
#: tracking.trackers -> builder(run_dir, resume_step, project, config) -> Tracker;
#: trait `package`: the module it imports (checked before a run, not at its first log line)
TRACKERS: Registry[Callable[[Path, int | None, str, dict[str, Any]], Any]] = Registry("tracker", {"package": None})
# The default of tracking.trackers: TensorBoard when ponder[tracking] is installed, else
# metrics.jsonl alone (a core install trains without it); a tracker named outright must
# be installed.
AUTO = "auto"
# A sampled episode's response in a tracker's table is cut to this many characters:
# a table is for reading a few at a glance; the trajectories hold them whole.
MAX_CELL_CHARS = 2000


class Tracker(Protocol):
    """One back-end. Steps are the trainer's steps; values are plain floats."""

    def scalars(self, step: int, values: dict[str, float], walltime: float) -> None: ...

    def histogram(self, step: int, name: str, values: np.ndarray) -> None: ...

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None: ...

    def close(self) -> None: ...


def check_trackers(names: Sequence[str]) -> None:
    """Raise ValueError for an unknown tracker name, or MissingExtra (a ValueError) for
    one whose package is not installed (before a run starts, not at its first log line)."""
    for name in names:
        if name != AUTO:
            TRACKERS.check(name, "tracking.trackers")
    for name in dict.fromkeys(names):
        package = None if name == AUTO else TRACKERS.trait(name, "package")
        if package is not None:
            require(package, "tracking", f"tracking.trackers: {name}")


def resolve_trackers(names: Sequence[str]) -> list[str]:
    """`names` with `auto` replaced by tensorboard when it is installed, else by nothing
    (one line on stderr says so); a name given twice is one tracker."""
    resolved = []
    for name in names:
        if name != AUTO:
            resolved.append(name)
        elif available("tensorboard"):
            resolved.append("tensorboard")
        else:
            print("ponder: TensorBoard is not installed: metrics go to metrics.jsonl alone "
                  "(pip install 'ponder[tracking]' adds it)", file=sys.stderr)  # fmt: skip
    return list(dict.fromkeys(resolved))


def build_trackers(
    names: Sequence[str], run_dir: Path, resume_step: int | None = None, project: str = "ponder",
    config: dict[str, Any] | None = None,
) -> list[Tracker]:  # fmt: skip
    """The trackers `names` asks for, writing under `run_dir`. `resume_step`: the
    checkpoint a resumed run continues from (TensorBoard hides later events)."""
    check_trackers(names)
    return [TRACKERS.get(name)(run_dir, resume_step, project, config or {}) for name in resolve_trackers(names)]


class TensorBoardTracker:
    """Scalars, histograms and text tables in TensorBoard event files."""

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        require("tensorboard", "tracking", "tracking.trackers: tensorboard")  # torch's writer needs it
        from torch.utils.tensorboard import SummaryWriter

        # purge_step makes TensorBoard hide events at or after it written by the
        # killed run, so a resumed run's steps are not drawn twice.
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def scalars(self, step: int, values: dict[str, float], walltime: float) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step, walltime=walltime)
        # The default flush is every 120 s; a live dashboard should not lag that much.
        self.writer.flush()

    def histogram(self, step: int, name: str, values: np.ndarray) -> None:
        if values.size:
            self.writer.add_histogram(name, values, global_step=step)
            self.writer.flush()

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.writer.add_text(name, markdown_table(columns, rows), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in offline mode: scalars, wandb.Histogram, wandb.Table."""

    def __init__(self, wandb_dir: Path, project: str, config: dict[str, Any]) -> None:
        import wandb

        wandb_dir.mkdir(parents=True, exist_ok=True)
        id_file = wandb_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        # Offline whatever the environment says (WANDB_MODE=online included); no
        # console capture and no system-metrics sampler on a 2-core training machine.
        settings = wandb.Settings(mode="offline", silent=True, console="off", x_disable_stats=True)
        self.wandb = wandb
        self.run = wandb.init(project=project, dir=str(wandb_dir.parent), id=run_id, config=config, mode="offline",
                              resume="allow", reinit="create_new", settings=settings, save_code=False)  # fmt: skip
        # (wandb.init writes into `dir`/wandb, which is WANDB_DIR.)

    def scalars(self, step: int, values: dict[str, float], walltime: float) -> None:
        self.run.log(dict(values), step=step)

    def histogram(self, step: int, name: str, values: np.ndarray) -> None:
        if values.size:
            self.run.log({name: self.wandb.Histogram(values)}, step=step)

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.run.log({name: self.wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() can return before wandb's service process has written the run's
        # last records; teardown waits for it (and ends it: one run per process).
        self.wandb.teardown()


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (TensorBoard's text plugin renders it). Model text may hold
    pipes and line breaks, which would break the table's cells: both are escaped."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        text = text[:MAX_CELL_CHARS]
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@TRACKERS.register("tensorboard", package="tensorboard")
def _tensorboard(run_dir: Path, resume_step: int | None, project: str, config: dict[str, Any]) -> Tracker:
    return TensorBoardTracker(run_dir / TENSORBOARD_DIR, resume_step)


@TRACKERS.register("wandb", package="wandb")
def _wandb(run_dir: Path, resume_step: int | None, project: str, config: dict[str, Any]) -> Tracker:
    return WandbTracker(run_dir / WANDB_DIR, project, config)
