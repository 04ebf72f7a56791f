"""Self-refine: generate → critique → revise, scored by the verifier after each revision.

Round 0 answers each held-out task. Each later round asks a critic (the same policy by
default, or a served judge model) to check the last answer, then runs the episode
again with the last answer and the critique under the question, and scores the
revision with the recipe's reward. A task stops being revised once a revision does not
score higher than what it replaced (the verifier's score stopped improving), or when
the round budget ends.

Reported: the monotone-improvement rate (revisions that score higher than what they
replaced, over all revisions), the regression rate (lower), and the accuracy before
refinement, after it taking each task's last revision (what a user without the
verifier gets) and after it keeping each task's best-scored answer (the verifier
chooses: an upper bound that needs the verifier at inference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ponder.config import Recipe
from ponder.envs.base import EnvSpec
from ponder.rewards import score_trajectories
from ponder.rollout import build_engine
from ponder.types import Task, Trajectory
from ponder.rollout.build import build_backend
from ponder.wiring import build_env, build_reward

CRITIQUE_PROMPT = (
    "Check this solution to the problem step by step. Name the first wrong step, or say "
    "that it is correct.\n\nProblem: {question}\n\nSolution:\n{response}"
)
REVISION = (
    "\n\nA previous attempt:\n{response}\n\nFeedback on it:\n{critique}\n\n"
    "Solve the problem again, fixing any mistake."
)


@dataclass
class RefineResult:
    """Per task, the verified score of round 0 and of each revision it got."""

    scores: dict[str, list[float]] = field(default_factory=dict)
    trajectories: list[list[Trajectory]] = field(default_factory=list)  # per round
    critiques: list[dict[str, str]] = field(default_factory=list)  # per revision round: task id → critique


def refinement_stats(scores: dict[str, Sequence[float]]) -> dict[str, float]:
    """From each task's score sequence (round 0, then each revision it got):
    monotone_improvement_rate, regression_rate, revisions, accuracy_before,
    accuracy_after_last (each task's last answer), accuracy_after_best (its best one)."""
    pairs = [(old, new) for seq in scores.values() for old, new in zip(seq, seq[1:])]
    n = len(scores)
    rate = lambda hits: hits / len(pairs) if pairs else float("nan")  # noqa: E731
    return {
        "refine/monotone_improvement_rate": rate(sum(new > old for old, new in pairs)),
        "refine/regression_rate": rate(sum(new < old for old, new in pairs)),
        "refine/revisions": float(len(pairs)),
        "refine/accuracy_before": sum(seq[0] for seq in scores.values()) / n,
        "refine/accuracy_after_last": sum(seq[-1] for seq in scores.values()) / n,
        "refine/accuracy_after_best": sum(max(seq) for seq in scores.values()) / n,
    }


def revised_task(task: Task, previous: Trajectory, critique: str) -> Task:
    """The task with the last attempt and its critique under the question (same id,
    so the reward scores the revision against the task's own answers)."""
    response = previous.response_text.strip()
    return replace(task, question=task.question + REVISION.format(response=response, critique=critique.strip()))


def refine(recipe: Recipe, policy: Any, rounds: int, critic: Callable[[list[dict[str, str]]], str],
           verified: str = "correct", episodes: int | None = None) -> RefineResult:  # fmt: skip
    """Run `rounds` critique-and-revise rounds over the first `episodes` held-out tasks
    (eval.episodes when None), greedy at eval.temperature; `verified` names the reward
    component that scores an answer (1 = right)."""
    if rounds < 1:
        raise ValueError(f"refine: rounds must be >= 1, got {rounds}")
    with build_env(recipe, policy.tokenizer) as spec:  # its factory closes when the rounds end
        return _refine(spec, recipe, policy, rounds, critic, verified, episodes)


def _refine(spec: EnvSpec, recipe: Recipe, policy: Any, rounds: int, critic: Callable[[list[dict[str, str]]], str],
            verified: str, episodes: int | None) -> RefineResult:  # fmt: skip
    reward = build_reward(recipe, spec, policy)
    tasks = spec.eval[: episodes or recipe.eval.episodes]
    sampling = replace(recipe.rollout.sampling, temperature=recipe.eval.temperature)
    rollout = replace(recipe.rollout, group_size=1, batch_size=recipe.eval.batch_size or recipe.rollout.batch_size)
    by_id = {task.id: task for task in tasks}

    def attempt(batch: list[Task]) -> dict[str, Trajectory]:
        backend = build_backend(policy, recipe, sampling, seed=recipe.rollout.seed)
        trajectories, _ = build_engine(backend, spec.factory, replace(rollout, sampling=sampling)).run(batch)
        score_trajectories(trajectories, by_id, reward)
        return {t.task_id: t for t in trajectories}

    last = attempt(tasks)
    result = RefineResult({tid: [t.breakdown.get(verified, 0.0)] for tid, t in last.items()}, [list(last.values())])
    active = list(tasks)
    for _ in range(rounds):
        if not active:
            break
        critiques = {task.id: critic([{"role": "user", "content": CRITIQUE_PROMPT.format(
            question=task.question, response=last[task.id].response_text.strip())}]) for task in active}  # fmt: skip
        revised = attempt([revised_task(task, last[task.id], critiques[task.id]) for task in active])
        still = []
        for task in active:
            score = revised[task.id].breakdown.get(verified, 0.0)
            improved = score > result.scores[task.id][-1]
            result.scores[task.id].append(score)
            last[task.id] = revised[task.id]
            if improved:
                still.append(task)
        result.trajectories.append(list(revised.values()))
        result.critiques.append(critiques)
        active = still
    return result
