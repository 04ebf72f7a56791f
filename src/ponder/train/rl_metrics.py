"""Per-step metrics of a batch of scored episodes, including collapse signals."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ponder.eval.metrics import mean
from ponder.rewards.hacking import HackingMonitor, hacking_metrics
from ponder.types import Task, Trajectory


# the rollout engine's own per-episode counts (rollout.engine.finalise) logged each step;
# its others (tool_calls, tool_errors, prompt_tokens, tool_calls/<name>) stay in the trajectories
ENGINE_COUNTS = ("turns", "generated_tokens", "response_tokens", "parse_errors", "answered")
_UNLOGGED = ("tool_calls", "tool_errors", "prompt_tokens")


def env_counts(trajectories: list[Trajectory]) -> list[str]:
    """The environment's own per-episode counts (its info["metrics"], e.g. search-QA's
    `searches`): every plain name the trajectories carry beyond the engine's."""
    names = {name for t in trajectories for name in t.metrics if "/" not in name}
    return sorted(names - set(ENGINE_COUNTS) - set(_UNLOGGED))


def episode_metrics(trajectories: list[Trajectory], kinds: dict[str, str] | None = None) -> dict[str, float]:
    """reward/* (mean, std, each breakdown component), episode/* counts (the engine's and
    the environment's own, missing = 0), context/* (compactions and empty policy
    summaries per episode, with rollout.context), collapse/*, and with `kinds` (task id → task
    kind) kind/<kind>/reward and kind/<kind>/<the environment's counts> per kind.

    collapse/tied_groups: share of groups whose rewards all tie (they carry no
    group-relative signal). collapse/distinct_ratio: distinct responses per group
    over group size, averaged (1 = all different, 1/G = all identical).
    """
    rewards = [t.reward for t in trajectories if t.reward is not None]
    centre = mean(rewards)
    metrics = {
        "reward/mean": centre,
        "reward/std": mean([(r - centre) ** 2 for r in rewards]) ** 0.5 if rewards else float("nan"),
    }
    for name in sorted({k for t in trajectories for k in t.breakdown}):
        metrics[f"reward/{name}"] = mean([t.breakdown[name] for t in trajectories if name in t.breakdown])
    own = env_counts(trajectories)
    for name in (*own, *ENGINE_COUNTS):
        metrics[f"episode/{name}"] = mean([t.metrics.get(name, 0.0) for t in trajectories])
    for name in sorted({k for t in trajectories for k in t.metrics if k.startswith("context/")}):
        metrics[name] = mean([t.metrics.get(name, 0.0) for t in trajectories])  # rollout.context, per episode
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id].append(trajectory)
    tied = [len({t.reward for t in group}) == 1 for group in groups.values()]
    distinct = [len({tuple(t.response_ids) for t in group}) / len(group) for group in groups.values()]
    metrics["collapse/tied_groups"] = mean([float(x) for x in tied])
    metrics["collapse/distinct_ratio"] = mean(distinct)
    by_kind: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        if kinds and trajectory.task_id in kinds:
            by_kind[kinds[trajectory.task_id]].append(trajectory)
    for kind, group in sorted(by_kind.items()):
        metrics[f"kind/{kind}/reward"] = mean([t.reward for t in group if t.reward is not None])
        for name in own:
            metrics[f"kind/{kind}/{name}"] = mean([t.metrics.get(name, 0.0) for t in group])
    return metrics


def hacking_step_metrics(
    trajectories: list[Trajectory], tasks: list[Task], shaping: Any, monitor: HackingMonitor
) -> dict[str, float]:
    """The step's reward-hacking rates (`hacking/*`, ponder.rewards.hacking) and the
    trend flags `monitor` derives from them and the steps before."""
    metrics = hacking_metrics(trajectories, {task.id: task for task in tasks}, shaping)
    metrics.update(monitor.observe(metrics))
    return metrics


EPISODE_COLUMNS = ["task", "question", "response", "reward"]


def episode_table(trajectories: list[Trajectory], tasks: list[Task], n: int) -> tuple[list[str], list[list[Any]]]:
    """The first `n` episodes as rows (task id, question, response text, reward; an
    unscorable reward as NaN): the sampled-episodes table the trackers show."""
    questions = {task.id: task.question for task in tasks}
    rows = [
        [t.task_id, questions.get(t.task_id, ""), t.response_text, float("nan") if t.reward is None else t.reward]
        for t in trajectories[:n]
    ]
    return list(EPISODE_COLUMNS), rows
