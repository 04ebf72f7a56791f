"""Console tables for evaluation metrics (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

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


def metrics_table(metrics: dict[str, Any], title: str = "evaluation") -> Table:
    """One row for all episodes, one per task kind: the reward, each reward component
    the environment scored, tool calls and tokens; generation speed in the caption."""
    components = sorted(_components(metrics))
    # No outer border: two columns more for task kinds at 80 columns.
    table = Table(title=title, show_edge=False)
    table.add_column("tasks", overflow="fold")  # a long kind wraps, never "single_…"
    table.add_column("reward", justify="right")
    for name in components:
        table.add_column(name.replace("_", "\n", 1), justify="right")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right")
    table.add_row("all", *_cells(metrics, components), style="bold")
    for kind, row in metrics.get("by_kind", {}).items():
        table.add_row(kind, *_cells(row, components))
    if "tokens_per_s" in metrics:
        table.caption = (
            f"n: episodes · {metrics['tokens_per_s']:.1f} generated tokens/s\n"
            f"generation {metrics['generation_s']:.1f} s · tools {metrics['env_s']:.1f} s"
            f" · wall {metrics['wall_s']:.1f} s"
        )
    else:
        table.caption = "n: episodes"
    return table


def _components(row: dict[str, Any]) -> dict[str, Any]:
    return row["components"] if "components" in row else {k: row.get(k) for k in LEGACY_COMPONENTS}


def _format(value: Any, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and value == value else "-"


def _cells(row: dict[str, Any], components: list[str]) -> list[str]:
    values = _components(row)
    return [_format(row.get("reward"), "{:.3f}"), *[_format(values.get(name), "{:.2f}") for name in components],
            *[_format(row.get(key), fmt) for _, key, fmt in COLUMNS]]  # fmt: skip
