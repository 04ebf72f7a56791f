"""Self-improvement by rejection-sampling fine-tuning (RFT) with STaR's rationalisation.

Each round: sample K answers per training task, keep the verified ones (the reward's
`verified` component is 1), retry each task with no verified answer with its answer
as a hint and keep a hinted answer that verifies (trained on without the hint: STaR's
rationalisation), SFT on what was kept, evaluate on held-out tasks. A round reports
held-out accuracy with its standard error, pass@1 and pass@K of its samples, and
diversity (distinct answers and responses per task, word-bigram entropy), so a loop
that collapses onto one answer per task shows it before its accuracy does.

Kept responses whose work does not reach their answer (rewards.hacking.answer_guessing)
are left out by default: a hint invites the model to write the answer and nothing else,
and training on that teaches guessing.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ponder.config import Recipe, save_recipe
from ponder.eval.passk import pass_at_k
from ponder.eval.runner import evaluate, held_out_recipe
from ponder.fileio import write_json_atomic
from ponder.models import Policy
from ponder.models.adapters import load_adapter_weights, save_trained
from ponder.models.memory import release_memory
from ponder.models.prepare import prepare_policy
from ponder.rewards import score_trajectories
from ponder.rewards.hacking import action_text, answer_guessing
from ponder.rewards.math import predicted_answer
from ponder.rollout import RolloutEngine, ScriptedBackend, build_engine
from ponder.rollout.build import build_backend
from ponder.runlog.metrics_log import MetricsLog
from ponder.runlog.plot import plot_rounds
from ponder.runlog.progress import item_progress
from ponder.train.sft import sft_train
from ponder.types import Task, Trajectory
from ponder.wiring import build_env, build_reward, train_tasks


def check_improve(recipe: Recipe) -> None:
    """Refuse counts that would make a round empty, naming the key."""
    cfg = recipe.improve
    for key in ("rounds", "samples", "max_per_task", "eval_episodes"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"improve.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.tasks < 0:
        raise ValueError(f"improve.tasks must be >= 0 (0 = all), got {cfg.tasks}")
    if "{answer}" not in cfg.hint:
        raise ValueError("improve.hint must hold {answer}, where the gold answer goes")


def verified(trajectory: Trajectory, component: str) -> bool:
    """The verifier's component is 1 (an unscorable episode is not verified)."""
    return trajectory.breakdown.get(component, 0.0) >= 1.0


def diversity(trajectories: list[Trajectory]) -> dict[str, float]:
    """Per task (group): distinct final answers / samples and distinct responses /
    samples, averaged; and the entropy (bits) of word bigrams over all actions."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_id].append(trajectory)
    answers = [len({str(predicted_answer(t)) for t in g}) / len(g) for g in groups.values()]
    responses = [len({action_text(t) for t in g}) / len(g) for g in groups.values()]
    bigrams: Counter[tuple[str, str]] = Counter()
    for trajectory in trajectories:
        words = action_text(trajectory).split()
        bigrams.update(zip(words, words[1:]))
    total = sum(bigrams.values())
    entropy = -sum(c / total * math.log2(c / total) for c in bigrams.values()) if total else 0.0
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"diversity/distinct_answers": mean(answers), "diversity/distinct_responses": mean(responses),
            "diversity/bigram_entropy": entropy}  # fmt: skip


def pass_rates(trajectories: list[Trajectory], component: str, k: int) -> dict[str, float]:
    """pass@1 and pass@k (unbiased estimator) of the round's samples, over tasks."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_id].append(verified(trajectory, component))
    at = lambda j: sum(pass_at_k(len(g), sum(g), j) for g in groups.values()) / len(groups)  # noqa: E731
    return {"samples/pass@1": at(1), f"samples/pass@{k}": at(k)}


def keep(trajectories: list[Trajectory], tasks_by_id: dict[str, Task], cfg: Any) -> tuple[list[Trajectory], int]:
    """The verified, distinct (by action text) responses, at most max_per_task per task;
    with drop_guesses, not those whose work does not reach the answer. Returns (kept,
    guesses dropped)."""
    kept, seen, dropped = [], set(), 0
    per_task: Counter[str] = Counter()
    for trajectory in trajectories:
        key = (trajectory.task_id, action_text(trajectory))
        if not verified(trajectory, cfg.verified) or key in seen or per_task[trajectory.task_id] >= cfg.max_per_task:
            continue
        if cfg.drop_guesses and answer_guessing(trajectory, tasks_by_id[trajectory.task_id]):
            dropped += 1
            continue
        seen.add(key)
        per_task[trajectory.task_id] += 1
        kept.append(trajectory)
    return kept, dropped


def hinted(task: Task, hint: str) -> Task:
    """The task with its answer as a hint after the question (same id: the hinted
    episode is replayed on the original task)."""
    return replace(task, question=f"{task.question} {hint.format(answer=task.answers[0])}")


def replay(policy: Policy, episodes: list[Trajectory], tasks_by_id: dict[str, Task], factory: Any,
           recipe: Recipe) -> list[Trajectory]:  # fmt: skip
    """Each episode's actions replayed on its task's own (un-hinted) prompt through the
    environment: what SFT trains on for a rationalisation."""
    if not episodes:
        return []
    scripts = {t.task_id: [turn.action for turn in t.turns] for t in episodes}
    tasks = [tasks_by_id[task_id] for task_id in scripts]
    rollout = replace(recipe.rollout.uncapped(), group_size=1, batch_size=max(1, len(tasks)))
    trajectories, _ = RolloutEngine(ScriptedBackend(policy.tokenizer, scripts), factory, rollout).run(tasks)
    return trajectories


