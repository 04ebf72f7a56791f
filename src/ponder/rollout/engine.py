"""Batched multi-turn rollouts: many episodes at once, turn by turn.

Each round, every active episode generates one action in a single batched call;
episodes whose action called a tool get its observation appended (loss_mask 0)
while nothing else is generated for them; finished episodes leave the pool and
queued ones take their place, so the batch stays full.

Token bookkeeping is exact: an episode's context is prompt_ids + response_ids as
token ids, never re-tokenised text, so the trainer scores exactly what was sampled.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ponder.config import RolloutConfig
from ponder.envs.base import Env, close_env, opening_of
from ponder.models.chat import encode_chat
from ponder.plugins import import_object
from ponder.rollout.backend import Generation, GenerationBackend, GenerationRequest
from ponder.rollout.constrain import action_constraint
from ponder.types import Task, Trajectory, Turn


@dataclass
class RolloutStats:
    """Where the time went in one rollout call."""

    episodes: int = 0
    generated_tokens: int = 0
    generation_s: float = 0.0
    env_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.generation_s if self.generation_s > 0 else 0.0


@dataclass
class _Episode:
    key: str
    task: Task
    env: Env
    trajectory: Trajectory
    context: list[int] = field(default_factory=list)


class RolloutEngine:
    """Runs tasks × group_size episodes through a backend and fresh environments."""

    def __init__(self, backend: GenerationBackend, env_factory: Callable[[], Env], config: RolloutConfig) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.env_factory = env_factory
        self.config = config

    def run(
        self, tasks: list[Task], on_episode_done: Callable[[Trajectory], None] | None = None
    ) -> tuple[list[Trajectory], RolloutStats]:
        """Roll out every task group_size times; trajectories come back in task order.

        Each episode's environment is closed (`close_env`) as the episode ends, also
        when its step raised; if the run itself fails, every environment still open is."""
        stats = RolloutStats()
        start = time.perf_counter()
        seen: dict[str, int] = defaultdict(int)  # a task listed twice gets fresh sample numbers
        queue: deque[_Episode] = deque()
        finished: dict[str, Trajectory] = {}
        active: list[_Episode] = []
        closed: set[str] = set()
        try:
            for task in tasks:
                for _ in range(self.config.group_size):
                    queue.append(self._new_episode(task, seen[task.id]))
                    seen[task.id] += 1
            order = [ep.key for ep in queue]
            while queue or active:
                while queue and len(active) < self.config.batch_size:
                    active.append(queue.popleft())
                still_running = []
                for episode, done in self._round(active, stats):
                    if not done:
                        still_running.append(episode)
                        continue
                    closed.add(episode.key)
                    close_env(episode.env)
                    finalise(episode.trajectory)
                    finished[episode.key] = episode.trajectory
                    if on_episode_done is not None:
                        on_episode_done(episode.trajectory)
                active = still_running
        finally:
            for episode in [*active, *queue]:  # the run failed: nothing else will close them
                if episode.key not in closed:
                    close_env(episode.env)
        stats.episodes = len(finished)
        stats.wall_s = time.perf_counter() - start
        return [finished[key] for key in order], stats

    def _new_episode(self, task: Task, sample: int) -> _Episode:
        env = self.env_factory()
        try:
            opening = opening_of(env.reset(task))
        except BaseException:
            close_env(env)
            raise
        prompt_ids = encode_chat(self.tokenizer, opening.messages)
        trajectory = Trajectory(task_id=task.id, prompt_ids=prompt_ids, group_id=task.id)
        trajectory.constraint = action_constraint(self.config.constrain, opening.tools)
        return _Episode(f"{task.id}#{sample}", task, env, trajectory, list(prompt_ids))

    def _round(self, active: list[_Episode], stats: RolloutStats) -> list[tuple[_Episode, bool]]:
        """One action for every active episode; returns each with whether it ended."""
        sampling = self.config.sampling
        results: list[tuple[_Episode, bool]] = []
        runnable = []
        for episode in active:
            budget = min(sampling.max_new_tokens_per_turn, sampling.max_total_tokens - len(episode.context))
            if budget <= 0:
                episode.trajectory.stop_reason = "max_tokens"
                results.append((episode, True))
            else:
                request = GenerationRequest(episode.key, episode.context, budget, episode.trajectory.constraint)
                runnable.append((episode, request))
        if not runnable:
            return results
        stop_strings = runnable[0][0].env.stop_strings
        tick = time.perf_counter()
        generations = self.backend.generate([request for _, request in runnable], stop_strings)
        stats.generation_s += time.perf_counter() - tick
        tick = time.perf_counter()
        for (episode, _), generation in zip(runnable, generations):
            stats.generated_tokens += len(generation.token_ids)
            results.append((episode, self._apply(episode, generation)))
        stats.env_s += time.perf_counter() - tick
        return results

    def _apply(self, episode: _Episode, generation: Generation) -> bool:
        """Append the action and the environment's answer; True when the episode ended."""
        trajectory = episode.trajectory
        _extend(episode, generation.token_ids, generation.logprobs, policy_generated=True)
        index = len(trajectory.turns)
        try:
            observation, done, info = episode.env.step(generation.text)
        except Exception as err:  # noqa: BLE001 - a broken environment ends its episode, never the run
            observation, done = None, True
            info = {"turn": Turn(index, generation.text, error=f"env error: {type(err).__name__}: {err}"),
                    "stop_reason": "env_error"}  # fmt: skip
        turn: Turn = info.get("turn") or Turn(index, generation.text)
        if info.get("reward") is not None:
            turn.reward = float(info["reward"])
        for name, value in (info.get("metrics") or {}).items():  # the environment's own counts
            trajectory.metrics[name] = trajectory.metrics.get(name, 0.0) + float(value)
        turn.n_action_tokens = len(generation.token_ids)
        trajectory.turns.append(turn)
        if done:
            trajectory.stop_reason = info.get("stop_reason", "done")
            return True
        observation_ids = self.tokenizer.encode(observation or "", add_special_tokens=False)
        if len(episode.context) + len(observation_ids) >= self.config.sampling.max_total_tokens:
            turn.observation = None  # no room to show it, nor to act on it
            trajectory.stop_reason = "max_tokens"
            return True
        _extend(episode, observation_ids, [0.0] * len(observation_ids), policy_generated=False)
        turn.n_observation_tokens = len(observation_ids)
        return False


