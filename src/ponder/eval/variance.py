"""Harness variance: the same evaluation repeated over sampling seeds.

One evaluation's standard error (reward_se) says how far its mean would move with
other tasks and other samples. Repeating it on the same held-out tasks with seeds
seed, seed+1, … shows how far the mean moves with the sampling seed alone: the spread
(the sample standard deviation of the repeats' means, their min and max). Two
evaluations that differ by less than about 2√2 × the spread (their difference at two
standard deviations) differ by no more than the harness's own noise. Under greedy
decoding (eval.temperature 0) the seed changes nothing and the spread is 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ponder.config import Recipe
from ponder.eval.metrics import mean
from ponder.eval.runner import EvalInputError, EvalResult, evaluate, save_result, trained_weights
from ponder.fileio import write_json_atomic
from ponder.models import Policy, load_policy
from ponder.types import Trajectory

REPEATS_DIR = "repeats"  # repeats after the first: REPEATS_DIR/seed-S/ (the first is the run's own files)


@dataclass
class RepeatSpread:
    """The repeats of one evaluation: per repeat its seed, mean and standard error."""

    seeds: list[int]
    means: list[float]
    ses: list[float]

    @property
    def mean(self) -> float:
        return mean(self.means)

    @property
    def std(self) -> float:
        """The sample standard deviation of the repeats' means (0 for one repeat)."""
        n = len(self.means)
        if n < 2:
            return 0.0
        centre = self.mean
        return math.sqrt(sum((value - centre) ** 2 for value in self.means) / (n - 1))

    @property
    def low(self) -> float:
        return min(self.means)

    @property
    def high(self) -> float:
        return max(self.means)

    @property
    def se(self) -> float:
        """The standard error of one run: the repeats' mean reward_se (finite ones)."""
        return mean([value for value in self.ses if value == value])

    @property
    def noise(self) -> float:
        """2√2 × spread: two evaluations' difference at two standard deviations of the seed noise."""
        return 2 * math.sqrt(2) * self.std

    def to_dict(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "means": self.means, "ses": self.ses, "mean": self.mean, "std": self.std,
                "min": self.low, "max": self.high, "se": self.se, "noise": self.noise}  # fmt: skip


def repeat_spread(seeds: Sequence[int], means: Sequence[float], ses: Sequence[float]) -> RepeatSpread:
    """The spread of repeats given per repeat its seed, mean and standard error."""
    if not (len(seeds) == len(means) == len(ses)) or not means:
        raise ValueError(f"repeat_spread: want one seed, mean and se per repeat, got {len(seeds)}, {len(means)}, "
                         f"{len(ses)}")  # fmt: skip
    return RepeatSpread(list(seeds), [float(m) for m in means], [float(s) for s in ses])


def spread_reading(spread: RepeatSpread, greedy: bool = False) -> str:
    """One line: the spread beside one run's standard error, and what it means for a gain."""
    if len(spread.means) < 2:
        return f"one repeat: se {spread.se:.3f}; give --repeats 2 or more for the spread across seeds"
    head = f"spread {spread.std:.3f} (min {spread.low:.3f}, max {spread.high:.3f}) vs se {spread.se:.3f}"
    if greedy:
        return f"{head}: greedy decoding (eval.temperature 0), the seed changes no episode"
    return (f"{head}: a gain below ~{spread.noise:.3f} is within harness noise (2√2 × spread, "
            "two evaluations' difference at 2 sd)")  # fmt: skip


def seeded(recipe: Recipe, offset: int) -> Recipe:
    """The recipe with rollout.seed moved by `offset` (the evaluation's sampling seed)."""
    return replace(recipe, rollout=replace(recipe.rollout, seed=recipe.rollout.seed + offset))


def evaluate_repeats(
    recipe: Recipe, repeats: int, policy: Policy | None = None,
    on_episode_done: Callable[[Trajectory], None] | None = None,
) -> list[EvalResult]:  # fmt: skip
    """`evaluate` `repeats` times on the same tasks, sampling seeds rollout.seed,
    rollout.seed+1, …, with one loaded policy."""
    if repeats < 1:
        raise EvalInputError(f"--repeats must be at least 1, got {repeats}")
    loaded = policy is None
    if policy is None:
        model = recipe.model
        policy = load_policy(model.name, model.dtype, model.device, model.rope_scaling)
    results = [evaluate(seeded(recipe, offset), policy, on_episode_done) for offset in range(repeats)]
    if loaded:  # as `evaluate` records when it loads the model itself
        for result in results:
            result.metrics.update(trained_weights(recipe.model.name))
    return results


def spread_of(results: Sequence[EvalResult], recipe: Recipe, metric: str = "reward") -> RepeatSpread:
    seeds = [recipe.rollout.seed + offset for offset in range(len(results))]
    return repeat_spread(seeds, [r.metrics[metric] for r in results], [r.metrics.get(f"{metric}_se", math.nan)
                                                                       for r in results])  # fmt: skip


def save_repeats(results: Sequence[EvalResult], recipe: Recipe, out: str | Path) -> RepeatSpread:
    """The first repeat as `ponder eval` writes it (trajectories.parquet, metrics.json
    with the spread under `repeats`, recipe.yaml) in `out`, each later one in
    out/repeats/seed-S/, and out/repeats.json; the spread."""
    out = Path(out)
    spread = spread_of(results, recipe)
    summary = {**spread.to_dict(), "reading": spread_reading(spread, recipe.eval.temperature == 0)}
    results[0].metrics["repeats"] = summary
    save_result(results[0], recipe, out)
    for offset, result in enumerate(results[1:], 1):
        save_result(result, seeded(recipe, offset), out / REPEATS_DIR / f"seed-{recipe.rollout.seed + offset}")
    write_json_atomic(out / "repeats.json", summary)
    return spread


def repeats_table(spread: RepeatSpread, title: str) -> Any:
    """Per repeat its seed, mean reward and standard error; then the spread's row."""
    from rich.table import Table

    table = Table(title=title, show_edge=False)
    for header in ("seed", "reward", "se"):
        table.add_column(header, justify="right")
    for seed, value, se in zip(spread.seeds, spread.means, spread.ses):
        table.add_row(str(seed), f"{value:.3f}", f"{se:.3f}")
    table.add_section()
    table.add_row("mean", f"{spread.mean:.3f}", f"{spread.se:.3f}", style="bold")
    table.add_row("spread (sd)", f"{spread.std:.3f}", "")
    table.add_row("min / max", f"{spread.low:.3f} / {spread.high:.3f}", "")
    return table
