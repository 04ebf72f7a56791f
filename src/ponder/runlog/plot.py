"""Learning-curve PNGs from the metrics.jsonl files ponder writes (matplotlib, headless).

Every trainer logs to its own directory's metrics.jsonl: an RL run at its top and
its SFT warm-up in sft/, a demo in rl/ and sft/, a pipeline in each NN-stage/
(SFT, DPO or RL). `plot_run` finds all of them and writes each one's figures into
that directory's plots/ folder.

Which keys each figure reads is fixed here (the *_KEYS constants), so the
trainer logs exactly these names. A figure whose keys are all absent is not
written. Absent or null values are gaps in a line, never zeros.

Lines with the same step are merged first (an evaluation logged as its own line
at a training step joins that step), then training figures read the steps that
carry at least one non-"eval/" metric and the eval figure the steps that carry at
least one "eval/" metric, so sparse evaluations neither cut holes into the
training curves nor appear as unconnected dots.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI machines

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ponder.runlog.metrics_log import METRICS_FILE, RESERVED_KEYS, read_metrics  # noqa: E402

REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
EVAL_PREFIXES = ("eval/", "val/")  # held-out test curve; validation (model selection)
BEHAVIOUR_KEYS = (
    "episode/searches", "episode/turns", "episode/response_tokens",
    "collapse/tied_groups", "collapse/distinct_ratio",
)
# Reward-hacking rates (rewards/hacking.py), one panel each, in a figure of their own.
HACKING_KEYS = (
    "hacking/answer_guessing", "hacking/answer_hedging", "hacking/format_gaming", "hacking/repetition",
    "hacking/truncation_rate", "hacking/length_reward_corr", "hacking/length_gaming", "hacking/judge_unverified_rate",
    "hacking/judge_exploitation", "hacking/repeated_call",
)
OPTIM_KEYS = (
    "loss/policy", "loss/value", "optim/grad_norm", "policy/entropy", "policy/kl", "policy/clip_fraction",
    "optim/lr",
)
# Reward components that are counts, not rewards (search_cost is the number of
# searches; penalty/* count offending calls): drawn in a panel of their own, a
# count of 3 on the reward axis would squash every reward curve into its bottom.
COUNT_COMPONENTS = ("search_cost",)
COUNT_PREFIX = "penalty/"
# Panels of the SFT and DPO trainers' figures: (title, y label, keys drawn together).
SFT_PANELS = (
    ("loss", "token NLL", ("sft/loss", "sft/eval_loss")),
    ("gradient norm", "before clipping", ("sft/grad_norm",)),
    ("learning rate", "learning rate", ("sft/lr",)),
    ("tokens", "trained tokens per step", ("sft/tokens",)),
    ("replay", "replayed examples per step", ("sft/replayed",)),
    ("EWC penalty", "EWC penalty", ("sft/ewc_penalty",)),
)
DPO_PANELS = (
    ("loss", "preference loss", ("dpo/loss",)),
    ("implicit reward", "β · log(π / π_ref)", ("dpo/chosen_reward", "dpo/rejected_reward", "dpo/margin")),
    ("accuracy", "share with chosen > rejected", ("dpo/accuracy",)),
    ("gradient norm", "before clipping", ("dpo/grad_norm",)),
    ("learning rate", "learning rate", ("dpo/lr",)),
)
SERIES_LABELS = {
    "sft/loss": "train", "sft/eval_loss": "held-out", "reward/search_cost": "searches (search_cost)",
    "dpo/chosen_reward": "chosen", "dpo/rejected_reward": "rejected", "dpo/margin": "margin",
}  # fmt: skip
# Not searched for metrics.jsonl: ponder's own outputs, never runs.
SKIPPED_DIRS = ("plots", "tb", "checkpoints")
SEARCH_DEPTH = 2  # a pipeline's stages and a demo's rl/ and sft/ sit one level down
# Phases of one step, stacked bottom-up in this order; the rollout engine times
# model generation and tool/environment calls separately, so they do not overlap.
TIME_KEYS = ("time/generation_s", "time/env_s", "time/logprob_s", "time/update_s", "time/eval_s")
THROUGHPUT_KEY = "throughput/tokens_per_s"

# Axis labels for known keys; any other key is labelled with its own name.
LABELS = {
    "episode/searches": "searches per episode",
    "episode/turns": "turns per episode",
    "episode/response_tokens": "response tokens per episode",
    "collapse/tied_groups": "fraction of groups with tied rewards",
    "collapse/distinct_ratio": "distinct responses / responses",
    "reward/mean": "mean reward",
    "loss/policy": "policy loss",
    "loss/value": "value loss",
    "optim/grad_norm": "gradient norm (before clipping)",
    "policy/entropy": "entropy (nats/token)",
    "policy/kl": "KL to reference",
    "policy/clip_fraction": "fraction of tokens clipped",
    "optim/lr": "learning rate",
    "eval/reward": "eval reward",
    "eval/em": "eval exact match",
    "eval/searches_per_episode": "eval searches per episode",
}
MARKER_BELOW_POINTS = 60  # sparse curves get markers so single points stay visible
DPI = 110


def plot_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Plot every metrics.jsonl in `run_dir` and its subdirectories (up to
    SEARCH_DEPTH levels down): an RL run, an SFT or DPO stage, a demo, a pipeline.

    Each one's figures go to its own plots/ folder, or with `out_dir` to the same
    relative place under `out_dir`. Returns every path written, directory by
    directory (see plot_metrics_dir). ValueError when there is nothing to plot.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory")
    sources = _metrics_dirs(run_dir, SEARCH_DEPTH)
    if not sources:
        raise ValueError(
            f"{run_dir}: nothing to plot (no {METRICS_FILE} in it or its subdirectories; "
            "give a run, stage, demo or pipeline directory)"
        )
    written = []
    for source in sources:
        relative = source.relative_to(run_dir)
        out = Path(out_dir) / relative if out_dir is not None else source / "plots"
        title = run_dir.name if source == run_dir else f"{run_dir.name}/{relative.as_posix()}"
        written += plot_metrics_dir(source, out, title)
    if not written:
        names = ", ".join(str(source / METRICS_FILE) for source in sources)
        raise ValueError(f"{run_dir}: nothing to plot (no finite number in {names})")
    return written


def plot_metrics_dir(source: str | os.PathLike[str], out: str | os.PathLike[str], title: str) -> list[Path]:
    """Write reward.png, eval.png, behaviour.png, kinds.png, optim.png, time.png,
    sft.png, dpo.png and other.png from `source`/metrics.jsonl into `out`, each only
    where its data exists (kinds.png: reward and searches per task kind, per step;
    other.png: numeric metrics no other figure shows). Returns the paths written."""
    records = _merge_by_step(read_metrics(source))
    out = Path(out)
    train, evals = _train_records(records), _eval_records(records)
    # Built one at a time so that at most one figure is open (they hold memory).
    builders = [
        ("reward.png", lambda: _reward_figure(train, title)),
        ("eval.png", lambda: _grid_figure(evals, _present(evals, _eval_keys(evals)), f"{title}: evaluation")),
        ("behaviour.png",
         lambda: _grid_figure(train, _present(train, BEHAVIOUR_KEYS), f"{title}: behaviour")),
        ("kinds.png", lambda: _grid_figure(train, _kind_keys(train), f"{title}: per task kind")),
        ("hacking.png", lambda: _grid_figure(train, _present(train, HACKING_KEYS), f"{title}: reward hacking")),
        ("optim.png", lambda: _grid_figure(train, _present(train, OPTIM_KEYS), f"{title}: optimisation")),
        ("time.png", lambda: _time_figure(train, title)),
        ("sft.png", lambda: _panel_figure(train, SFT_PANELS, f"{title}: supervised fine-tuning")),
        ("dpo.png", lambda: _panel_figure(train, DPO_PANELS, f"{title}: preference optimisation")),
        ("other.png", lambda: _grid_figure(train, _present(train, _other_keys(train)), f"{title}: other")),
    ]
    written = []
    for name, build in builders:
        figure = build()
        if figure is not None:
            written.append(_save(figure, out / name))
    return written


def _metrics_dirs(directory: Path, depth: int) -> list[Path]:
    """`directory` if it holds metrics.jsonl, then its subdirectories' (sorted by
    name, so a pipeline's stages come in run order), `depth` levels down."""
    found = [directory] if (directory / METRICS_FILE).is_file() else []
    if depth > 0:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        for child in children:
            if child.name not in SKIPPED_DIRS:
                found += _metrics_dirs(child, depth - 1)
    return found