def build_engine(backend: GenerationBackend, env_factory: Callable[[], Env], config: RolloutConfig) -> Any:
    """What rolls out episodes of `env_factory`: this engine, or the driver the factory
    names (`factory.driver`, an import path of a class built like RolloutEngine, with the
    same `run`): an agent program's episodes run through the gateway so."""
    driver = getattr(env_factory, "driver", None)
    if driver is None:
        return RolloutEngine(backend, env_factory, config)
    return import_object(driver, "environment driver")(backend, env_factory, config)


def _extend(episode: _Episode, token_ids: list[int], logprobs: list[float], policy_generated: bool) -> None:
    trajectory = episode.trajectory
    trajectory.response_ids.extend(token_ids)
    trajectory.loss_mask.extend([1 if policy_generated else 0] * len(token_ids))
    trajectory.old_logprobs.extend(logprobs)
    episode.context.extend(token_ids)


def finalise(trajectory: Trajectory) -> None:
    """Per-episode counts every report and reward reads: turns, tool calls (all, and
    `tool_calls/<name>` per tool called), errors, tokens, whether it answered; beside
    them the environment's own counts (its `info["metrics"]`, summed over the turns)."""
    trajectory.check()
    turns = trajectory.turns
    per_tool: dict[str, float] = defaultdict(float)
    for call in (c for t in turns for c in t.tool_calls):
        per_tool[f"tool_calls/{call.name}"] += 1.0
    trajectory.metrics.update(
        {
            "turns": float(len(turns)),
            "tool_calls": float(sum(len(t.tool_calls) for t in turns)),
            **per_tool,
            "tool_errors": float(sum(r.is_error for t in turns for r in t.tool_results)),
            "parse_errors": float(sum(t.error is not None for t in turns)),
            "generated_tokens": float(sum(trajectory.loss_mask)),
            "response_tokens": float(len(trajectory.response_ids)),
            "prompt_tokens": float(len(trajectory.prompt_ids)),
            "answered": float(trajectory.final_answer is not None),
        }
    )
