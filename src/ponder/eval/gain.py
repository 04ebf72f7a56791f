"""Did a stage help? The reward gain between two evaluations of the same held-out
tasks, pooled over runs (seeds), with its standard error.

Both evaluations score the same tasks, so the gain is a paired difference; the
unpaired standard error sqrt(se_before² + se_after²) is reported next to it as
the conservative figure (it ignores that the same tasks were asked twice). Runs
are pooled by task (stage_gain): seeds evaluated on the same held-out tasks are
not independent samples of them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Group
from rich.table import Table

from ponder.config import load_recipe
from ponder.eval.metrics import mean, standard_error
from ponder.rewards.format import action_kind
from ponder.types import Trajectory, load_trajectories

# Table captions, one line each so they wrap nowhere in 80 columns.
GAIN_CAPTION = (
    "n: tasks; runs pooled by averaging each task over them\n"
    "se paired: of the per-task differences\nse unpaired: √(se before² + se after²), conservative"
)
SEARCH_CAPTION = (
    "≥ 1, ≥ 2: share of episodes that searched at least once, twice\n"
    "needed: searches made that its oracle makes too\n"
    "extra: searches beyond those"
)


@dataclass
class Gain:
    """after − before over n paired episodes."""

    n: int
    before: float
    after: float
    gain: float
    se_paired: float
    se_unpaired: float

    @property
    def z(self) -> float:
        """Gain in units of the conservative (unpaired) standard error."""
        return self.gain / self.se_unpaired if self.se_unpaired > 1e-12 else float("nan")


def paired_gain(before: list[float], after: list[float]) -> Gain:
    """Gain of `after` over `before`, where before[i] and after[i] score the same task."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain needs equal lengths, got {len(before)} and {len(after)}")
    differences = [a - b for a, b in zip(after, before)]
    unpaired = math.sqrt(standard_error(before) ** 2 + standard_error(after) ** 2)
    return Gain(len(before), mean(before), mean(after), mean(differences), standard_error(differences), unpaired)


@dataclass
class StagePair:
    """One run's episodes of two stages, matched by task id, with each task's kind and
    the number of searches its oracle makes (the searches it needs)."""

    before: list[Trajectory]
    after: list[Trajectory]
    kinds: list[str]
    needed: list[int] | None = None
    # what identifies the `before` evaluation: runs that reuse one warm-up (--sft-from)
    # carry copies of its evaluation, the same episodes, counted once when pooled;
    # "" = this pair's own
    before_source: str = ""


Scoring = str | Mapping[str, float] | None  # one reward component, or weights over components


def scored_by(trajectories: list[Trajectory], metric: Scoring, source: str) -> list[Trajectory]:
    """The episodes with one reward component (e.g. math's verified `correct`, logged
    at any weight) in place of the total reward, or with a weighted sum of components
    ({name: weight}, e.g. another recipe's reward: reward_weights), so every gain
    table compares it; `metric` None: unchanged. An episode without a component that
    has a weight is an error naming `source` and the components it has, never a
    silent 0."""
    if metric is None:
        return trajectories
    weights = {metric: 1.0} if isinstance(metric, str) else {k: w for k, w in metric.items() if w != 0}
    scored = []
    for trajectory in trajectories:
        missing = [name for name in weights if name not in trajectory.breakdown]
        if missing:
            have = ", ".join(sorted(trajectory.breakdown)) or "none"
            raise ValueError(f"{source}: episode of task '{trajectory.task_id}' has no reward component "
                             f"'{missing[0]}' (it has: {have})")  # fmt: skip
        total = sum(weight * trajectory.breakdown[name] for name, weight in weights.items())
        scored.append(replace(trajectory, reward=total))
    return scored


def reward_weights(recipe_path: str | Path) -> dict[str, float]:
    """The reward weights a recipe pays ({component: weight}: its environment's defaults
    updated by reward.terms, the shaping penalties and the judge), for scored_by: the
    runs of a shaped variant read by the shipped recipe's reward."""
    from ponder.rewards import CompositeReward
    from ponder.wiring import build_env

    recipe = load_recipe(recipe_path)
    with build_env(recipe) as spec:
        weights = CompositeReward.from_config(recipe.reward, spec.rewards, spec.reward_weights).weights
    if recipe.reward.judge.weight != 0:
        weights["judge"] = recipe.reward.judge.weight
    return weights


