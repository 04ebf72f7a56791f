"""The demo's before/after table."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL", "oracle": "oracle"}
# (row label, metric key, format); the per-kind searches rows follow these.
ROWS = (
    ("reward", "reward", "{:.3f}"),
    ("± se", "reward_se", "{:.3f}"),
    ("EM", "em", "{:.3f}"),
    ("format", "format", "{:.2f}"),
    ("searches/ep", "searches_per_episode", "{:.2f}"),
)
CAPTION_WIDTH = 64  # about the table's own width, so the caption lines sit under it


def demo_table(results: dict[str, Any]) -> Table:
    """Reward, EM and search behaviour, one column per stage, then searches per
    episode of each task kind. Stages are columns, not rows, so the table's width
    grows with the four stages, not with the number of task kinds, and fits in 80
    columns (a pipe or a CI log)."""
    stages = results["stages"]
    names = [name for name in LABELS if name in stages]
    kinds = sorted({k for m in stages.values() for k in m.get("by_kind", {})})
    temperature = results.get("eval_temperature", 0.0)
    decoding = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}"
    table = Table(title=f"held-out tasks ({next(iter(stages.values()))['episodes']} episodes, {decoding})")
    table.add_column("")
    for name in names:
        table.add_column(LABELS[name], justify="right")
    for label, key, fmt in ROWS:
        table.add_row(label, *[_cell(stages[name], key, fmt) for name in names])
    if kinds:
        table.add_section()
    for kind in kinds:
        by_kind = [stages[name].get("by_kind", {}).get(kind, {}) for name in names]
        table.add_row(f"searches {kind}", *[_cell(row, "searches_per_episode", "{:.2f}") for row in by_kind])
    captions = ["oracle: the ceiling"] if "oracle" in names else []
    timing = results.get("timing_s", {})
    if "total" in timing:
        captions += _wrap_items([f"{k} {v:.0f} s" for k, v in timing.items()], " · ", CAPTION_WIDTH)
    table.caption = "\n".join(captions) or None
    return table


def _wrap_items(items: list[str], separator: str, width: int) -> list[str]:
    """`items` joined into lines of at most `width` characters, broken only between
    items (rich would break inside one, between "rl" and "389 s")."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(separator) + len(item) <= width:
            lines[-1] += separator + item
        else:
            lines.append(item)
    return lines


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return fmt.format(value) if isinstance(value, (int, float)) and not math.isnan(value) else "-"
