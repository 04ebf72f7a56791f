"""The report's HTML: tables written here (every value escaped), the episodes as JSON
in a <script type="application/json"> block that the page's own script reads and
shows with textContent only. Model and tool text is hostile data: it never becomes
markup, and `<`, `>`, `&` and U+2028/2029 are escaped inside the JSON block so no
`</script>` in it can end the block."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from ponder.eval.report_html.assets import SCRIPT, STYLE
from ponder.eval.report_html.data import RunData

LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL", "oracle": "oracle", "eval": "evaluation"}
# (row label, metric key, format) after reward, its se and the components.
ROWS = (
    ("tool calls / ep", "tool_calls_per_episode", "{:.2f}"),
    ("searches / ep", "searches_per_episode", "{:.2f}"),
    ("turns / ep", "turns", "{:.2f}"),
    ("generated tokens / ep", "generated_tokens", "{:.1f}"),
    ("parse errors", "parse_errors", "{:.3f}"),
    ("episodes", "episodes", "{:.0f}"),
)
LEGACY_COMPONENTS = ("em", "f1", "format")
# (row label, metric path, format) after the reward: the trajectory beside the outcome
# (ponder.eval.trajectory_score), shown when some stage has it.
TRAJECTORY_ROWS = (
    ("step score", "step_score", "{:.3f}"),
    ("± se", "step_score_se", "{:.3f}"),
    ("clean trajectories", "trajectory/clean", "{:.3f}"),
    ("right, some step bad", "trajectory/outcome/right_flawed", "{:.0f}"),
    ("wrong, every step good", "trajectory/outcome/wrong_clean", "{:.0f}"),
    ("outcome-trajectory agreement", "trajectory/outcome/agreement", "{:.3f}"),
)
ADVANTAGE_KEYS = ("reward/std", "collapse/tied_groups", "collapse/distinct_ratio")


def render(runs: list[RunData], sections: list[tuple[str, list[dict[str, str]]]]) -> str:
    """The whole page for one run, or two runs compared (the first is the reference).
    `sections`: (metrics source, its figures), e.g. the demo's `rl` and `sft`."""
    title = "ponder report: " + " vs ".join(run.name for run in runs)
    parts = [f"<h1>{_e(title)}</h1>", _summary(runs)]
    if any(run.stages for run in runs):
        parts.append("<h2>Evaluation</h2>")
        parts.append(stage_table(runs[0]) if len(runs) == 1 else compare_table(runs[0], runs[1]))
        parts += [_gain(run) for run in runs if "rl_gain" in run.extra]
        parts.append(trajectory_section(runs))
    if sections:
        parts.append("<h2>Learning curves</h2>")
        if len(runs) > 1:
            parts.append(f"<p class=note>solid: {_e(runs[0].name)} · dashed: {_e(runs[1].name)}</p>")
    for source, figures in sections:
        parts.append(f"<h3>{_e(source)}/metrics.jsonl</h3>" if source != "train" else "<h3>metrics.jsonl</h3>")
        parts.append(f'<div class="figures" data-source="{_e(source)}">' + "".join(
            f'<figure><img alt="{_e(f["title"])}" src="data:image/png;base64,{f["png"]}"></figure>' for f in figures
        ) + "</div>")  # fmt: skip
    parts.append(_advantage_note(runs))
    if any(run.episodes for run in runs):
        parts.append(BROWSER)
    body = "\n".join(parts)
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n{body}\n"
        f'<script type="application/json" id="ponder-data">{embed_json(_page_data(runs))}</script>\n'
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: no `<`, `>` or `&` (so no `</script>` or
    `<!--`), and no U+2028/2029, which some parsers take for line ends."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escape)
    return text


def _page_data(runs: list[RunData]) -> dict[str, Any]:
    return {"runs": [{"name": run.name, "tokens": run.tokens, "episodes": run.episodes,
                      "labels": {s: LABELS.get(s, s) for s in run.episodes}} for run in runs]}  # fmt: skip


