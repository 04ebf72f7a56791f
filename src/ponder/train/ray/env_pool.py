"""An environment worker pool on Ray: tool execution and sandboxes out of the rollout workers.

With `train.ray_env_workers: N` (N > 0) under `ponder train --ray`, every episode's
environment lives in one of N `EnvWorker` actors instead of the rollout worker that
samples it. A rollout worker's engine sees a `RemoteEnv` (the `Env` protocol: reset,
step, stop_strings) whose calls go to the env worker that hosts it; an env worker
hosts many episodes' environments, keyed by episode. A crashing or hanging tool (a
sandboxed program, a retriever) then takes down an env worker, never the rollout.

Health: a call that has not answered after PING_EVERY_S is followed by a ping in the
actor's `health` concurrency group (answered while an env step runs); no answer in
PING_TIMEOUT_S means the worker hangs. A dead or hung worker is replaced by the
`EnvPool` supervisor actor (one place, so two rollout workers that see the same death
make one replacement), and the driver pings the whole pool at every step start.

Exact recovery: an episode whose env worker died is not sampled again. Its
environment is rebuilt on the fresh worker by replaying the episode's own actions
(reset(task), then step(a) for every earlier action; the results of the replay are
dropped), and the failed call is made there. The policy's tokens, logprobs and the
sampler's random stream are untouched, so the step's trajectories are those of an
undisturbed run, every task × group_size exactly once. Re-queueing the episode
instead would re-sample it (other tokens, and a shifted random stream for every
episode sampled after it). Replay assumes what every ponder environment is: a
deterministic function of (task, actions); a tool with outside side effects runs its
earlier calls again.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from ponder.config import Recipe
from ponder.envs.base import Opening, close_env, opening_of
from ponder.types import Task

# A call unanswered this long gets a health ping; a ping unanswered this long means hung.
PING_EVERY_S = 10.0
PING_TIMEOUT_S = 30.0
# One call that keeps failing on fresh workers (e.g. a tool that crashes its process
# every time) stops the run rather than replacing workers forever.
MAX_RETRIES = 3
_MISSING = "missing"  # a worker's answer for an episode it does not host (it was replaced)


class EnvWorkerError(RuntimeError):
    """An env worker keeps dying (or hanging) on the same call."""


class EnvWorker:
    """One environment worker (a Ray actor): builds the recipe's environments and hosts
    many episodes' instances, keyed by episode. Env calls run one at a time, as they
    do in a rollout worker; `ping` runs in its own concurrency group."""

    def __init__(self, recipe: Recipe, tokenizer: Any) -> None:
        from ponder.wiring import build_env

        self.factory = build_env(recipe, tokenizer).factory
        self.envs: dict[str, Any] = {}

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> int:
        return len(self.envs)  # episodes hosted; answering at all is the health signal

    def reset(self, key: str, task: Task) -> tuple[Opening, list[str]]:
        self._drop(key)  # a replayed episode's earlier instance
        env = self.factory()
        try:
            opening = opening_of(env.reset(task))
        except BaseException:
            close_env(env)
            raise
        self.envs[key] = env
        return opening, list(env.stop_strings)

    def step(self, key: str, action: str, replay: tuple[Task, list[str]] | None = None) -> Any:
        """env.step(action) of episode `key`; with `replay` (task, earlier actions) the
        environment is rebuilt first. An episode that ends, or raises, is dropped."""
        if replay is not None:
            task, earlier = replay
            self.reset(key, task)
            for previous in earlier:
                self.envs[key].step(previous)
        if key not in self.envs:
            return _MISSING
        try:
            result = self.envs[key].step(action)
        except Exception:
            self._drop(key)
            raise
        if result[1]:
            self._drop(key)
        return result

    def release(self, keys: list[str]) -> None:
        for key in keys:
            self._drop(key)

    def clear(self) -> None:
        for key in list(self.envs):
            self._drop(key)

    def close(self) -> None:
        """Close every hosted environment and the factory (the pool calls it before it
        kills this worker: a killed actor runs no cleanup of its own)."""
        self.clear()
        close_env(self.factory)

    def _drop(self, key: str) -> None:
        """Forget episode `key`'s environment, closed (`Env.close`)."""
        close_env(self.envs.pop(key, None))


class EnvPool:
    """The supervisor (a Ray actor): starts `size` env workers, replaces dead or hung
    ones, and pings them all on request. Replacements go through it, one at a time."""

    def __init__(self, recipe: Recipe, tokenizer: Any, size: int) -> None:
        import ray

        self.ray, self.recipe, self.tokenizer = ray, recipe, tokenizer
        self._actor = ray.remote(num_cpus=1, concurrency_groups={"health": 1})(EnvWorker)
        self.workers = [self._new() for _ in range(size)]
        self.restarts = 0

    def _new(self) -> Any:
        return self._actor.remote(self.recipe, self.tokenizer)

    def handles(self) -> list[Any]:
        return list(self.workers)

    def pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers])

    def replace(self, slot: int, seen: Any) -> Any:
        """The worker in `slot` after `seen` failed: a fresh one, unless another caller
        already had it replaced (then that one)."""
        if self.workers[slot]._actor_id == seen._actor_id:
            self.ray.kill(seen)
            self.workers[slot] = self._new()
            self.restarts += 1
        return self.workers[slot]

    def check(self, clear: bool = False) -> int:
        """Ping every worker; replace those that do not answer. With clear, drop every
        hosted environment (between steps no episode is live: a rollout worker killed
        mid-step leaves its episodes behind). Returns how many it replaced."""
        before = self.restarts
        for slot, worker in enumerate(list(self.workers)):
            if not alive(self.ray, worker):
                self.replace(slot, worker)
        if clear:  # waited for: a later call from a rollout worker is not ordered after it
            self.ray.get([worker.clear.remote() for worker in self.workers])
        return self.restarts - before

    def close(self) -> None:
        """Let every worker close what it hosts (waiting PING_TIMEOUT_S at most), then kill them."""
        closing = [worker.close.remote() for worker in self.workers]
        self.ray.wait(closing, num_returns=len(closing), timeout=PING_TIMEOUT_S)
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []


