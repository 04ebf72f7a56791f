"""Rich console progress for training runs."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def step_summary(metrics: dict[str, float]) -> str:
    """One line per step: reward, the first reward components, searches (where the
    agent searched), the time split."""
    components = [k for k in metrics if k.startswith("reward/") and k not in ("reward/mean", "reward/std")]
    parts = [f"reward {metrics.get('reward/mean', float('nan')):+.3f}"]
    parts += [f"{key[len('reward/'):]} {metrics[key]:.2f}" for key in components[:2]]
    if metrics.get("episode/searches", 0.0) > 0:
        parts.append(f"searches {metrics['episode/searches']:.2f}")
    parts += [f"gen {metrics.get('time/generation_s', 0.0):.0f}s", f"update {metrics.get('time/update_s', 0.0):.0f}s"]
    if "eval/reward" in metrics:
        parts.append(f"eval reward {metrics['eval/reward']:+.3f}")
    if "val/reward" in metrics:
        parts.append(f"val {metrics['val/reward']:+.3f} (best: step {metrics['val/best_step']:.0f})")
    return " · ".join(parts)


@contextlib.contextmanager
def training_progress(total: int, start: int = 0, label: str = "RL steps") -> Iterator[Callable[[int, dict], None]]:
    """A progress bar over steps; yields the on_step callback that advances it."""
    console = Console(stderr=True)
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, TextColumn("{task.description}"), console=console, transient=True) as progress:
        bar = progress.add_task("", total=total, completed=start)

        def on_step(step: int, metrics: dict[str, float]) -> None:
            progress.update(bar, completed=step, description=step_summary(metrics))
            progress.console.print(f"step {step}: {step_summary(metrics)}", highlight=False)

        yield on_step


@contextlib.contextmanager
def item_progress(label: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A transient bar for work counted in items (episodes, steps); yields advance(*_),
    which takes and ignores whatever a callback passes (a trajectory, step metrics)."""
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    console = Console(stderr=True)
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task("", total=total)
        yield lambda *_: progress.advance(bar)