def load_stage_pair(run_dir: str | Path, before: str = "sft", after: str = "rl", metric: Scoring = None,
                    versus: str | Path | None = None) -> StagePair:
    """Read RUN_DIR/eval-<before>.parquet and eval-<after>.parquet (written by `ponder
    demo`); `metric` scores them by one reward component or weights (scored_by).
    `versus`: read the before stage from that run instead (a control: the same seed
    with one ingredient taken away), so the gain is RUN_DIR's over the control's."""
    from ponder.wiring import build_env

    run_dir = Path(run_dir)
    paths = [Path(versus or run_dir) / f"eval-{before}.parquet", run_dir / f"eval-{after}.parquet"]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `ponder demo --out {path.parent}` first")
    first, second = (scored_by(load_trajectories(p), metric, str(p)) for p in paths)
    by_task = {t.task_id: t for t in second}
    if sorted(by_task) != sorted(t.task_id for t in first):
        raise ValueError(f"{paths[0]} and {paths[1]} evaluated different tasks")
    recipe = load_recipe(run_dir / "recipe.yaml")
    with build_env(recipe) as spec:
        tasks = {t.id: t for t in spec.split(recipe.eval.split)}  # the split the recipe evaluated
    missing = sorted({t.task_id for t in first} - set(tasks))
    if missing:
        raise ValueError(f"{run_dir}: task '{missing[0]}' is not in the recipe's {recipe.eval.split} split")
    kinds = [tasks[t.task_id].kind for t in first]
    needed = [sum(action_kind(a) == "search" for a in tasks[t.task_id].oracle_actions) for t in first]
    source = hashlib.sha256(paths[0].read_bytes()).hexdigest()  # a copied evaluation hashes alike
    return StagePair(first, [by_task[t.task_id] for t in first], kinds, needed, source)


def load_evaluation(path: str | Path, metric: Scoring = None) -> tuple[str, list[Trajectory]]:
    """(content hash, episodes) of an evaluation: a parquet file or a `ponder eval`
    output directory (its trajectories.parquet); `metric` as in load_stage_pair."""
    path = Path(path)
    path = path / "trajectories.parquet" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; write it with `ponder eval --out DIR`")
    return hashlib.sha256(path.read_bytes()).hexdigest(), scored_by(load_trajectories(path), metric, str(path))


def paired_by_task(before: list[Trajectory], after: list[Trajectory]) -> Gain:
    """The reward gain of `after` over `before`, episodes matched by task id."""
    by_task = {t.task_id: t for t in after}
    matched = [(b, by_task[b.task_id]) for b in before if b.task_id in by_task]
    return paired_gain([_reward(b) for b, _ in matched], [_reward(a) for _, a in matched])


def verdict(gain: Gain, before: str = "SFT", after: str = "RL") -> str:
    """One line: the paired gain, its standard error, and whether it is more than noise."""
    head = f"{after} − {before}: {gain.gain:+.3f} (paired se {gain.se_paired:.3f}, {gain.n} tasks)"
    if not gain.se_paired > 0:
        return f"{head}: no difference to judge"
    z = gain.gain / gain.se_paired
    if z > 2:
        return f"{head}: {after} helped on this run (gain > 2 se)"
    if z < -2:
        return f"{head}: {after} hurt on this run (loss > 2 se)"
    return f"{head}: within noise on this run (|gain| ≤ 2 se)"