def alive(ray: Any, worker: Any, timeout: float = PING_TIMEOUT_S) -> bool:
    """Whether `worker` answers a ping within `timeout` seconds (also mid-step)."""
    try:
        ray.get(worker.ping.options(concurrency_group="health").remote(), timeout=timeout)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


class EnvPoolClient:
    """A rollout worker's side of the pool: a factory of `RemoteEnv`s spread over the
    env workers (round robin), and the calls, with health checks and recovery."""

    def __init__(self, pool: Any, start: int = 0) -> None:
        import ray

        self.ray, self.pool = ray, pool
        self.workers = ray.get(pool.handles.remote())
        self.next_slot, self.restarts = start, 0
        self.live: dict[str, int] = {}  # episode key -> slot, until its episode ends

    def factory(self) -> RemoteEnv:
        slot = self.next_slot % len(self.workers)
        self.next_slot += 1
        return RemoteEnv(self, slot, uuid.uuid4().hex)

    def reset(self, env: RemoteEnv, task: Task) -> tuple[Opening, list[str]]:
        self.live[env.key] = env.slot
        return self._call(env.slot, lambda w, fresh: w.reset.remote(env.key, task))

    def step(self, env: RemoteEnv, action: str) -> Any:
        replay = (env.task, list(env.actions))

        def call(worker: Any, fresh: bool) -> Any:
            return worker.step.remote(env.key, action, replay if fresh else None)

        try:
            result = self._call(env.slot, call)
            if result == _MISSING:  # its worker was replaced since (by another caller)
                result = self._call(env.slot, lambda w, fresh: w.step.remote(env.key, action, replay))
        except Exception:
            self.live.pop(env.key, None)
            raise
        if result[1]:
            self.live.pop(env.key, None)
        return result

    def release(self, env: RemoteEnv) -> None:
        """Drop `env`'s environment on its worker, if its episode did not end there
        (the engine closes an episode it ended itself: a token budget). Not waited for."""
        slot = self.live.pop(env.key, None)
        if slot is not None:
            self.workers[slot].release.remote([env.key])

    def release_all(self) -> None:
        """Drop the environments of episodes that ended on the engine's side (token budget)."""
        for slot in set(self.live.values()):
            self.workers[slot].release.remote([k for k, s in self.live.items() if s == slot])
        self.live.clear()

    def _call(self, slot: int, make: Any) -> Any:
        """make(worker, fresh) -> object ref; retried on a fresh worker when the worker
        dies or hangs (fresh=True: the environment must be rebuilt there)."""
        fresh = False
        for attempt in range(MAX_RETRIES + 1):
            worker = self.workers[slot]
            try:
                return self._wait(worker, make(worker, fresh))
            except self.ray.exceptions.RayTaskError as err:  # the environment raised: as in one process
                raise (err.cause if isinstance(err.cause, Exception) else err) from None
            except (self.ray.exceptions.RayActorError, _Hung) as err:
                last = str(err).splitlines()[0] if str(err) else type(err).__name__
                self.workers[slot] = self.ray.get(self.pool.replace.remote(slot, worker))
                self.restarts += 1
                fresh = True
        raise EnvWorkerError(f"ray: env worker {slot} failed {MAX_RETRIES + 1} times on one call; last: {last}")

    def _wait(self, worker: Any, ref: Any) -> Any:
        while True:
            ready, _ = self.ray.wait([ref], timeout=PING_EVERY_S)
            if ready:
                return self.ray.get(ref)
            if not alive(self.ray, worker):
                raise _Hung("env worker does not answer its health ping")


class _Hung(Exception):
    pass


class RemoteEnv:
    """The `Env` a rollout worker's engine steps: its calls go to the env worker in
    `slot`; it keeps its task and actions, from which a fresh worker rebuilds it."""

    def __init__(self, client: EnvPoolClient, slot: int, key: str) -> None:
        self.client, self.slot, self.key = client, slot, key
        self.stop_strings: list[str] = []
        self.task: Task | None = None
        self.actions: list[str] = []

    def reset(self, task: Task) -> Opening:
        self.task = task
        opening, self.stop_strings = self.client.reset(self, task)
        return opening

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        result = self.client.step(self, action)
        self.actions.append(action)
        return result

    def close(self) -> None:
        self.client.release(self)