def sample(policy: Policy, tasks: list[Task], recipe: Recipe, spec: Any, reward: Any, k: int, seed: int,
           label: str = "samples") -> list[Trajectory]:  # fmt: skip
    """`k` scored episodes per task at the recipe's sampling settings."""
    rollout = replace(recipe.rollout, group_size=k)
    backend = build_backend(policy, recipe, seed=seed)
    with item_progress(label, len(tasks) * k) as advance:
        trajectories, _ = build_engine(backend, spec.factory, rollout).run(tasks, advance)
    score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
    release_memory()
    return trajectories


def held_out_accuracy(recipe: Recipe, policy: Policy) -> dict[str, float]:
    """Greedy held-out accuracy (the verified component's mean) and its standard error."""
    with item_progress("held-out", recipe.improve.eval_episodes) as advance:
        result = evaluate(held_out_recipe(recipe, recipe.improve.eval_episodes), policy, advance)
    values = [t.breakdown.get(recipe.improve.verified, 0.0) for t in result.trajectories]
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")
    release_memory()
    return {"eval/accuracy": mean, "eval/accuracy_se": se, "eval/episodes": float(n), "eval/reward": result.metrics["reward"]}


def improve_round(policy: Policy, recipe: Recipe, spec: Any, reward: Any, tasks: list[Task], index: int) -> dict[str, float]:
    """One round: sample, keep, rationalise, SFT, evaluate. Returns its metrics."""
    cfg, tick = recipe.improve, time.perf_counter()
    by_id = {task.id: task for task in tasks}
    samples = sample(policy, tasks, recipe, spec, reward, cfg.samples, recipe.train.seed + index,
                     f"round {index} samples")  # fmt: skip
    metrics: dict[str, float] = {**pass_rates(samples, cfg.verified, cfg.samples), **diversity(samples)}
    kept, dropped = keep(samples, by_id, cfg)
    solved = {t.task_id for t in kept}
    rationalised: list[Trajectory] = []
    if cfg.rationalize:
        failed = [hinted(task, cfg.hint) for task in tasks if task.id not in solved]
        if failed:
            retried = sample(policy, failed, recipe, spec, reward, 1, recipe.train.seed + 7919 * index,
                             f"round {index} hinted")  # fmt: skip
            good, more_dropped = keep(retried, {t.id: t for t in failed}, replace(cfg, max_per_task=1))
            dropped += more_dropped
            rationalised = [t for t in replay(policy, good, by_id, spec.factory, recipe) if t.turns]
    data = kept + rationalised
    metrics.update({"data/kept": float(len(kept)), "data/rationalised": float(len(rationalised)),
                    "data/guesses_dropped": float(dropped), "data/tasks_solved": len(solved) / len(tasks)})  # fmt: skip
    if data:
        with item_progress(f"round {index} SFT steps", recipe.sft.steps) as advance:
            history = sft_train(policy, data, recipe.sft, recipe.train.seed + index, recipe.algo.micro_batch_size,
                                advance)  # fmt: skip
        metrics["sft/loss_first"], metrics["sft/loss_last"] = history[0]["sft/loss"], history[-1]["sft/loss"]
    release_memory()
    metrics.update(held_out_accuracy(recipe, policy))
    metrics["time/round_s"] = time.perf_counter() - tick
    return metrics


def run_improve(recipe: Recipe, out: str | Path, sft_from: str | Path | None = None,
                say: Callable[[str], None] = print) -> list[dict[str, float]]:  # fmt: skip
    """recipe.improve.rounds rounds from the recipe's policy (with `sft_from`'s trained
    weights: a run's SFT directory or a demo run holding sft/). Writes metrics.jsonl
    (step = round; round 0 = before any round), results.json, recipe.yaml and
    each round's weights in round-NN/. Returns the per-round records."""
    check_improve(recipe)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_recipe(recipe, out / "recipe.yaml")
    policy = prepare_policy(recipe)
    if sft_from is not None:
        weights = Path(sft_from) / "sft" if (Path(sft_from) / "sft").is_dir() else Path(sft_from)
        load_adapter_weights(policy.model, weights)
    spec = build_env(recipe, policy.tokenizer)
    reward = build_reward(recipe, spec, policy)
    tasks = train_tasks(recipe, spec)
    tasks = tasks[: recipe.improve.tasks] if recipe.improve.tasks else tasks
    records = [{"round": 0, **held_out_accuracy(recipe, policy)}]
    say(_line(records[0]))
    with spec, MetricsLog(out, tensorboard=False) as log:  # spec: its factory closes with the rounds
        log.log(0, {key: value for key, value in records[0].items() if key != "round"})
        for index in range(1, recipe.improve.rounds + 1):
            metrics = improve_round(policy, recipe, spec, reward, tasks, index)
            save_trained(policy, out / f"round-{index:02d}")
            records.append({"round": index, **metrics})
            log.log(index, metrics)
            say(_line(records[-1]))
            write_json_atomic(out / "results.json", {"rounds": records, "sft_from": str(sft_from or "")})
            plot_rounds(records, out / "rounds.png")
    return records


def _line(record: dict[str, Any]) -> str:
    parts = [f"round {record['round']}: held-out accuracy {record['eval/accuracy']:.3f} ± {record['eval/accuracy_se']:.3f}"]
    if "samples/pass@1" in record:
        parts.append(f"pass@1 {record['samples/pass@1']:.3f}  kept {record['data/kept']:.0f}"
                     f" (+{record['data/rationalised']:.0f} rationalised)"
                     f"  distinct answers {record['diversity/distinct_answers']:.2f}")  # fmt: skip
    return "  ".join(parts)
