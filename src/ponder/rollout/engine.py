"""Batched multi-turn rollouts: many episodes at once, turn by turn.

Each round, every active episode generates one action in a single batched call;
episodes whose action called a tool get its observation appended (loss_mask 0)
while nothing else is generated for them; finished episodes leave the pool and
queued ones take their place, so the batch stays full.

Token bookkeeping is exact: an episode's context is prompt_ids + response_ids as
token ids, never re-tokenised text, so the trainer scores exactly what was sampled.
With rollout.context (compaction) an episode that would outgrow the window starts its
context again (rollout/compaction.py) and records where (Trajectory.segments); its
response stays one stream.
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
from ponder.rollout.compaction import restart_context, without_eos
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
class _Pending:
    """A compaction waiting for the policy's summary (written in the next round): the
    turn it happens in and the observation to show after it."""

    turn: Turn
    observation_ids: list[int]


@dataclass
class _Episode:
    key: str
    task: Task
    env: Env
    trajectory: Trajectory
    context: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the opening's, which a compaction renders again
    pending: _Pending | None = None


class RolloutEngine:
    """Runs tasks × group_size episodes through a backend and fresh environments."""

    def __init__(self, backend: GenerationBackend, env_factory: Callable[[], Env], config: RolloutConfig) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.env_factory = env_factory
        self.config = config
        self._instruction: list[int] = []  # the policy summariser's, and the ends of a summary
        self._eos: set[int] = set()
        if config.context.max_tokens:
            self._instruction = self.tokenizer.encode(config.context.instruction, add_special_tokens=False)
            self._eos = set(getattr(backend, "eos_ids", None) or {self.tokenizer.eos_token_id})

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
        window, action = self.config.context.max_tokens, self.config.sampling.max_new_tokens_per_turn
        if window:
            if len(prompt_ids) + action > window:
                close_env(env)
                raise ValueError(f"rollout.context.max_tokens ({window}) holds not even task {task.id}'s opening "
                                 f"prompt ({len(prompt_ids)} tokens) and one action ({action})")  # fmt: skip
            trajectory.metrics.update({"context/compactions": 0.0, "context/empty_summaries": 0.0})
        return _Episode(f"{task.id}#{sample}", task, env, trajectory, list(prompt_ids), list(opening.messages))

    def _round(self, active: list[_Episode], stats: RolloutStats) -> list[tuple[_Episode, bool]]:
        """One action for every active episode; returns each with whether it ended."""
        results: list[tuple[_Episode, bool]] = []
        runnable = []
        for episode in active:
            budget = self._budget(episode)
            if budget <= 0:
                episode.trajectory.stop_reason = "max_tokens"
                results.append((episode, True))
            else:
                constraint = None if episode.pending else episode.trajectory.constraint  # a summary is free text
                runnable.append((episode, GenerationRequest(episode.key, episode.context, budget, constraint)))
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

    def _budget(self, episode: _Episode) -> int:
        """Tokens the episode's next generation may take: an action's, or a summary's."""
        sampling, context = self.config.sampling, self.config.context
        cap = context.summary_max_tokens if episode.pending else sampling.max_new_tokens_per_turn
        budget = min(cap, sampling.max_total_tokens - _episode_tokens(episode))
        return min(budget, context.max_tokens - len(episode.context)) if context.max_tokens else budget

    def _apply(self, episode: _Episode, generation: Generation) -> bool:
        """Append the action and the environment's answer; True when the episode ended."""
        if episode.pending is not None:
            return self._summarised(episode, generation)
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
        if _episode_tokens(episode) + len(observation_ids) >= self.config.sampling.max_total_tokens:
            return _cut(episode, turn)
        if self._outgrows_window(episode, observation_ids):
            return self._compact(episode, turn, observation_ids)
        _show(episode, turn, observation_ids)
        return False

    def _outgrows_window(self, episode: _Episode, observation_ids: list[int]) -> bool:
        """Whether the observation and one more action would not fit the window (nor, for
        the policy summariser, its instruction and a whole summary)."""
        context = self.config.context
        if not context.max_tokens:
            return False
        need = len(observation_ids) + self.config.sampling.max_new_tokens_per_turn
        if context.summariser == "policy":
            need = max(need, len(self._instruction) + context.summary_max_tokens)
        return len(episode.context) + need > context.max_tokens

    def _compact(self, episode: _Episode, turn: Turn, observation_ids: list[int]) -> bool:
        """Start the context again, or for the policy summariser first ask it for the
        summary (its instruction appended now, loss 0; it writes in the next round, and
        a window without room even for that takes the rule's). True: the episode ended."""
        if self.config.context.summariser == "policy":
            if len(episode.context) + len(self._instruction) < self.config.context.max_tokens:
                _extend(episode, self._instruction, [0.0] * len(self._instruction), policy_generated=False)
                turn.n_summary_tokens += len(self._instruction)
                episode.pending = _Pending(turn, observation_ids)
                return False
        return self._restart(episode, turn, observation_ids, None)

    def _summarised(self, episode: _Episode, generation: Generation) -> bool:
        """The policy's summary: trained as an action under the old context, carried
        verbatim into the new one; an empty one is counted and the rule's taken."""
        pending, episode.pending = episode.pending, None
        assert pending is not None
        _extend(episode, generation.token_ids, generation.logprobs, policy_generated=True)
        pending.turn.n_summary_tokens += len(generation.token_ids)
        summary: list[int] | None = without_eos(generation.token_ids, self._eos)
        if not self.tokenizer.decode(summary, skip_special_tokens=True).strip():
            episode.trajectory.metrics["context/empty_summaries"] += 1.0
            summary = None
        return self._restart(episode, pending.turn, pending.observation_ids, summary)

    def _restart(self, episode: _Episode, turn: Turn, observation_ids: list[int], summary: list[int] | None) -> bool:
        """The new context (a segment starting at the observation), then the observation."""
        trajectory, context = episode.trajectory, self.config.context
        room = context.max_tokens - len(observation_ids) - self.config.sampling.max_new_tokens_per_turn
        fresh = restart_context(self.tokenizer, episode.messages, trajectory, context, room, summary)
        if fresh is None or _episode_tokens(episode) + len(observation_ids) >= self.config.sampling.max_total_tokens:
            return _cut(episode, turn)
        trajectory.segments.append((len(trajectory.response_ids), list(fresh)))
        trajectory.metrics["context/compactions"] += 1.0
        episode.context = fresh
        _show(episode, turn, observation_ids)
        return False


def build_engine(backend: GenerationBackend, env_factory: Callable[[], Env], config: RolloutConfig) -> Any:
    """What rolls out episodes of `env_factory`: this engine, or the driver the factory
    names (`factory.driver`, an import path of a class built like RolloutEngine, with the
    same `run`): an agent program's episodes run through the gateway so."""
    driver = getattr(env_factory, "driver", None)
    if driver is None:
        return RolloutEngine(backend, env_factory, config)
    return import_object(driver, "environment driver")(backend, env_factory, config)


def _episode_tokens(episode: _Episode) -> int:
    """The episode's tokens so far, every segment's (its context's when it never compacted)."""
    return len(episode.trajectory.prompt_ids) + len(episode.trajectory.response_ids)


def _cut(episode: _Episode, turn: Turn) -> bool:
    turn.observation = None  # no room to show it, nor to act on it
    episode.trajectory.stop_reason = "max_tokens"
    return True


def _show(episode: _Episode, turn: Turn, observation_ids: list[int]) -> None:
    _extend(episode, observation_ids, [0.0] * len(observation_ids), policy_generated=False)
    turn.n_observation_tokens = len(observation_ids)


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
