"""What a run directory holds, read for the HTML report.

A run directory is whatever a ponder command wrote: `ponder demo` (results.json with
one entry per stage, eval-<stage>.parquet, rl/ and sft/ with metrics.jsonl),
`ponder train` (metrics.jsonl at the top, sft/), `ponder eval` (metrics.json,
trajectories.parquet) or `ponder pipeline` (NN-stage/ directories). Everything here
is plain data (dicts, lists, strings) ready to become JSON or HTML.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ponder.eval.trajectory_score import aggregate_steps, judge_steps
from ponder.types import Trajectory, load_trajectories

METRICS_FILE = "metrics.jsonl"  # ponder.runlog.metrics_log writes it (eval/ does not import train/)
SKIPPED_DIRS = ("plots", "tb", "wandb", "checkpoints", "best")
STAGE_ORDER = ("base", "sft", "rl", "oracle")
# The page embeds every episode of every stage; past this many per stage it keeps the
# first ones (a run evaluated on thousands of tasks would make a page too big to open).
MAX_EPISODES_PER_STAGE = 500


@dataclass
class RunData:
    """One run as the report shows it.

    stages: stage name → evaluation metrics (results.json's `stages`, or an eval's
        metrics.json as stage `eval`). extra: the rest of results.json (rl_gain …).
    curves: source name (`rl`, `sft`, `train`, a pipeline stage) → metrics.jsonl records.
    episodes: stage name → episodes (see `episode_record`). tokens: how turns are
        split: `token` (decoded with the run's tokenizer) or `text` (stored segments).
    """

    name: str
    path: Path
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tokens: str = "text"
    model: str = ""


def load_run(run_dir: str | Path, tokens: bool = True) -> RunData:
    """Read `run_dir`; raise ValueError when it holds nothing a report can show."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ValueError(f"{run_dir}: not a directory")
    run = RunData(name=path.resolve().name, path=path)
    run.stages, run.extra = _evaluations(path)
    run.curves = {name: records for name, records in _curves(path).items() if records}
    run.model = _model_name(path)
    files = _trajectory_files(path)
    decode = _piece_decoder(run.model) if tokens and files else None
    run.tokens = "token" if decode is not None else "text"
    for stage, file in files.items():
        trajectories = load_trajectories(file)[:MAX_EPISODES_PER_STAGE]
        run.episodes[stage] = [episode_record(t, decode) for t in trajectories]
    if not (run.stages or run.curves or run.episodes):
        raise ValueError(f"{run_dir}: no results.json, metrics.json, {METRICS_FILE} or trajectories "
                         "(not a ponder run directory?)")  # fmt: skip
    return run


def _evaluations(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    results = path / "results.json"
    if results.is_file():
        data = json.loads(results.read_text(encoding="utf-8"))
        stages = data.pop("stages", {}) if isinstance(data, dict) else {}
        return _ordered(stages), data if isinstance(data, dict) else {}
    single = path / "metrics.json"  # `ponder eval`
    if single.is_file():
        return {"eval": json.loads(single.read_text(encoding="utf-8"))}, {}
    return {}, {}


def stage_metrics(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """stage name -> its evaluation metrics (results.json's stages, or an eval's metrics.json)."""
    return _evaluations(Path(run_dir))[0]


def _ordered(stages: dict[str, Any]) -> dict[str, Any]:
    """The demo's stages in pipeline order, any others after them by name."""
    known = [name for name in STAGE_ORDER if name in stages]
    return {name: stages[name] for name in known + sorted(set(stages) - set(known))}


def _trajectory_files(path: Path) -> dict[str, Path]:
    """stage name → Parquet file: eval-<stage>.parquet (demo), trajectories.parquet (eval)."""
    files = {file.stem.removeprefix("eval-"): file for file in path.glob("eval-*.parquet")}
    if (path / "trajectories.parquet").is_file():
        files["eval"] = path / "trajectories.parquet"
    return _ordered(files)


def _curves(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every metrics.jsonl at the top (`train`) or one level down (its folder's name)."""
    found: dict[str, list[dict[str, Any]]] = {}
    if (path / METRICS_FILE).is_file():
        found["train"] = read_metrics_file(path / METRICS_FILE)
    for child in sorted(p for p in path.iterdir() if p.is_dir() and p.name not in SKIPPED_DIRS):
        if (child / METRICS_FILE).is_file():
            found[child.name] = read_metrics_file(child / METRICS_FILE)
    return found


def read_metrics_file(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a metrics.jsonl (a last line cut by a kill is left out);
    `null` (NaN or ±inf when written) becomes NaN, as in ponder.runlog.metrics_log."""
    records = []
    for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
        if not line.strip():
            continue
        record = json.loads(line)
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append({k: float("nan") if v is None else v for k, v in record.items()})
    return records


def _model_name(path: Path) -> str:
    import yaml

    recipe = path / "recipe.yaml"
    if not recipe.is_file():
        return ""
    data = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
    model = data.get("model") if isinstance(data, dict) else None
    return str(model.get("name", "")) if isinstance(model, dict) else ""


def _piece_decoder(model: str) -> Callable[[int], str] | None:
    """id → its text, with the run's tokenizer; None when that tokenizer is not on this
    machine (the report then shows each turn's stored text, split by the same mask)."""
    try:
        tokenizer = _tokenizer(model)
    except Exception:  # noqa: BLE001 - any failure to load means: no token view
        return None
    if tokenizer is None:
        return None
    cache: dict[int, str] = {}

    def decode(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = tokenizer.decode([token_id])
        return cache[token_id]

    return decode


def _tokenizer(model: str) -> Any:
    from ponder.models.loading import EMBEDDED_NAME, cache_dir

    if model == "tiny":
        from ponder.models.tiny import tiny_tokenizer

        return tiny_tokenizer()
    # The embedded model's tokenizer only where it is converted already: converting
    # loads the whole model (~30 s), too much for a report.
    where = cache_dir() / "models" / EMBEDDED_NAME if model == EMBEDDED_NAME else Path(model)
    if not (where / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where)


def episode_record(trajectory: Trajectory, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """An episode for the browser: reward, breakdown, metrics, and its turns, each as
    pieces with their loss-mask bit ("1": trained on, "0": observation / masked), and
    the step checks' problems (`check/problem`; ponder.eval.trajectory_score, without
    the task: answer guessing, which needs the gold answer, is left out)."""
    spans = _turn_spans(trajectory)
    steps = judge_steps(trajectory)
    score = aggregate_steps(steps)
    turns = []
    for turn, span, step in zip(trajectory.turns, spans, steps):
        if decode is not None and span is not None:
            start, stop = span
            pieces = [decode(token) for token in trajectory.response_ids[start:stop]]
            mask = "".join(str(bit) for bit in trajectory.loss_mask[start:stop])
        else:  # the stored text: the action was generated (1), the observation was not (0)
            pieces = [turn.action] + ([turn.observation] if turn.observation else [])
            mask = "1" + ("0" if turn.observation else "")
        turns.append({
            "index": turn.index, "pieces": pieces, "mask": mask, "reward": _number(turn.reward),
            "answer": turn.answer, "error": turn.error,
            "tool_calls": [{"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}
                           for c in turn.tool_calls],
            "tool_results": [{"name": r.name, "is_error": r.is_error} for r in turn.tool_results],
            "problems": [f"{name}/{problem}" for name, verdict in step.verdicts.items() for problem in verdict or ()],
        })  # fmt: skip
    return {
        "task_id": trajectory.task_id, "reward": _number(trajectory.reward),
        "breakdown": {k: _number(v) for k, v in trajectory.breakdown.items()},
        "metrics": {k: _number(v) for k, v in trajectory.metrics.items()},
        "step_score": _number(score.step_score), "first_bad": score.first_bad,
        "stop_reason": trajectory.stop_reason, "answer": trajectory.final_answer,
        "trained_tokens": sum(trajectory.loss_mask), "masked_tokens": len(trajectory.loss_mask) - sum(trajectory.loss_mask),
        "prompt": _join(decode, trajectory.prompt_ids) if decode is not None else None, "turns": turns,
    }  # fmt: skip


def _turn_spans(trajectory: Trajectory) -> list[tuple[int, int] | None]:
    """Each turn's [start, stop) in response_ids, from its action and observation token
    counts; all None when the counts do not cover the response exactly (agent runs
    record text without token ids)."""
    spans, position = [], 0
    for turn in trajectory.turns:
        stop = position + turn.n_tokens
        spans.append((position, stop))
        position = stop
    if position != len(trajectory.response_ids) or not trajectory.response_ids:
        return [None] * len(trajectory.turns)
    return spans


def _join(decode: Callable[[int], str], ids: list[int]) -> str:
    return "".join(decode(token) for token in ids)


def _number(value: Any) -> float | None:
    """A finite float, or None (JSON has no NaN; the page shows "-")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
