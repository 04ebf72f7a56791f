"""Evaluate a policy on the held-out tasks of any environment: roll out, score, summarise, save."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ponder.config import Recipe, save_recipe
from ponder.envs.base import Env, EnvSpec
from ponder.eval.metrics import summarise
from ponder.fileio import write_json_atomic
from ponder.models import Policy, load_policy
from ponder.rewards import score_trajectories
from ponder.rollout import GenerationBackend, RolloutStats, ScriptedBackend, build_engine
from ponder.types import Task, Trajectory, save_trajectories
from ponder.rollout.build import build_backend
from ponder.wiring import build_env, build_reward


class EvalInputError(ValueError):
    """The evaluation cannot run on what it was given (e.g. no eval tasks)."""


@dataclass
class EvalResult:
    trajectories: list[Trajectory]
    metrics: dict[str, Any]
    stats: RolloutStats
    tasks: list[Task] = field(default_factory=list)


def evaluate(
    recipe: Recipe,
    policy: Policy | None = None,
    on_episode_done: Callable[[Trajectory], None] | None = None,
    on_ready: Callable[[int], None] | None = None,
    oracle: bool = False,
    wrap_env: Callable[[Env], Env] | None = None,
    backend: GenerationBackend | None = None,
) -> EvalResult:
    """Run recipe.eval.episodes held-out tasks (group_size samples each) at
    eval.temperature (0 = greedy) and score them.

    Everything that can fail on bad input (recipe, corpus, tasks, model) is loaded
    before any episode runs. on_ready(n_episodes) is called once loading is done.
    oracle=True replays each task's oracle actions instead of sampling: the ceiling
    (the sampling caps on tokens do not apply to it). wrap_env wraps every episode's
    environment (e.g. to reframe its prompt, ponder.eval.sandbagging); backend
    generates instead of the policy's own sampler (a scripted one in tests).
    """
    if recipe.eval.episodes < 1:
        raise EvalInputError(f"eval.episodes must be at least 1, got {recipe.eval.episodes}")
    if recipe.eval.batch_size < 0:
        raise EvalInputError(f"eval.batch_size must be >= 0 (0 = rollout.batch_size), got {recipe.eval.batch_size}")
    loaded = policy is None
    if policy is None:
        policy = load_policy(
            recipe.model.name, recipe.model.dtype, recipe.model.device, recipe.model.rope_scaling
        )
    if recipe.eval.split not in ("eval", "train"):
        raise EvalInputError(f"eval.split: unknown '{recipe.eval.split}'; valid: eval, train")
    spec = build_env(recipe, policy.tokenizer)
    try:  # the factory (what its episodes share: a sandbox pool …) closes when they are scored
        return _evaluate_on(spec, recipe, policy, on_episode_done, on_ready, oracle, loaded, wrap_env, backend)
    finally:
        spec.close()


def _evaluate_on(
    spec: EnvSpec, recipe: Recipe, policy: Policy, on_episode_done: Callable[[Trajectory], None] | None,
    on_ready: Callable[[int], None] | None, oracle: bool, loaded: bool,
    wrap_env: Callable[[Env], Env] | None = None, backend: GenerationBackend | None = None,
) -> EvalResult:
    """evaluate's episodes: the split's first eval.episodes tasks, rolled out and scored."""
    split = spec.split(recipe.eval.split)
    if not split:
        raise EvalInputError(
            f"env.kind '{recipe.env.kind}': no {recipe.eval.split} tasks (the task file or generator gives none)"
        )
    tasks = split[: recipe.eval.episodes]
    factory = spec.factory if wrap_env is None else _wrapped(spec.factory, wrap_env)
    if backend is None:
        backend = (
            ScriptedBackend(policy.tokenizer, {t.id: t.oracle_actions for t in tasks})
            if oracle
            else build_backend(policy, recipe, replace(recipe.rollout.sampling, temperature=recipe.eval.temperature),
                               seed=recipe.rollout.seed)
        )  # fmt: skip
    rollout = recipe.rollout
    if oracle:  # the ceiling is the solver's, not cut by the policy's sampling caps (as SFT replays it)
        rollout = rollout.uncapped()
    engine = build_engine(backend, factory, rollout)
    if on_ready is not None:
        on_ready(len(tasks) * recipe.rollout.group_size)
    trajectories, stats = engine.run(tasks, on_episode_done)
    tasks_by_id = {task.id: task for task in tasks}
    score_trajectories(trajectories, tasks_by_id, build_reward(recipe, spec, policy))
    metrics = summarise(trajectories, tasks_by_id)
    metrics.update(
        {
            "model": "oracle" if oracle else recipe.model.name,
            **(trained_weights(recipe.model.name) if loaded and not oracle else {}),
            "tokens_per_s": stats.tokens_per_s,
            "generation_s": stats.generation_s,
            "env_s": stats.env_s,
            "wall_s": stats.wall_s,
        }
    )
    return EvalResult(trajectories, metrics, stats, tasks)


def _wrapped(factory: Callable[[], Env], wrap: Callable[[Env], Env]) -> Callable[[], Env]:
    """`factory` whose every episode's environment is `wrap`ped; a factory with its own
    rollout driver (an agent program) has no prompt of ponder's to wrap."""
    if getattr(factory, "driver", None) is not None:
        raise EvalInputError("this environment's episodes run an agent program: ponder cannot reframe its prompts")
    return lambda: wrap(factory())


