"""Predicted against measured for a finished run (`ponder estimate --versus RUN_DIR`).

What a run records: its recipe (recipe.yaml); per RL step (metrics.jsonl, or rl/ of a
demo) the seconds of generation, no-grad passes and update, the process's peak RSS
as the rollouts end and after the update (and torch's peak GPU allocation on a GPU),
and the episodes' mean prompt, response and generated tokens; a demo's results.json
adds each stage's seconds and the process's peaks as each stage ends. The estimate
is made for the tokens the run's episodes had (where it logged them), so the rows
compare the device model, not the token caps.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.estimate.recipe import Estimate, Tokens
from ponder.estimate.report import duration, size

# A stage of a run -> the estimate's peaks resident in it.
STAGE_PEAKS = {"sft": ("peak_sft",), "rollout": ("peak_rollout",), "rl": ("peak_rollout", "peak_update"),
               "eval": ("peak_eval",)}
GPU_CONTEXT_KEY = "runtime"  # torch's allocator does not see the CUDA context
# The order `ponder demo` runs its stages in (results.json keeps its keys sorted).
DEMO_ORDER = ("eval:oracle", "eval:base", "reuse", "sft", "eval:sft", "rl", "eval:rl")


def _in_order(names: Any) -> list[str]:
    return sorted(names, key=lambda name: DEMO_ORDER.index(name) if name in DEMO_ORDER else len(DEMO_ORDER))


@dataclass
class Measured:
    """What one run directory recorded, in the estimate's keys: seconds (times),
    bytes of process peaks by the end of a stage (peaks, in the order the stages
    ran), and the episodes' tokens."""

    run_dir: Path
    recipe_path: Path
    times: dict[str, float] = field(default_factory=dict)
    peaks: list[tuple[str, str, float]] = field(default_factory=list)  # (label, stage so far, bytes)
    gpu_peaks: list[tuple[str, str, float]] = field(default_factory=list)
    tokens: Tokens | None = None


@dataclass
class Row:
    label: str
    predicted: float
    measured: float
    unit: str  # "s" or "B"

    @property
    def error_pct(self) -> float | None:
        return None if not self.measured else 100.0 * (self.predicted - self.measured) / self.measured


def _median(rows: list[dict[str, Any]], *keys: str) -> float | None:
    values = [sum(float(row.get(key, 0.0)) for key in keys) for row in rows if keys[0] in row]
    return statistics.median(values) if values else None


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    from ponder.runlog.metrics_log import read_metrics

    for folder in (run_dir, run_dir / "rl"):
        if (folder / "metrics.jsonl").is_file():
            return [row for row in read_metrics(folder) if "time/update_s" in row]
    return []


def _run_tokens(run_dir: Path, steps: list[dict[str, Any]]) -> Tokens | None:
    """The episodes' mean length and generated tokens: the RL steps' logged means
    (response and generated tokens) with the prompt's length from the run's saved
    evaluation episodes; those episodes alone when no step logged them."""
    from ponder.types import load_trajectories

    order = {name: i for i, name in enumerate(("eval-base.parquet", "eval-sft.parquet", "eval-rl.parquet"))}
    saved = sorted(run_dir.glob("eval-*.parquet"), key=lambda path: order.get(path.name, -1))
    episodes = load_trajectories(saved[-1]) if saved else []
    prompt = statistics.mean(len(t.prompt_ids) for t in episodes) if episodes else 0.0
    have = [row for row in steps if "episode/response_tokens" in row and "episode/generated_tokens" in row]
    if have:
        response = statistics.mean(row["episode/response_tokens"] for row in have)
        decode = statistics.mean(row["episode/generated_tokens"] for row in have)
    elif episodes:
        response = statistics.mean(len(t.response_ids) for t in episodes)
        decode = statistics.mean(sum(t.loss_mask) for t in episodes)
    else:
        return None
    where = "the run's RL steps" if have else f"the episodes of {saved[-1].name}"
    if saved and have:
        where += f" (prompts: {saved[-1].name})"
    return Tokens(max(round(prompt + response), 1), max(round(decode), 1), f"{where}, means")