def _other_keys(records: list[dict[str, Any]]) -> list[str]:
    """Logged keys that no figure of plot_metrics_dir draws, sorted."""
    shown = {*BEHAVIOUR_KEYS, *OPTIM_KEYS, *TIME_KEYS, THROUGHPUT_KEY, *HACKING_KEYS}
    shown |= {key for panels in (SFT_PANELS, DPO_PANELS) for _, _, keys in panels for key in keys}
    prefixes = ("reward/", "kind/", *EVAL_PREFIXES)
    keys = {key for record in records for key in record if key not in RESERVED_KEYS}
    return sorted(key for key in keys - shown if not key.startswith(prefixes))


def compare_runs(run_dirs: dict[str, str | os.PathLike[str]], keys: str | Sequence[str],
                 out: str | os.PathLike[str], smooth: float = 0.0) -> Path:
    """Overlay each of `keys` against step for several runs (one line per label, one
    panel per key) in one PNG. A run directory without metrics.jsonl is read from its
    rl/ (a `ponder demo` run).

    `smooth` in [0, 1) is TensorBoard-style exponential smoothing; when > 0 the
    raw curve is drawn faintly behind the smoothed one. Runs without a key appear
    in that panel's legend as "(no data)"; ValueError naming the key when no run
    logged it.
    """
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    keys = [keys] if isinstance(keys, str) else list(keys)
    panels = compare_series(run_dirs, keys)
    cols = min(2, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 4.5 * rows), squeeze=False)
    for ax, (key, series) in zip(axes.flat, panels.items()):
        for label, (steps, values) in series.items():
            if not np.isfinite(values).any():
                ax.plot([], [], label=f"{label} (no data)")
            elif smooth > 0:
                (raw,) = ax.plot(steps, values, alpha=0.25, linewidth=1)
                ax.plot(steps, _ema(values, smooth), color=raw.get_color(), linewidth=2, label=label)
            else:
                _line(ax, steps, values, label=label)
        _label_axes(ax, key, title=LABELS.get(key, key))
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.tight_layout()
    return _save(fig, Path(out))