def stage_gain(
    pairs: list[StagePair], kind: str | None = None, more_before: Sequence[tuple[str, list[Trajectory]]] = ()
) -> Gain:
    """Pooled reward gain over every run's episodes (optionally one task kind only),
    clustered by task: each task's before and after rewards are first averaged over
    the evaluations of it, then paired over tasks (n counts tasks). Runs that share a
    warm-up (`--sft-from`) share its evaluation (same `before_source`): it counts once
    per task, not once per run, which would understate the standard error.
    `more_before`: further (source, episodes) evaluations of the before model (other
    sampling seeds; one episode or a group per task), each episode one more sample in
    its task's before. One run: the plain paired gain."""
    befores: dict[str, dict[str, list[float]]] = {}  # task -> source -> its episodes' rewards
    afters: dict[str, list[float]] = {}
    for index, pair in enumerate(pairs):
        source = pair.before_source or f"pair-{index}"
        for b, a, k in zip(pair.before, pair.after, pair.kinds):
            if kind is None or k == kind:
                befores.setdefault(b.task_id, {})[source] = [_reward(b)]
                afters.setdefault(b.task_id, []).append(_reward(a))
    for source, episodes in more_before:
        for episode in episodes:  # several per task where the evaluation sampled a group
            if episode.task_id in afters:  # a task the runs evaluated, of the kind asked
                befores[episode.task_id].setdefault(source, []).append(_reward(episode))
    tasks = sorted(afters)
    before = [mean([r for rewards in befores[t].values() for r in rewards]) for t in tasks]
    return paired_gain(before, [mean(afters[t]) for t in tasks])


def searches_by_kind(pairs: list[StagePair], stage: str, at_least: int | None = None) -> dict[str, float]:
    """Mean searches per episode for each task kind at `stage` ('before' or 'after'),
    or, with `at_least`, the share of its episodes that searched at least that often."""
    counts: dict[str, list[float]] = {}
    for pair in pairs:
        for trajectory, kind in zip(getattr(pair, stage), pair.kinds):
            searches = trajectory.metrics.get("searches", 0.0)
            counts.setdefault(kind, []).append(searches if at_least is None else float(searches >= at_least))
    return {kind: mean(values) for kind, values in sorted(counts.items())}


def search_split(pairs: list[StagePair], stage: str) -> dict[str | None, tuple[float, float]]:
    """Per task kind (and None for all), the mean per episode at `stage` of the needed
    searches made, min(searches, needed), and of the extra ones, max(0, searches − needed):
    RL should cut the second without cutting the first."""
    rows: dict[str | None, list[tuple[float, float]]] = {}
    for pair in pairs:
        if pair.needed is None:
            raise ValueError("search_split needs each task's needed searches (load_stage_pair gives them)")
        for trajectory, kind, need in zip(getattr(pair, stage), pair.kinds, pair.needed):
            searches = trajectory.metrics.get("searches", 0.0)
            split = (min(searches, need), max(0.0, searches - need))
            for key in (kind, None):
                rows.setdefault(key, []).append(split)
    return {kind: (mean([m for m, _ in v]), mean([e for _, e in v])) for kind, v in rows.items()}


SEARCH_COUNTS = ("0", "1", "2", "≥3")


def reward_by_searches(pairs: list[StagePair], stage: str) -> dict[str, dict[str, tuple[float, float]]]:
    """Per task kind at `stage`: for 0, 1, 2 and 3 or more searches, (share of the
    kind's episodes that searched that often, their mean reward; NaN when none did).
    Where RL moves episodes from a count that pays to one that does not, it shows."""
    rows: dict[str, dict[str, list[float]]] = {}
    for pair in pairs:
        for trajectory, kind in zip(getattr(pair, stage), pair.kinds):
            count = SEARCH_COUNTS[min(int(trajectory.metrics.get("searches", 0.0)), 3)]
            rows.setdefault(kind, {c: [] for c in SEARCH_COUNTS})[count].append(_reward(trajectory))
    out = {}
    for kind, by_count in sorted(rows.items()):
        total = sum(len(v) for v in by_count.values())
        out[kind] = {c: (len(v) / total, mean(v) if v else float("nan")) for c, v in by_count.items()}
    return out


def _reward(trajectory: Trajectory) -> float:
    return trajectory.reward if trajectory.reward is not None else 0.0