def stage_table(run: RunData) -> str:
    """One column per stage; rows: reward, se, each reward component, tool use and
    lengths, then the reward per task kind."""
    stages = list(run.stages)
    head = "<tr><th></th>" + "".join(f"<th>{_e(LABELS.get(s, s))}</th>" for s in stages) + "</tr>"
    rows = []
    for label, key, values, fmt in _rows(run.stages):
        cells = "".join(f'<td data-stage="{_e(s)}" data-metric="{_e(key)}">{_fmt(values(run.stages[s]), fmt)}</td>'
                        for s in stages)  # fmt: skip
        rows.append(f"<tr><th>{_e(label)}</th>{cells}</tr>")
    return f'<table id="stages" class="numbers"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def compare_table(first: RunData, second: RunData) -> str:
    """Side by side: per stage the first run, the second, and the difference."""
    stages = list(dict.fromkeys([*first.stages, *second.stages]))
    head = "<tr><th></th>" + "".join(f'<th colspan=3>{_e(LABELS.get(s, s))}</th>' for s in stages) + "</tr>"
    head += "<tr><th></th>" + f"<th>{_e(first.name)}</th><th>{_e(second.name)}</th><th>Δ</th>" * len(stages) + "</tr>"
    rows = []
    for label, key, values, fmt in _rows(first.stages, second.stages):
        cells = []
        for stage in stages:
            a, b = (values(run.stages.get(stage, {})) for run in (first, second))
            delta = b - a if _finite(a) and _finite(b) else None
            cells.append(f'<td data-stage="{_e(stage)}" data-metric="{_e(key)}" data-run="0">{_fmt(a, fmt)}</td>'
                         f'<td data-stage="{_e(stage)}" data-metric="{_e(key)}" data-run="1">{_fmt(b, fmt)}</td>'
                         f'<td class="delta">{_fmt(delta, "{:+.3f}")}</td>')  # fmt: skip
        rows.append(f"<tr><th>{_e(label)}</th>{''.join(cells)}</tr>")
    return f'<table id="compare" class="numbers"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _rows(*stage_sets: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any, str]]:
    """(label, key, stage metrics → value, format) for every row any stage has."""
    stages = [row for stage_set in stage_sets for row in stage_set.values()]
    rows: list[tuple[str, str, Any, str]] = [
        ("reward", "reward", lambda m: m.get("reward"), "{:.3f}"),
        ("± se", "reward_se", lambda m: m.get("reward_se"), "{:.3f}"),
    ]
    rows += [(label, key, lambda m, k=key: _path(m, k), fmt) for label, key, fmt in TRAJECTORY_ROWS
             if any(_path(row, key) is not None for row in stages)]  # fmt: skip
    for name in sorted({c for row in stages for c in _components(row)}):
        rows.append((name, f"components/{name}", lambda m, n=name: _components(m).get(n), "{:.3f}"))
    rows += [(label, key, lambda m, k=key: m.get(k), fmt) for label, key, fmt in ROWS
             if any(key in row for row in stages)]  # fmt: skip
    kinds = sorted({k for row in stages for k in row.get("by_kind", {})})
    if len(kinds) > 1:
        rows += [(f"reward · {kind}", f"by_kind/{kind}/reward",
                  lambda m, k=kind: m.get("by_kind", {}).get(k, {}).get("reward"), "{:.3f}") for kind in kinds]  # fmt: skip
    return rows


