"""Console tables for evaluation metrics (rich)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

# (header, metric key, format) after the reward components; headers on two lines
# keep the table within 80 columns (a pipe, a CI log), where rich would otherwise
# cut them to "searc…".
COLUMNS = [
    ("tool\ncalls/ep", "tool_calls_per_episode", "{:.2f}"),
    ("tokens\n/ ep", "generated_tokens", "{:.0f}"),
    ("n", "episodes", "{:d}"),
]
# Metrics written before evaluations kept every reward component had these.
LEGACY_COMPONENTS = ("em", "f1", "format")


def metrics_table(metrics: dict[str, Any], title: str = "evaluation", width: int = 80) -> RenderableType:
    """One row for all episodes, one per task kind: the reward (the outcome), the step
    score (the trajectory: the mean share of good steps, ponder.eval.trajectory_score),
    each reward component the environment scored, tool calls and tokens; generation
    speed in the caption.

    When that is wider than `width`, the step score column goes first (trajectory_table,
    printed after it, holds it beside the reward); when it is still wider (many reward
    components: rich would cut every header to "rewa…"), it is transposed: one row per
    metric, one column per task kind, the kinds split over as many tables as it takes to
    fit. Nothing is ever cut: a cell too long for its column folds onto the next line.
    Metrics without a step score (written before trajectory scoring) show none."""
    components = sorted(_components(metrics))
    steps = "step_score" in metrics
    for with_steps in dict.fromkeys((steps, False)):
        table = _by_kind_table(metrics, components, title, with_steps)
        if _natural_width(table) <= width:
            return table
    return _transposed(metrics, components, title, width, steps)


def _by_kind_table(metrics: dict[str, Any], components: list[str], title: str, steps: bool) -> Table:
    # No outer border: two columns more for task kinds at 80 columns.
    table = Table(title=title, show_edge=False, caption=_caption(metrics))
    table.add_column("tasks", overflow="fold")  # a long kind wraps, never "single_…"
    table.add_column("reward", justify="right", overflow="fold")
    if steps:  # beside the outcome, the trajectory's score
        table.add_column("step\nscore", justify="right", overflow="fold")
    for name in components:
        table.add_column(name.replace("_", "\n", 1), justify="right", overflow="fold")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    table.add_row("all", *_cells(metrics, components, steps), style="bold")
    for kind, row in _groups(metrics).items():
        table.add_row(kind, *_cells(row, components, steps))
    return table


def _groups(metrics: dict[str, Any]) -> dict[str, Any]:
    """The rows after `all`: each task kind, and a mixture's parts, a part before its kinds."""
    groups = {**metrics.get("by_part", {}), **metrics.get("by_kind", {})}
    return dict(sorted(groups.items())) if "by_part" in metrics else groups


def _transposed(metrics: dict[str, Any], components: list[str], title: str, width: int,
                steps: bool) -> RenderableType:  # fmt: skip
    """Metrics down, task kinds across, in as few tables of at most `width` columns as fit."""
    rows = {"all": metrics, **_groups(metrics)}
    labels = ["reward", *(["step score"] if steps else []), *components,
              *(header.replace("\n", " ") for header, _, _ in COLUMNS)]
    cells = {kind: _cells(row, components, steps) for kind, row in rows.items()}
    chunks: list[list[str]] = [[]]
    for kind in rows:
        if chunks[-1] and _natural_width(_metric_table(labels, cells, [*chunks[-1], kind], "", None)) > width:
            chunks.append([])
        chunks[-1].append(kind)
    tables = []
    for number, kinds in enumerate(chunks):
        heading = title if number == 0 else f"{title} (continued)"
        caption = _caption(metrics) if number == len(chunks) - 1 else None
        tables.append(_metric_table(labels, cells, kinds, heading, caption))
    spaced: list[RenderableType] = []
    for table in tables:
        spaced += [table] if not spaced else ["", table]
    return spaced[0] if len(spaced) == 1 else Group(*spaced)