def gain_table(pairs: list[StagePair], before: str, after: str,
               more_before: Sequence[tuple[str, list[Trajectory]]] = ()) -> Group:
    """Three tables, stacked so that each fits in 80 columns: the reward gain (all
    tasks, then per kind; `more_before` as in stage_gain), then per kind and stage
    the searches per episode, the share of episodes that searched at least once /
    twice, and the needed and extra searches per episode (search_split), then the
    episodes by searches made (reward_by_searches); the last two only where an
    episode searched (an environment without a search tool has nothing to show)."""
    kinds = sorted({k for pair in pairs for k in pair.kinds})
    reward = _reward_table(f"{after} vs {before}: {len(pairs)} run(s), paired by task", "tasks", before, after)
    reward.add_column("gain/se", justify="right")
    reward.caption = GAIN_CAPTION + "\ngain/se: gain over the unpaired se"
    for kind in [None, *kinds]:
        g = stage_gain(pairs, kind, more_before)
        reward.add_row(kind or "all", *_gain_cells(g), _number(g.z))
    if not _searched(pairs):
        return Group(reward)
    searches = Table(title=f"searches per episode, {before} and {after}", caption=SEARCH_CAPTION)
    for header in ("tasks", "stage", "searches", "≥ 1", "≥ 2", "needed", "extra"):
        searches.add_column(header, justify="left" if header in ("tasks", "stage") else "right")
    everything = [StagePair(p.before, p.after, ["all"] * len(p.kinds), p.needed) for p in pairs]
    for kind, group in [("all", everything)] + [(kind, pairs) for kind in kinds]:
        for stage, name in (("before", before), ("after", after)):
            shares = [searches_by_kind(group, stage, n)[kind] for n in (None, 1, 2)]
            needed, extra = search_split(group, stage)[kind]
            cells = [f"{value:.2f}" for value in (*shares, needed, extra)]
            searches.add_row(kind if stage == "before" else "", name, *cells, end_section=stage == "after")
    return Group(reward, searches, _by_searches_table(pairs, before, after))


def _by_searches_table(pairs: list[StagePair], before: str, after: str) -> Table:
    """Per kind and stage, each search count's share of episodes and mean reward."""
    table = Table(title=f"episodes by searches made: share, mean reward; {before} and {after}")
    for header in ("tasks", "stage", *SEARCH_COUNTS):
        table.add_column(header, justify="left" if header in ("tasks", "stage") else "right")
    stages = {name: reward_by_searches(pairs, stage) for stage, name in (("before", before), ("after", after))}
    for kind in stages[before]:
        for name in (before, after):
            cells = [f"{share:4.0%} {value:+.2f}" if share else "–" for share, value in stages[name][kind].values()]
            table.add_row(kind if name == before else "", name, *cells, end_section=name == after)
    return table


def runs_table(pairs: list[StagePair], names: list[str], before: str, after: str,
               more_before: Sequence[tuple[str, list[Trajectory]]] = ()) -> Group:
    """Two tables, one row per run in each: its reward gain, then per task kind its
    searches per episode before → after."""
    reward = _reward_table(f"{after} vs {before}, per run, paired by task", "run", before, after)
    reward.caption = GAIN_CAPTION
    kinds = sorted({k for pair in pairs for k in pair.kinds})
    searches = Table(title=f"searches per episode by task kind, {before} → {after}")
    for header in ("run", *kinds):
        searches.add_column(header, justify="left" if header == "run" else "right")
    for name, pair in zip(names, pairs):
        reward.add_row(name, *_gain_cells(stage_gain([pair], None, more_before)))
    if not _searched(pairs):
        return Group(reward)
    for name, pair in zip(names, pairs):
        before_s, after_s = searches_by_kind([pair], "before"), searches_by_kind([pair], "after")
        searches.add_row(name, *[f"{before_s[k]:.2f} → {after_s[k]:.2f}" if k in after_s else "" for k in kinds])
    return Group(reward, searches)


def _searched(pairs: list[StagePair]) -> bool:
    return any(t.metrics.get("searches", 0.0) for p in pairs for t in (*p.before, *p.after))


def _reward_table(title: str, first: str, before: str, after: str) -> Table:
    """The reward columns both tables share; headers on two lines keep it narrow."""
    table = Table(title=title)
    for header in (first, "n", before, after, "gain", "se\npaired", "se\nunpaired"):
        table.add_column(header, justify="left" if header == first else "right")
    return table


def _gain_cells(g: Gain) -> list[str]:
    return [str(g.n), *[_number(value) for value in (g.before, g.after, g.gain, g.se_paired, g.se_unpaired)]]


def _number(value: float) -> str:
    return f"{value:.3f}"