def compare_series(run_dirs: dict[str, str | os.PathLike[str]], keys: Sequence[str]
                   ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{key: {label: (steps, values)}}, what compare_runs draws; ValueError naming a
    key that no run logged."""
    records = {label: _merge_by_step(read_metrics(_metrics_home(Path(d)))) for label, d in run_dirs.items()}
    panels = {key: {label: _series(_records_for(rs, key), key) for label, rs in records.items()} for key in keys}
    for key, series in panels.items():
        if not any(np.isfinite(values).any() for _, values in series.values()):
            raise ValueError(f"none of the runs {sorted(run_dirs)} logged {key!r}")
    return panels


def _metrics_home(run_dir: Path) -> Path:
    """The directory holding a run's RL metrics: the run itself, or a demo's rl/."""
    return run_dir / "rl" if not (run_dir / METRICS_FILE).is_file() and (run_dir / "rl" / METRICS_FILE).is_file() else run_dir


STAGE_LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL", "oracle": "oracle"}


def plot_stages(results: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """Held-out reward and searches per episode for each task kind, one bar per
    demo stage (results as written by `ponder demo`), with ± one standard error."""
    stages = [name for name in STAGE_LABELS if name in results["stages"]]
    kinds = sorted({k for name in stages for k in results["stages"][name].get("by_kind", {})})
    if not stages or not kinds:
        raise ValueError("no per-kind stage results to plot")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(stages)
    for ax, metric, label in ((axes[0], "reward", "reward"), (axes[1], "searches_per_episode", "searches per episode")):
        for i, name in enumerate(stages):
            rows = [results["stages"][name]["by_kind"].get(kind, {}) for kind in kinds]
            values = [row.get(metric, float("nan")) for row in rows]
            errors = np.nan_to_num([row.get("reward_se") or 0.0 for row in rows]) if metric == "reward" else None
            positions = np.arange(len(kinds)) + (i - (len(stages) - 1) / 2) * width
            ax.bar(positions, values, width, yerr=errors, capsize=2, label=STAGE_LABELS[name])
        ax.set_xticks(np.arange(len(kinds)), kinds)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("held-out tasks by kind")
    fig.tight_layout()
    return _save(fig, Path(out))


def plot_rounds(records: list[dict[str, Any]], out: str | os.PathLike[str]) -> Path:
    """`ponder improve`'s rounds (its results.json "rounds"): held-out accuracy ± one
    standard error, the samples' pass@1 / pass@K, and their diversity, by round."""
    rounds = np.array([r["round"] for r in records], dtype=float)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    accuracy, se = (np.array([_number(r.get(key)) for r in records]) for key in ("eval/accuracy", "eval/accuracy_se"))
    axes[0].errorbar(rounds, accuracy, yerr=np.nan_to_num(se), marker="o", capsize=3)
    panels = ((axes[1], "samples/pass@", "samples on the training tasks"),
              (axes[2], "diversity/distinct_", "distinct per task (1 = all differ)"))  # fmt: skip
    for ax, prefix, ylabel in panels:
        for key in sorted({key for r in records for key in r if key.startswith(prefix)}):
            _line(ax, rounds, np.array([_number(r.get(key)) for r in records]), label=key.split("/")[-1])
        ax.legend(fontsize=8)
        ax.set_ylabel(ylabel)
    for ax, title in zip(axes, ("held-out accuracy (greedy)", "pass@k", "diversity")):
        _label_axes(ax, ax.get_ylabel() or "accuracy", title)
        ax.set_xlabel("round (0 = before any)")
    fig.tight_layout()
    return _save(fig, Path(out))


def _reward_figure(records: list[dict[str, Any]], title: str) -> plt.Figure | None:
    """Mean reward with a ±std band and each reward component on one axes; counts
    among the components (COUNT_COMPONENTS, penalty/*) on a second axes below."""
    reward_keys = {key for record in records for key in record if key.startswith("reward/")}
    components = sorted(reward_keys - {REWARD_MEAN, REWARD_STD})
    keys = _present(records, (REWARD_MEAN, *components))
    if not keys:
        return None
    counts = [key for key in keys if _is_count(key)]
    rewards = [key for key in keys if key not in counts]
    if counts:
        fig, (ax, count_ax) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(2, 1))
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    if REWARD_MEAN in rewards:
        steps, mean = _series(records, REWARD_MEAN)
        _line(ax, steps, mean, label="mean", color="black", linewidth=2)
        _, std = _series(records, REWARD_STD)
        if np.isfinite(std).any():
            ax.fill_between(steps, mean - std, mean + std, color="black", alpha=0.12, label="±1 std")
    for key in rewards:
        if key != REWARD_MEAN:
            _line(ax, *_series(records, key), label=_series_label(key), linestyle="--")
    _label_axes(ax, "reward", title=f"{title}: reward")
    axes = [ax]
    if counts:
        for key in counts:
            _line(count_ax, *_series(records, key), label=_series_label(key))
        _label_axes(count_ax, "count per episode", title="counts in the reward")
        count_ax.set_ylim(bottom=0)
        ax.set_xlabel("")  # the shared step axis is labelled once, below
        axes.append(count_ax)
    for each in axes:
        # Outside the axes: reward curves fill the whole plot area, any corner hides one.
        each.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    return fig


