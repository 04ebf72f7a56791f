"""Console progress for training runs and evaluations: rich bars on a terminal; off
one (a log file, nohup, CI) plain lines with the stage, count/total, rate and ETA:
one at each further 10 % of the work and, between those, at most one per
PLAIN_EVERY_S seconds (RL: one per step, as on a terminal)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


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


PLAIN_EVERY_S = 60.0  # off a terminal: a line at least this often while work advances …
PLAIN_FRACTION = 0.1  # … and at each further 10 % of it


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class PlainProgress:
    """Progress as plain lines, for a stream that is not a terminal: `label done/total
    (pct) · rate · elapsed · ETA`. A line is written at the start, whenever another
    `fraction` of the total is done or `every_s` seconds have passed since the last
    line, and at the end; never more than one per call to advance."""

    def __init__(self, label: str, total: int | None, stream: IO[str], done: int = 0,
                 every_s: float = PLAIN_EVERY_S, fraction: float = PLAIN_FRACTION,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.label, self.total, self.stream, self.clock = label, total, stream, clock
        self.every_s, self.fraction = every_s, fraction
        self.start_count = self.done = done
        self.started = self.last_time = clock()
        self.last_mark = self._mark(done)
        self._write(self.line())

    def _mark(self, done: int) -> int:
        return int(done / (self.total * self.fraction)) if self.total else 0

    def advance(self, count: int = 1, note: str = "") -> None:
        self.update(self.done + count, note)

    def update(self, done: int, note: str = "") -> None:
        self.done = done
        now, mark = self.clock(), self._mark(done)
        finished = self.total is not None and done >= self.total
        if finished or mark > self.last_mark or now - self.last_time >= self.every_s:
            self.last_mark, self.last_time = mark, now
            self._write(self.line(note))

    def line(self, note: str = "") -> str:
        elapsed = self.clock() - self.started
        parts = [f"{self.label} {self.done}/{self.total}" if self.total is not None else f"{self.label} {self.done}"]
        if self.total:
            parts[0] += f" ({self.done / self.total:.0%})"
        made = self.done - self.start_count
        if made > 0 and elapsed > 0:
            rate = made / elapsed
            parts.append(f"{rate:.2f}/s" if rate >= 1 else f"{1 / rate:.1f}s each")
        parts.append(f"elapsed {_duration(elapsed)}")
        if made > 0 and self.total is not None and self.done < self.total:
            parts.append(f"ETA {_duration((self.total - self.done) * elapsed / made)}")
        if note:
            parts.append(note)
        return " · ".join(parts)

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


@contextlib.contextmanager
def training_progress(total: int, start: int = 0, label: str = "RL steps") -> Iterator[Callable[[int, dict], None]]:
    """A progress bar over steps; yields the on_step callback that advances it."""
    console = Console(stderr=True)
    if not console.is_terminal:  # every step's line, with the count, rate and ETA of the run
        plain = PlainProgress(label, total, console.file, done=start, every_s=0.0)

        def on_plain_step(step: int, metrics: dict[str, float]) -> None:
            plain.update(step, step_summary(metrics))

        yield on_plain_step
        return
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
    console = Console(stderr=True)
    if not console.is_terminal:  # a log file, nohup, CI: plain lines, throttled
        plain = PlainProgress(label, total, console.file)
        yield lambda *_: plain.advance()
        return
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("", total=total)
        yield lambda *_: progress.advance(bar)
