"""Console tables for evaluation metrics (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

# (header, metric key, format); headers on two lines keep the table within 80
# columns (a pipe, a CI log), where rich would otherwise cut them to "searc…".
COLUMNS = [
    ("EM", "em", "{:.3f}"),
    ("F1", "f1", "{:.3f}"),
    ("format", "format", "{:.2f}"),
    ("reward", "reward", "{:.3f}"),
    ("searches\n/ ep", "searches_per_episode", "{:.2f}"),
    ("turns\n/ ep", "turns", "{:.2f}"),
    ("tokens\n/ ep", "generated_tokens", "{:.0f}"),
    ("n", "episodes", "{:d}"),
]


def metrics_table(metrics: dict[str, Any], title: str = "evaluation") -> Table:
    """One row for all episodes, one per task kind; generation speed in the caption."""
    # No outer border: two columns more for task kinds at 80 columns.
    table = Table(title=title, show_edge=False)
    table.add_column("tasks", overflow="fold")  # a long kind wraps, never "single_…"
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right")
    table.add_row("all", *_cells(metrics), style="bold")
    for kind, row in metrics.get("by_kind", {}).items():
        table.add_row(kind, *_cells(row))
    if "tokens_per_s" in metrics:
        table.caption = (
            f"n: episodes · {metrics['tokens_per_s']:.1f} generated tokens/s\n"
            f"generation {metrics['generation_s']:.1f} s · tools {metrics['env_s']:.1f} s"
            f" · wall {metrics['wall_s']:.1f} s"
        )
    else:
        table.caption = "n: episodes"
    return table


def _cells(row: dict[str, Any]) -> list[str]:
    return [fmt.format(row[key]) if row.get(key) == row.get(key) else "-" for _, key, fmt in COLUMNS]
