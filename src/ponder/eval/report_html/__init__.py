"""`ponder report RUN_DIR`: one self-contained HTML page for a run directory.

It holds the evaluation table per stage (results.json), learning curves from every
metrics.jsonl (reward and its components, entropy, KL, lengths, losses) as inlined
PNGs, and an episode browser: pick a stage and an episode and see each turn's tokens,
those the loss trained on and the masked observation tokens in different colours,
with per-turn rewards and the reward breakdown. `--compare OTHER` puts a second run
beside it: side-by-side tables and overlaid curves. No network is needed to open it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ponder.eval.report_html.data import RunData, load_run
from ponder.eval.report_html.figures import curve_figures
from ponder.eval.report_html.page import render
from ponder.fileio import write_text_atomic

REPORT_FILE = "report.html"


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 compare: str | os.PathLike[str] | None = None, tokens: bool = True) -> Path:  # fmt: skip
    """Write the report of `run_dir` (beside `compare` if given) to `out`, by default
    RUN_DIR/report.html; returns its path. `tokens=False`: show stored text, not tokens."""
    runs = [load_run(run_dir, tokens)] + ([load_run(compare, tokens)] if compare else [])
    if len(runs) == 2 and runs[0].name == runs[1].name:  # two runs named alike (a/x, b/x): tell them apart
        runs[0].name, runs[1].name = str(runs[0].path), str(runs[1].path)
    target = Path(out) if out else Path(run_dir) / REPORT_FILE
    write_text_atomic(target, build_page(runs))
    return target


def build_page(runs: list[RunData]) -> str:
    """The page's HTML for one run or two (the first is the reference)."""
    sources = list(dict.fromkeys(name for run in runs for name in run.curves))
    sections = [(source, curve_figures([(run.name, run.curves.get(source, [])) for run in runs]))
                for source in sources]  # fmt: skip
    return render(runs, [(source, figures) for source, figures in sections if figures])


__all__ = ["REPORT_FILE", "RunData", "build_page", "load_run", "write_report"]
