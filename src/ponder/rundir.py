"""Output directories are never silently mixed or overwritten.

A command that writes a run (train, demo, pipeline, eval) claims its directory
first: a missing or empty directory is used; one that already holds something is
refused unless the user says --overwrite (it is then removed, but only when it is
a ponder run, never an unrelated folder) or, where the command can continue a
run, --resume.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# What ponder writes at the top of a run, stage or evaluation directory.
MARKERS = (
    "recipe.yaml", "results.json", "metrics.jsonl", "metrics.json", "trajectories.parquet",
    "checkpoints", "done.json", "ponder.json", "rl", "sft",
)  # fmt: skip


class RunDirError(ValueError):
    """The output directory cannot be used as asked; the message says what to do."""


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds something ponder wrote (a pipeline's NN-stage folders included)."""
    if any((path / marker).exists() for marker in MARKERS):
        return True
    return any(is_run_dir(stage) for stage in path.glob("[0-9][0-9]-*") if stage.is_dir())


def claim_run_dir(path: str | Path, overwrite: bool = False, can_resume: bool = False, create: bool = True) -> Path:
    """Make `path` ready for a new run and return it.

    Raises RunDirError when it holds anything and overwrite is False (naming
    --resume when the command has it), or when overwrite would delete a folder that
    is not a ponder run. create=False only checks (nothing is removed or made), so
    a command can refuse before its work and claim the directory after it.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path}: exists and is not a directory; choose another --out")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            resume = "--resume to continue it, " if can_resume else ""
            raise RunDirError(
                f"{path}: already holds {'a run' if is_run_dir(path) else 'files'}; pass {resume}"
                "--overwrite to replace it, or choose another --out"
            )
        if not is_run_dir(path):
            raise RunDirError(f"{path}: not a ponder run directory; refusing to delete it for --overwrite")
        if create:
            shutil.rmtree(path)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def require_run_dir(path: str | Path, needs: tuple[str, ...], what: str) -> Path:
    """`path` for --resume: it must exist and hold one of `needs` (relative paths)."""
    path = Path(path)
    if not any((path / need).exists() for need in needs):
        raise RunDirError(f"{path}: nothing to resume (no {' or '.join(needs)}); start {what}")
    return path