def _is_count(key: str) -> bool:
    name = key.removeprefix("reward/")
    return name in COUNT_COMPONENTS or name.startswith(COUNT_PREFIX)


def _series_label(key: str) -> str:
    return SERIES_LABELS.get(key, key.removeprefix("reward/"))


def _panel_figure(
    records: list[dict[str, Any]], panels: Sequence[tuple[str, str, Sequence[str]]], title: str
) -> plt.Figure | None:
    """One subplot per panel that has data (at most three per row), its present
    keys drawn together with a legend when there are several."""
    shown = [(name, ylabel, _present(records, keys)) for name, ylabel, keys in panels]
    shown = [panel for panel in shown if panel[2]]
    if not shown:
        return None
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, (name, ylabel, keys) in zip(axes.flat, shown):
        for key in keys:
            _line(ax, *_series(records, key), label=_series_label(key))
        _label_axes(ax, ylabel, title=name)
        if len(keys) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _kind_keys(records: list[dict[str, Any]]) -> list[str]:
    """kind/<kind>/searches then kind/<kind>/reward keys, grouped by metric."""
    keys = {key for record in records for key in record if key.startswith("kind/")}
    return sorted(keys, key=lambda key: (key.rsplit("/", 1)[-1] != "searches", key))


def _grid_figure(records: list[dict[str, Any]], keys: Sequence[str], title: str) -> plt.Figure | None:
    """One subplot per key, at most three per row."""
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        _line(ax, *_series(records, key))
        _label_axes(ax, LABELS.get(key, key), title=key)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _time_figure(records: list[dict[str, Any]], title: str) -> plt.Figure | None:
    """Stacked seconds per phase per step, with tokens/s on a second y axis."""
    phases = _present(records, TIME_KEYS)
    has_throughput = bool(_present(records, (THROUGHPUT_KEY,)))
    if not phases and not has_throughput:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    steps = np.array([r["step"] for r in records], dtype=float)
    width = 0.8 * (float(np.min(np.diff(np.unique(steps)))) if len(np.unique(steps)) > 1 else 1.0)
    bottom = np.zeros(len(steps))
    for key in phases:
        # A missing phase draws no bar segment; stacking treats it as 0 s so the
        # phases above it still sit on the ones that were measured.
        seconds = np.nan_to_num(_series(records, key)[1], nan=0.0)
        ax.bar(steps, seconds, width=width, bottom=bottom, label=key.removeprefix("time/"), linewidth=0)
        bottom += seconds
    _label_axes(ax, "seconds per step", title=f"{title}: time")
    handles, labels = ax.get_legend_handles_labels()
    if has_throughput:
        twin = ax.twinx()
        _line(twin, *_series(records, THROUGHPUT_KEY), color="black", label="tokens/s")
        twin.set_ylabel("generated tokens per second")
        twin.set_ylim(bottom=0)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    # Below the axes: inside, the throughput line (drawn on the twin axes, above
    # this one) would cross it.
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(labels),
              fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def _line(ax: plt.Axes, steps: np.ndarray, values: np.ndarray, **style: Any) -> None:
    """Plot with NaN as gaps; markers when there are few points or isolated ones."""
    finite = np.isfinite(values)
    neighbours = np.zeros_like(finite)
    neighbours[1:] |= finite[:-1]
    neighbours[:-1] |= finite[1:]
    if finite.sum() < MARKER_BELOW_POINTS or (finite & ~neighbours).any():
        style.setdefault("marker", "o")
        style.setdefault("markersize", 3)
    ax.plot(steps, values, **style)