def read_run(run_dir: str | Path) -> Measured:
    """A run directory's measurements; ValueError when it holds no recipe.yaml."""
    run_dir = Path(run_dir)
    if not (run_dir / "recipe.yaml").is_file():
        raise ValueError(f"{run_dir}: not a ponder run directory (no recipe.yaml)")
    measured = Measured(run_dir, run_dir / "recipe.yaml")
    steps = _steps(run_dir)
    measured.tokens = _run_tokens(run_dir, steps)
    for key, metric in (("rollout_s", ("time/generation_s",)), ("no_grad_s", ("time/logprob_s", "time/teacher_s")),
                        ("update_s", ("time/update_s",))):  # fmt: skip
        value = _median(steps, *metric)
        if value is not None:
            measured.times[key] = value
    before = ["sft"] if (run_dir / "sft").is_dir() else []  # `ponder train`: its warm-up ran first
    if (run_dir / "results.json").is_file():
        results = json.loads((run_dir / "results.json").read_text())
        _read_results(results, measured)
        ran = [name for name in _in_order(results.get("timing_s", {})) if name not in ("eval:oracle", "total")]
        before = [name.split(":")[0] for name in (ran[: ran.index("rl")] if "rl" in ran else ran)]
    _step_peaks(steps, [stage for stage in before if stage in STAGE_PEAKS], measured)
    return measured


def _step_peaks(steps: list[dict[str, Any]], before: list[str], measured: Measured) -> None:
    """The RL steps' logged peaks: the process's as the rollouts end and after each
    update (RSS), torch's GPU allocation; the highest over the run."""
    for label, metric, stages, into in (
        ("process peak as the RL rollouts end", "memory/rollout_peak_gb", [*before, "rollout"], measured.peaks),
        ("process peak of the RL steps", "memory/peak_gb", [*before, "rl"], measured.peaks),
        ("GPU peak of the RL steps", "memory/gpu_peak_gb", [*before, "rl"], measured.gpu_peaks),
    ):  # fmt: skip
        values = [row[metric] for row in steps if row.get(metric)]
        if values:
            into.append((label, ",".join(stages), max(values) * 1e9))


def _read_results(results: dict[str, Any], measured: Measured) -> None:
    """A demo's stage seconds and per-stage peaks (results.json)."""
    timing = results.get("timing_s", {})
    if "sft" in timing:
        measured.times["sft_s"] = timing["sft"]
    if "rl" in timing:
        measured.times["rl_s"] = timing["rl"]
    evals = [value for name, value in timing.items() if name.startswith("eval:") and name != "eval:oracle"]
    if evals:
        measured.times["eval_s"] = statistics.mean(evals)
    stages: list[str] = []
    peaks = results.get("memory/peak_gb", {})
    for name in _in_order(peaks):
        peak = peaks[name]
        if name == "eval:oracle" or name.split(":")[0] not in STAGE_PEAKS:  # the oracle replays: no sampler
            continue
        stages.append(name.split(":")[0])
        if peak.get("rss"):
            measured.peaks.append((f"process peak by the end of {name}", ",".join(stages), peak["rss"] * 1e9))
        if peak.get("gpu"):
            measured.gpu_peaks.append((f"GPU peak by the end of {name}", ",".join(stages), peak["gpu"] * 1e9))


def compare(estimate: Estimate, measured: Measured) -> list[Row]:
    """Predicted against measured, for every row the run recorded. Process peaks are
    compared with the largest predicted peak of the stages run so far; on a GPU,
    torch's allocations with the peaks less the CUDA context (RSS is host memory there)."""
    labels = {line.key: line.label for line in estimate.times}
    rows = [Row(labels[key], estimate.value(key), value, "s") for key, value in measured.times.items()
            if key in labels and estimate.value(key) > 0]  # a stage the estimate has not running: no row
    peaks = {line.key: line.value for line in estimate.peaks}

    def predicted(stages: str, less: float = 0.0) -> float:
        keys = [key for stage in stages.split(",") for key in STAGE_PEAKS[stage] if key in peaks]
        return max((peaks[key] for key in keys), default=0.0) - less

    if estimate.device.is_cpu:
        rows += [Row(label, predicted(stages), value, "B") for label, stages, value in measured.peaks]
    else:
        context = estimate.value(GPU_CONTEXT_KEY)
        rows += [Row(label, predicted(stages, context), value, "B") for label, stages, value in measured.gpu_peaks]
    return rows


def rows_dict(rows: list[Row]) -> list[dict[str, Any]]:
    return [{"row": row.label, "unit": row.unit, "predicted": row.predicted, "measured": row.measured,
             "error_pct": row.error_pct} for row in rows]  # fmt: skip


def versus_table(rows: list[Row], title: str) -> Any:
    """The rows as a table: predicted, measured, error in % of the measured value."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for name, justify in (("row", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
        table.add_column(name, justify=justify, overflow="fold" if name == "row" else "ellipsis")
    for row in rows:
        show = duration if row.unit == "s" else size
        error = "-" if row.error_pct is None else f"{row.error_pct:+.0f} %"
        table.add_row(row.label, show(row.predicted), show(row.measured), error)
    return table
