"""`ponder bench-agent`: agent metrics over scored samples, as JSON, Markdown and a PNG.

A suite yields `AgentSample`s (one reply or episode per task and sample index) that
say what was needed and what the agent did. The metrics:

- tool_selection: the multiset of tools called equals the multiset needed (for a task
  that needs no call: no call made).
- argument_accuracy: among tasks that need calls and were selected right, the share
  the suite's checker accepts (right arguments given right tools).
- success: the suite's checker accepts the sample (BFCL's verdict on BFCL).
- calls_per_success: calls made over all samples / successes.
- step_efficiency: over successes, the fewest steps the task needs / steps taken.
- timing_precision: of samples that called a tool, the share whose task needed one;
  timing_recall: of samples whose task needed a call, the share that called.
- em / f1: the reply against the reference reply (normalised exact match, token F1).
- pass@k: unbiased estimator over n samples per task, bootstrap interval over tasks.
Shares carry 95% Wilson intervals.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ponder.eval.passk import pass_at_k_with_ci, wilson_interval
from ponder.fileio import write_json_atomic, write_text_atomic
from ponder.rewards.qa import exact_match_score, f1_score


@dataclass
class AgentSample:
    """One sample of one task, as bench-agent scores it."""

    task_id: str
    group: str
    success: bool
    called: list[str]
    needed: list[str]
    steps: int = 1
    min_steps: int = 1
    text: str = ""
    reference: str = ""
    seconds: float = 0.0


def _share(hits: int, total: int) -> dict[str, float]:
    low, high = wilson_interval(hits, total)
    return {"value": hits / total if total else float("nan"), "low": low, "high": high, "n": float(total)}


def agent_metrics(samples: list[AgentSample], ks: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """All the metrics above for one set of samples."""
    selected = [Counter(s.called) == Counter(s.needed) for s in samples]
    need = [bool(s.needed) for s in samples]
    successes = sum(s.success for s in samples)
    with_args = [s.success for s, ok, n in zip(samples, selected, need) if ok and n]
    callers = [n for s, n in zip(samples, need) if s.called]
    efficiency = [s.min_steps / s.steps for s in samples if s.success and s.steps > 0]
    per_task: dict[str, list[bool]] = {}
    for sample in samples:
        per_task.setdefault(sample.task_id, []).append(sample.success)
    n = [len(v) for v in per_task.values()]
    c = [sum(v) for v in per_task.values()]
    total_calls = sum(len(s.called) for s in samples)
    return {
        "samples": len(samples),
        "tasks": len(per_task),
        "success": _share(successes, len(samples)),
        "tool_selection": _share(sum(selected), len(samples)),
        "argument_accuracy": _share(sum(with_args), len(with_args)),
        "timing_precision": _share(sum(callers), len(callers)),
        "timing_recall": _share(sum(bool(s.called) for s, nd in zip(samples, need) if nd), sum(need)),
        "calls_per_success": total_calls / successes if successes else float("nan"),
        "step_efficiency": sum(efficiency) / len(efficiency) if efficiency else float("nan"),
        "em": _mean([exact_match_score(s.text, [s.reference]) for s in samples if s.reference]),
        "f1": _mean([f1_score(s.text, [s.reference]) for s in samples if s.reference]),
        "seconds_per_sample": _mean([s.seconds for s in samples]),
        **{f"pass@{k}": pass_at_k_with_ci(n, c, k) for k in ks},
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def grouped_metrics(samples: list[AgentSample], ks: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """Metrics per group (BFCL category) and over all samples ("all")."""
    groups = sorted({s.group for s in samples})
    report = {group: agent_metrics([s for s in samples if s.group == group], ks) for group in groups}
    report["all"] = agent_metrics(samples, ks)
    return report


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        point = value.get("value", value.get("pass@k"))
        return f"{point:.3f} [{value['low']:.2f}, {value['high']:.2f}]" if point == point else "n/a"
    return f"{value:.3f}" if value == value else "n/a"


COLUMNS = ("success", "tool_selection", "argument_accuracy", "timing_precision", "calls_per_success",
           "step_efficiency", "em", "f1")


def markdown_table(conditions: dict[str, dict[str, Any]], ks: tuple[int, ...] = (1,)) -> str:
    """One row per (condition, group); intervals are 95%."""
    columns = COLUMNS + tuple(f"pass@{k}" for k in ks)
    lines = ["| condition | group | n | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 3)]
    for condition, report in conditions.items():
        for group, metrics in report.items():
            cells = " | ".join(_cell(metrics[c]) for c in columns)
            lines.append(f"| {condition} | {group} | {metrics['samples']} | {cells} |")
    return "\n".join(lines)


def plot_success(conditions: dict[str, dict[str, Any]], path: Path) -> Path:
    """Grouped bars: success per group for each condition, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(next(iter(conditions.values())).keys())
    width = 0.8 / max(1, len(conditions))
    figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    for offset, (condition, report) in enumerate(conditions.items()):
        values = [report[g]["success"]["value"] for g in groups]
        low = [max(0.0, v - report[g]["success"]["low"]) for v, g in zip(values, groups)]
        high = [max(0.0, report[g]["success"]["high"] - v) for v, g in zip(values, groups)]
        xs = [i + offset * width for i in range(len(groups))]
        axes.bar(xs, values, width, yerr=[low, high], capsize=3, label=condition)
    axes.set_xticks([i + width * (len(conditions) - 1) / 2 for i in range(len(groups))], groups, rotation=20)
    axes.set_ylabel("success (BFCL checker), 95% CI")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_report(conditions: dict[str, dict[str, Any]], samples: dict[str, list[AgentSample]], out: Path,
                 ks: tuple[int, ...], header: str) -> list[Path]:
    """results.json (metrics and every sample), results.md and success.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"header": header, "metrics": conditions,
            "samples": {name: [asdict(s) for s in group] for name, group in samples.items()}}
    write_json_atomic(out / "results.json", data, indent=1, sort_keys=False, default=str)
    write_text_atomic(out / "results.md", f"{header}\n\n{markdown_table(conditions, ks)}\n")
    return [out / "results.json", out / "results.md", plot_success(conditions, out / "success.png")]


PARTIAL_SAMPLES = "samples.partial.jsonl"
SAMPLES = "samples.jsonl"


@contextlib.contextmanager
def sample_log(out: Path, say: Callable[[str], None] = lambda _: None) -> Iterator[Path]:
    """The file a run appends its scored samples to as it goes: `out/samples.partial.jsonl`.

    A run starts fresh: a partial file left by an earlier run that did not finish is
    removed, and `say` tells the user so, rather than appended to, since its samples may
    come from another model or other settings and would be counted again on a rerun
    (bench-agent has no resume). When the run completes, the file is renamed in one
    atomic step to `out/samples.jsonl`, so no partial file is left behind; a run that
    fails or is interrupted leaves its partial file for inspection until the next run.
    """
    partial = out / PARTIAL_SAMPLES
    if partial.exists():
        partial.unlink()
        say(f"removed {partial}, left by an earlier run that did not finish (a new run starts fresh)")
    yield partial
    if partial.exists():
        os.replace(partial, out / SAMPLES)
