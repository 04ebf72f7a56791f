"""The demo's before/after table."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL", "oracle": "oracle"}
# Results written before evaluations kept every reward component had these.
LEGACY_COMPONENTS = ("em", "format")
CAPTION_WIDTH = 64  # about the table's own width, so the caption lines sit under it


def demo_table(results: dict[str, Any]) -> Table:
    """Reward and each reward component of the environment, one column per stage,
    then the reward (and, where the agent searched, searches per episode) of each
    task kind. Stages are columns, not rows, so the table's width grows with the
    four stages, not with the number of task kinds or components, and fits in 80
    columns (a pipe or a CI log)."""
    stages = results["stages"]
    names = [name for name in LABELS if name in stages]
    rows = [stages[name] for name in names]
    temperature = results.get("eval_temperature", 0.0)
    decoding = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}"
    table = Table(title=f"held-out tasks ({rows[0]['episodes']} episodes, {decoding})")
    table.add_column("")
    for name in names:
        table.add_column(LABELS[name], justify="right")
    table.add_row("reward", *[_cell(row, "reward", "{:.3f}") for row in rows])
    table.add_row("± se", *[_cell(row, "reward_se", "{:.3f}") for row in rows])
    for component in _components(rows):
        table.add_row(component, *[_cell(_component_values(row), component, "{:.3f}") for row in rows])
    searched = any(row.get("searches_per_episode", 0) > 0 for row in rows)
    if searched:
        table.add_row("searches/ep", *[_cell(row, "searches_per_episode", "{:.2f}") for row in rows])
    kinds = sorted({k for row in rows for k in row.get("by_kind", {})})
    if len(kinds) > 1:
        table.add_section()
        for kind in kinds:
            by_kind = [row.get("by_kind", {}).get(kind, {}) for row in rows]
            table.add_row(f"reward {kind}", *[_cell(r, "reward", "{:.3f}") for r in by_kind])
            if searched:
                table.add_row(f"searches {kind}", *[_cell(r, "searches_per_episode", "{:.2f}") for r in by_kind])
    captions = ["oracle: the ceiling"] if "oracle" in names else []
    timing = results.get("timing_s", {})
    if "total" in timing:
        captions += _wrap_items([f"{k} {v:.0f} s" for k, v in timing.items()], " · ", CAPTION_WIDTH)
    table.caption = "\n".join(captions) or None
    return table


def _component_values(row: dict[str, Any]) -> dict[str, Any]:
    return row["components"] if "components" in row else {k: row.get(k) for k in LEGACY_COMPONENTS}


def _components(rows: list[dict[str, Any]]) -> list[str]:
    """The reward components any stage scored, in a stable order."""
    names = {name for row in rows for name in _component_values(row)}
    return sorted(names)


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