def _metric_table(labels: list[str], cells: dict[str, list[str]], kinds: list[str], title: str,
                  caption: str | None) -> Table:  # fmt: skip
    table = Table(title=title or None, show_edge=False, caption=caption)
    table.add_column("", overflow="fold")
    for kind in kinds:
        table.add_column(kind.replace("_", "\n"), justify="right", overflow="fold", style="bold" * (kind == "all"))
    for index, label in enumerate(labels):
        table.add_row(label, *(cells[kind][index] for kind in kinds))
    return table


def _natural_width(table: Table) -> int:
    """The columns `table` takes when nothing has to wrap."""
    console = Console(width=10_000, file=io.StringIO())
    return console.measure(table).maximum


def _caption(metrics: dict[str, Any]) -> str:
    if "tokens_per_s" not in metrics:
        return "n: episodes"
    return (f"n: episodes · {metrics['tokens_per_s']:.1f} generated tokens/s\n"
            f"generation {metrics['generation_s']:.1f} s · tools {metrics['env_s']:.1f} s"
            f" · wall {metrics['wall_s']:.1f} s")  # fmt: skip


def _components(row: dict[str, Any]) -> dict[str, Any]:
    return row["components"] if "components" in row else {k: row.get(k) for k in LEGACY_COMPONENTS}


def _format(value: Any, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and value == value else "-"


def _cells(row: dict[str, Any], components: list[str], steps: bool) -> list[str]:
    values = _components(row)
    step = [_format(row.get("step_score"), "{:.3f}")] if steps else []
    return [_format(row.get("reward"), "{:.3f}"), *step, *[_format(values.get(name), "{:.2f}") for name in components],
            *[_format(row.get(key), fmt) for _, key, fmt in COLUMNS]]  # fmt: skip


def trajectory_table(metrics: dict[str, Any], title: str = "outcome vs trajectory") -> RenderableType | None:
    """The outcome (answer right / wrong) against the trajectory (every step good /
    some step bad, ponder.eval.trajectory_score), in episodes, then each step check's
    pass rate and the problems it found; None when the metrics hold no trajectory scores."""
    summary = metrics.get("trajectory")
    if not isinstance(summary, dict) or not summary.get("episodes"):
        return None
    outcome = summary["outcome"]
    table = Table(title=title, show_edge=False)
    table.add_column("answer", overflow="fold")
    for header in ("every step\ngood", "some step\nbad", "all"):
        table.add_column(header, justify="right", overflow="fold")
    for side in ("right", "wrong"):
        clean, flawed = outcome[f"{side}_clean"], outcome[f"{side}_flawed"]
        table.add_row(side, str(clean), str(flawed), str(clean + flawed))
    if outcome["unknown"]:
        table.add_row("not scored", "-", "-", str(outcome["unknown"]))
    checks = Table(show_edge=False)
    checks.add_column("step check", overflow="fold")
    checks.add_column("steps\npassed", justify="right", overflow="fold")
    checks.add_column("problems (steps)", overflow="fold")
    for name, rate in summary["checks"].items():
        found = [f"{key.split('/', 1)[1]} {count}" for key, count in summary["problems"].items()
                 if key.split("/", 1)[0] == name]  # fmt: skip
        checks.add_row(name, _format(rate, "{:.3f}"), ", ".join(found) or "-")
    return Group(table, Text(_trajectory_lines(summary)), "", checks)


def _trajectory_lines(summary: dict[str, Any]) -> str:
    """The lines under the table (as text, not a caption: a caption would wrap to the table's width)."""
    outcome = summary["outcome"]
    right = outcome["right_clean"] + outcome["right_flawed"]
    return (f"step score {_format(summary['step_score'], '{:.3f}')} ± {_format(summary['step_score_se'], '{:.3f}')}"
            f" · clean {_format(summary['clean'], '{:.3f}')} · agreement {_format(outcome['agreement'], '{:.3f}')}\n"
            f"right for the wrong reasons: {outcome['right_flawed']} of {right} right answers")  # fmt: skip