def _path(row: dict[str, Any], key: str) -> Any:
    """row["a"]["b"] for the key "a/b"; None where a level is missing."""
    value: Any = row
    for part in key.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def trajectory_section(runs: list[RunData]) -> str:
    """Per run, each stage's step checks: the share of steps passing each, and the
    problems found (steps), rows `check` and `check/problem`, one column per stage."""
    parts = []
    for run in runs:
        stages = {name: row["trajectory"] for name, row in run.stages.items()
                  if isinstance(row.get("trajectory"), dict)}  # fmt: skip
        if not stages:
            continue
        keys = sorted({key for summary in stages.values() for key in [*summary.get("checks", {}),
                                                                        *summary.get("problems", {})]})  # fmt: skip
        head = "<tr><th></th>" + "".join(f"<th>{_e(LABELS.get(s, s))}</th>" for s in stages) + "</tr>"
        rows = []
        for key in keys:
            label, fmt = (f"{key}: steps passed", "{:.3f}") if "/" not in key else (f"  {key}", "{:.0f}")
            cells = "".join(f'<td data-stage="{_e(s)}" data-metric="trajectory/{_e(key)}">'
                            f'{_fmt(summary.get("checks" if "/" not in key else "problems", {}).get(key, 0), fmt)}</td>'
                            for s, summary in stages.items())  # fmt: skip
            rows.append(f"<tr><th>{_e(label)}</th>{cells}</tr>")
        caption = f"<h3>{_e(run.name)}</h3>" if len(runs) > 1 else ""
        parts.append(f'{caption}<table class="numbers trajectory" data-run="{_e(run.name)}"><thead>{head}</thead>'
                     f'<tbody>{"".join(rows)}</tbody></table>')  # fmt: skip
    if not parts:
        return ""
    return ("<h2>Trajectory scoring</h2><p class=note>Each turn is judged by the step checks (process: no false "
            "shown arithmetic; tool use: the tool exists, its arguments validate, no error, no identical repeat; "
            "policy: no protocol error, empty tag, loop, call needing approval, refusal, guessed or hedged answer, "
            "truncation). Steps passed: the share of the steps a check applies to that pass it; below each, the "
            "steps with each problem.</p>" + "".join(parts))


def _components(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row.get("components"), dict):
        return row["components"]
    return {k: row[k] for k in LEGACY_COMPONENTS if k in row}


def _gain(run: RunData) -> str:
    gain = run.extra["rl_gain"]
    text = (f"RL gain over SFT ({_e(run.name)}), paired by task: {_fmt(gain.get('gain'), '{:+.3f}')} "
            f"± {_fmt(gain.get('se_paired'), '{:.3f}')} (se, n = {_fmt(gain.get('n'), '{:.0f}')})")  # fmt: skip
    verdict = run.extra.get("verdict")
    return f"<p class=gain>{text}</p>" + (f"<p class=note>{_e(str(verdict))}</p>" if verdict else "")


def _summary(runs: list[RunData]) -> str:
    items = []
    for run in runs:
        curves = ", ".join(f"{name} ({len(records)} steps)" for name, records in run.curves.items()) or "none"
        stages = ", ".join(run.episodes) or "none"
        items.append(f"<li><b>{_e(run.name)}</b>: model {_e(run.model or '?')}; curves: {_e(curves)}; "
                     f"episodes of: {_e(stages)}</li>")  # fmt: skip
    return f"<ul class=summary>{''.join(items)}</ul>"


def _advantage_note(runs: list[RunData]) -> str:
    """Advantages are a training quantity: say where they are and what the RL metrics hold."""
    lines = []
    for run in runs:
        records = run.curves.get("rl") or run.curves.get("train") or []
        last = records[-1] if records else {}
        held = [f"{key} {_fmt(last.get(key), '{:.3f}')}" for key in ADVANTAGE_KEYS if key in last]
        if held:
            lines.append(f"<li>{_e(run.name)}, last RL step ({last['step']}): {_e(' · '.join(held))}</li>")
    return (
        "<h2>Advantages</h2><p class=note>Evaluation trajectories store no advantages: held-out evaluation "
        "computes none. During RL each step's advantages (of the trained tokens) go to the trackers as a "
        "histogram (<code>tracking.trackers</code>: TensorBoard's and W&amp;B's <code>advantages</code>). "
        "metrics.jsonl holds the group signal they are computed from: <code>reward/std</code>, and "
        "<code>collapse/tied_groups</code>, the share of groups whose rewards all tie (zero advantage).</p>"
        + (f"<ul>{''.join(lines)}</ul>" if lines else "")
    )


BROWSER = """<h2>Episodes</h2>
<div class="browser">
 <div class="pick">
  <label id="run-label" hidden>run <select id="run-select"></select></label>
  <label>stage <select id="stage-select"></select></label>
  <label>episode <select id="episode-select" size="14"></select></label>
  <p class="legend"><span class="tok trained">trained on (loss mask 1)</span>
   <span class="tok observation">observation (masked, 0)</span></p>
  <p class="note" id="token-note"></p>
 </div>
 <div id="episode"></div>
</div>"""


def _fmt(value: Any, fmt: str) -> str:
    return fmt.format(value) if _finite(value) else "-"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