def _label_axes(ax: plt.Axes, ylabel: str, title: str) -> None:
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 2.5 on a short run
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def _series(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) over `records`, NaN where `key` is absent, null or not a number."""
    steps = np.array([r["step"] for r in records], dtype=float)
    values = np.array([_number(r.get(key)) for r in records], dtype=float)
    return steps, values


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _present(records: list[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """The keys that have at least one finite value, in the given order."""
    return [key for key in keys if any(math.isfinite(_number(r.get(key))) for r in records)]


def _eval_keys(records: list[dict[str, Any]]) -> list[str]:
    return sorted({key for r in records for key in r if key.startswith(EVAL_PREFIXES)})


def _is_eval_key(key: str) -> bool:
    return key.startswith(EVAL_PREFIXES)


def _merge_by_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, later lines' keys overriding earlier ones, sorted by step."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


def _records_for(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return _eval_records(records) if _is_eval_key(key) else _train_records(records)


def _train_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if any(k not in RESERVED_KEYS and not _is_eval_key(k) for k in r)]


def _eval_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if any(_is_eval_key(k) for k in r)]


def _ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (as TensorBoard draws it); NaN stays a gap."""
    smoothed = np.full_like(values, np.nan)
    last, norm = 0.0, 0.0
    for index, value in enumerate(values):
        if not math.isfinite(value):
            continue
        last = weight * last + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        smoothed[index] = last / norm
    return smoothed


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path
