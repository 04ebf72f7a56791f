"""Output directories are never silently mixed or overwritten.

A command that writes a run (train, demo, pipeline, eval) claims its directory
first: a missing or empty directory is used; one that already holds something is
refused unless the user says --overwrite (it is then removed, but only when it is
a ponder run, never an unrelated folder) or, where the command can continue a
run, --resume.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

# What ponder writes at the top of a run, stage or evaluation directory.
MARKERS = (
    "recipe.yaml", "results.json", "metrics.jsonl", "metrics.json", "trajectories.parquet",
    "checkpoints", "done.json", "ponder.json", "rl", "sft", "adapters.json",
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


# Files that mean a run holds finished work: a sealed checkpoint, a saved adapter or
# model (its ponder.json manifest), a finished pipeline stage.
WORK_MARKERS = ("checksums.json", "ponder.json", "done.json")


@contextlib.contextmanager
def discard_on_error(path: Path, fresh: bool = True) -> Iterator[Path]:
    """Run a command in a freshly claimed `path`; when it fails with an error before
    anything of value is saved (bad tasks, a missing env, a broken model), the half-made
    directory is removed, so a bad input leaves nothing behind. Work already saved, an
    interrupt (Ctrl-C, SIGTERM) and a resumed run's directory are always kept."""
    try:
        yield path
    except Exception:
        if fresh and path.is_dir() and not any(any(path.rglob(m)) for m in WORK_MARKERS):
            shutil.rmtree(path, ignore_errors=True)
        raise


def require_run_dir(path: str | Path, needs: tuple[str, ...], what: str) -> Path:
    """`path` for --resume: it must exist and hold one of `needs` (relative paths)."""
    path = Path(path)
    if not any((path / need).exists() for need in needs):
        raise RunDirError(f"{path}: nothing to resume (no {' or '.join(needs)}); start {what}")
    return path


# Recipe keys a resumed run may change: how long it runs and how often it saves or
# evaluates. Anything else (LR, LoRA rank, reward weights, seeds …) would make the
# continued run a different experiment from the one its checkpoints belong to.
RESUMABLE_KEYS = ("train.steps", "train.save_every", "train.eval_every", "train.eval_episodes", "train.out",
                  "train.stop_grace_s")  # fmt: skip


def recipe_changes(saved: dict, new: dict, allowed: tuple[str, ...] = RESUMABLE_KEYS) -> list[str]:
    """Dotted keys whose values differ between two recipes (as nested dicts), except `allowed`."""
    changes: list[str] = []

    def walk(a: object, b: object, key: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for name in sorted(set(a) | set(b)):
                walk(a.get(name), b.get(name), f"{key}.{name}" if key else name)
        elif a != b and key not in allowed:
            changes.append(f"{key}: {a!r} -> {b!r}")

    walk(saved, new, "")
    return changes


def check_resume_recipe(saved: dict, new: dict, allow_change: bool) -> None:
    """Refuse to resume with a changed recipe (one line naming the first change)."""
    changes = recipe_changes(saved, new)
    if changes and not allow_change:
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        raise RunDirError(f"--resume with a changed recipe: {changes[0]}{more}; only "
                          f"{', '.join(RESUMABLE_KEYS)} may change, or pass --allow-recipe-change")  # fmt: skip
