"""`ponder export-data`: trajectories, SFT / DPO data and tasks out in TRL's and verl's
dataset layouts (ponder.data.export).

What is read, by what SOURCE is:
- a run directory (its `trajectories.parquet`, `eval-*.parquet`, `round-*.parquet`)
  or one such trajectory file: the episodes, with the run's recipe (`recipe.yaml`
  beside them, or --recipe) rebuilding each task's opening messages. They give
  conversations (episodes that answered, at least --min-reward), preference pairs
  (per task, the best and the worst episode when they scored apart) and the tasks;
- SFT data (rows with `messages`) or DPO data (`prompt` / `chosen` / `rejected`), as
  `ponder sft` / `ponder dpo` read them;
- anything else a task source is (a task file, verl or TRL data, `hf:…`), read with
  the recipe's env.columns / env.format when --recipe is given;
- no SOURCE: the --recipe's own tasks of --split.
Task prompts are the environment's opening messages when a recipe is known, else
the task's own chat, else its question as one user message.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ponder.config import Recipe, load_recipe
from ponder.data import load_conversations, load_preferences, read_rows
from ponder.data.convert import preference_from_trajectories, successful_conversations
from ponder.data.export import ExportRecords, export_rows
from ponder.data.records import DataError
from ponder.envs.base import close_env, load_tasks_from, opening_of, recipe_tasks
from ponder.types import Task, Trajectory, load_trajectories
from ponder.wiring import build_env

TRAJECTORY_FILES = ("trajectories.parquet", "eval-*.parquet", "round-*.parquet")
PromptOf = Callable[[Task], list[dict[str, Any]]]


def export_data(source: str | None, layout: str, out: str, recipe_path: str | None = None, split: str = "train",
                min_reward: float | None = None, data_source: str = "") -> int:  # fmt: skip
    """Write SOURCE (or the recipe's tasks) in `layout` to `out`; the number of rows."""
    trajectory_files = _trajectory_files(Path(source)) if source else []
    if trajectory_files and recipe_path is None:
        recipe_path = str(_run_recipe(Path(source)))
    recipe = load_recipe(recipe_path) if recipe_path else None
    if trajectory_files:
        records = _from_trajectories(trajectory_files, recipe or Recipe(), min_reward)
    elif source:
        records = _from_data(source, recipe)
    elif recipe is not None:
        with build_env(recipe) as spec:
            tasks = spec.split(split)
            records = ExportRecords(prompts=_prompts(tasks, _env_prompt(spec)))
    else:
        raise DataError("export-data: give a SOURCE (a run, trajectories, SFT/DPO data or tasks) or --recipe")
    records.data_source, records.split = data_source, split
    return export_rows(records, layout, out)


def _trajectory_files(path: Path) -> list[Path]:
    """The trajectory Parquet files `path` is or holds (none for other data)."""
    if path.is_dir():
        return sorted({file for pattern in TRAJECTORY_FILES for file in path.glob(pattern)})
    if path.suffix != ".parquet" or not path.is_file():
        return []
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    return [path] if {"task_id", "turns", "response_ids"} <= names else []


def _run_recipe(source: Path) -> Path:
    recipe = (source if source.is_dir() else source.parent) / "recipe.yaml"
    if not recipe.is_file():
        raise DataError(f"{source}: no recipe.yaml beside the trajectories; give the run's recipe with --recipe")
    return recipe


def _env_prompt(spec: Any) -> PromptOf:
    """The opening messages an episode of `spec`'s environment shows for a task."""

    def prompt_of(task: Task) -> list[dict[str, Any]]:
        env = spec.factory()
        try:
            return opening_of(env.reset(task)).messages
        finally:
            close_env(env)

    return prompt_of


def _own_prompt(task: Task) -> list[dict[str, Any]]:
    own = task.metadata.get("messages")
    return list(own) if isinstance(own, list) and own else [{"role": "user", "content": task.question}]


def _prompts(tasks: list[Task], prompt_of: PromptOf) -> list[tuple[Task, list[dict[str, Any]]]]:
    return [(task, prompt_of(task)) for task in tasks]


def _from_trajectories(files: list[Path], recipe: Recipe, min_reward: float | None) -> ExportRecords:
    trajectories = [trajectory for file in files for trajectory in load_trajectories(file)]
    with build_env(recipe) as spec:
        tasks_by_id = {task.id: task for task in [*spec.train, *spec.eval]}
        unknown = sorted({t.task_id for t in trajectories} - set(tasks_by_id))
        if unknown:
            raise DataError(f"{files[0]}: task {unknown[0]!r} is not among the recipe's tasks; give the run's "
                            "recipe with --recipe")  # fmt: skip
        prompt_of = _env_prompt(spec)
        ids = list(dict.fromkeys(t.task_id for t in trajectories))
        prompts = {task_id: prompt_of(tasks_by_id[task_id]) for task_id in ids}
    conversations = successful_conversations(trajectories, tasks_by_id, lambda task: prompts[task.id], [],
                                             min_reward)  # fmt: skip
    pairs = []
    for task_id in ids:
        scored = [t for t in trajectories if t.task_id == task_id and t.reward is not None]
        best, worst = max(scored, key=_reward, default=None), min(scored, key=_reward, default=None)
        if best is not None and worst is not None and _reward(best) > _reward(worst):
            pairs.append(preference_from_trajectories(best, worst, tasks_by_id[task_id], prompts[task_id], []))
    return ExportRecords(conversations, pairs, [(tasks_by_id[i], prompts[i]) for i in ids])


def _reward(trajectory: Trajectory) -> float:
    return float(trajectory.reward if trajectory.reward is not None else 0.0)


def _from_data(source: str, recipe: Recipe | None) -> ExportRecords:
    if not source.startswith("hf:"):
        rows = read_rows(source, max_rows=1)
        first = rows[0] if rows and isinstance(rows[0], dict) else {}
        if "messages" in first:
            return ExportRecords(conversations=_usable(load_conversations(source), source))
        if "chosen" in first and "rejected" in first:
            return ExportRecords(preferences=_usable(load_preferences(source), source))
    if recipe is None:
        return ExportRecords(prompts=_prompts(load_tasks_from(source), _own_prompt))
    tasks = recipe_tasks(recipe.env, source)
    with build_env(recipe) as spec:
        return ExportRecords(prompts=_prompts(tasks, _env_prompt(spec)))


def _usable(loaded: tuple[list[Any], Any], source: str) -> list[Any]:
    records, report = loaded
    if not records:
        raise DataError(f"{source}: no usable rows ({report.to_dict()})")
    return records
