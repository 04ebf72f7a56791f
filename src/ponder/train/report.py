"""The demo's before/after table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL", "oracle": "oracle (ceiling)"}


def demo_table(results: dict[str, Any]) -> Table:
    """Reward, EM and search behaviour per stage, with searches split by task kind."""
    stages = results["stages"]
    kinds = sorted({k for m in stages.values() for k in m.get("by_kind", {})})
    temperature = results.get("eval_temperature", 0.0)
    decoding = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}"
    table = Table(title=f"held-out tasks ({next(iter(stages.values()))['episodes']} episodes, {decoding})")
    for header in ["stage", "reward", "± se", "EM", "format", "searches/ep"] + [f"searches {k}" for k in kinds]:
        table.add_column(header, justify="left" if header == "stage" else "right")
    for name in ("base", "sft", "rl", "oracle"):
        if name not in stages:
            continue
        m = stages[name]
        by_kind = m.get("by_kind", {})
        cells = [f"{m['reward']:.3f}", f"{m['reward_se']:.3f}", f"{m['em']:.3f}", f"{m['format']:.2f}"]
        cells.append(f"{m['searches_per_episode']:.2f}")
        cells += [f"{by_kind[k]['searches_per_episode']:.2f}" if k in by_kind else "-" for k in kinds]
        table.add_row(LABELS[name], *cells)
    timing = results.get("timing_s", {})
    if "total" in timing:
        table.caption = " · ".join(f"{k} {v:.0f} s" for k, v in timing.items())
    return table