def trained_weights(model: str) -> dict[str, Any]:
    """Which trained weights `model` (model.name, --model) resolves to when it names a
    ponder run, stage or checkpoint: {"weights": the directory loaded (a run's best/,
    its latest checkpoint, a demo's rl/ or sft/ …), "weights_step": its step, or None
    where the directory does not say}. {} for anything else (a name, a HF directory)."""
    from ponder.models.adapters import find_trained

    path = Path(model)
    found = find_trained(path) if path.is_dir() else None
    if found is None:
        return {}
    return {"weights": str(found), "weights_step": _weights_step(found)}


def _weights_step(directory: Path) -> int | None:
    """A checkpoint's step (its name, step-NNNNNN); for best/, the validation's best step
    in its run's metrics.jsonl; for a stage (sft/, a pipeline stage), its last logged step."""
    from ponder.runlog.metrics_log import read_metrics

    match = re.fullmatch(r"step-(\d+)", directory.name)
    if match:
        return int(match[1])
    run = directory.parent if directory.name == "best" else directory
    key = "val/best_step" if directory.name == "best" else "step"
    try:
        records = read_metrics(run)
    except (OSError, ValueError):
        return None
    steps = [record[key] for record in records if isinstance(record.get(key), (int, float)) and record[key] >= 0]
    return int(steps[-1]) if steps else None


def describe_weights(weights: dict[str, Any]) -> str:
    """` (weights DIR, step N)` for a header line; "" when there are none."""
    if not weights:
        return ""
    step = f", step {weights['weights_step']}" if weights.get("weights_step") is not None else ""
    return f" (weights {weights['weights']}{step})"


def held_out_recipe(recipe: Recipe, episodes: int | None = None, samples: int = 1) -> Recipe:
    """The recipe for held-out evaluation: `samples` episodes per task (one, unless pass@k
    is wanted) at eval.temperature (0 = greedy), eval.batch_size episodes at a time."""
    sampling = replace(recipe.rollout.sampling, temperature=recipe.eval.temperature)
    batch_size = recipe.eval.batch_size or recipe.rollout.batch_size
    rollout = replace(recipe.rollout, sampling=sampling, group_size=samples, batch_size=batch_size)
    evaluation = replace(recipe.eval, episodes=episodes) if episodes is not None else recipe.eval
    return replace(recipe, rollout=rollout, eval=evaluation)


def save_result(result: EvalResult, recipe: Recipe, out_dir: str | Path) -> None:
    """Write trajectories.parquet, metrics.json and recipe.yaml, each atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_trajectories(result.trajectories, out / "trajectories.parquet")
    write_json_atomic(out / "metrics.json", result.metrics)
    save_recipe(recipe, out / "recipe.yaml")
