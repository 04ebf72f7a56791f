"""An estimate as tables (rich, within 80 columns) and as a JSON-ready dict."""

from __future__ import annotations

import textwrap
from typing import Any

from ponder.estimate.devices import device_dict
from ponder.estimate.recipe import Estimate, Line


def size(value: float) -> str:
    """Bytes in decimal units: 1.23 GB, 45.6 MB, 12 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}" if unit == "GB" else f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def duration(seconds: float) -> str:
    """Seconds as 0.42 s, 12.3 s, 4.5 min, 2.1 h."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def fits(estimate: Estimate) -> dict[str, Any]:
    """The largest stage peak against one device's memory (0: unknown)."""
    peak = max((line.value for line in estimate.peaks), default=0.0)
    memory = estimate.device.memory_gb * 1e9
    return {"peak_bytes": int(peak), "device_bytes": int(memory), "fits": bool(memory == 0 or peak <= memory)}


def to_dict(estimate: Estimate) -> dict[str, Any]:
    """The JSON of `ponder estimate --json`."""
    lines = [*estimate.memory, *estimate.peaks, *estimate.times]
    return {
        "model": estimate.model,
        "device": device_dict(estimate.device),
        "devices": estimate.devices,
        "tokens": {"episode": estimate.tokens.episode, "decode": estimate.tokens.decode,
                   "source": estimate.tokens.source},
        "memory_bytes": {line.key: int(line.value) for line in estimate.memory},
        "peak_bytes": {line.key: int(line.value) for line in estimate.peaks},
        "time_s": {line.key: line.value for line in estimate.times},
        "details": {line.key: line.detail for line in lines},
        "fits": fits(estimate),
        "assumptions": list(estimate.assumptions),
    }  # fmt: skip


def _table(title: str, lines: list[Line], show: Any) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", max_width=44)
    for line in lines:
        table.add_row(line.label, show(line.value), line.detail)
    return table


def render(estimate: Estimate, console: Any) -> None:
    """Print the header, the memory, peak and time tables and the assumptions."""
    model = estimate.model
    console.print(f"[bold]{model['name']}[/] ({model['model_type']}): {model['parameters'] / 1e6:.1f}M parameters, "
                  f"{model['trainable'] / 1e6:.2f}M trained", highlight=False)  # fmt: skip
    console.print(f"on {estimate.devices} x {estimate.device.label}", highlight=False)
    nonzero = [line for line in estimate.memory if line.value]
    console.print(_table("memory", nonzero, size))
    console.print(_table("peak per stage (one device)", estimate.peaks, size))
    verdict = fits(estimate)
    if verdict["device_bytes"]:
        word = "fits" if verdict["fits"] else "DOES NOT FIT"
        console.print(f"largest peak {size(verdict['peak_bytes'])} of {size(verdict['device_bytes'])}: {word}",
                      highlight=False)  # fmt: skip
    console.print(_table("time", [line for line in estimate.times if line.value], duration))
    console.print("assumptions:", highlight=False)
    width = max(getattr(console, "width", 80) or 80, 40)
    for said in estimate.assumptions:
        console.print(textwrap.fill(said, width, initial_indent="- ", subsequent_indent="  "), highlight=False)
