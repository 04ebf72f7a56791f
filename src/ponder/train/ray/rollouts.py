"""Rollouts on Ray: rollout workers as Ray actors, the learner in the driver.

Each step the learner's trainable weights (the LoRA adapter, or every weight of a
full fine-tune) go into Ray's object store once; the step's tasks are split into
`train.ray_workers` contiguous shares (a task's G samples stay together, so they
share one prompt prefill) and every worker rolls out its share with
`RolloutEngine.run` on its own policy copy, backend and environments, all built
from the recipe by `ponder.wiring`. Scoring, advantages and the update stay in the
driver (`RLTrainer`), exactly as in a one-process run.

Reproducible: a share's sampling seed comes from (train.seed, step, rollout call of
the step, share index), never from which process ran it, and each share starts from
an empty KV cache, so a run with N workers gives the same trajectories every time,
also when a share had to be run again.

Fault tolerant: a worker that dies mid-step (killed, out of memory) fails only its
pending call; its share is re-queued on a fresh worker built in its place, so the
step's trajectories still cover every task × group_size exactly once.

Ray is imported lazily: a one-process run never needs it (`pip install 'ponder[ray]'`).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np

from ponder.config import Recipe
from ponder.envs.base import close_env
from ponder.extras import require
from ponder.models import Policy
from ponder.models.adapters import load_trainable_state, trainable_state
from ponder.rollout import RolloutEngine, RolloutStats, build_engine
from ponder.types import Task, Trajectory

# A share re-queued this many times in one rollout call means the workers die for a
# reason that will not pass (e.g. out of memory on every try): stop with an error.
MAX_REQUEUES_PER_CALL = 3
# How long a named cluster address gets to answer before `--ray ADDRESS` gives up.
CONNECT_TIMEOUT_S = 5.0
# A local cluster shares the machine with the learner: Ray's defaults declared it dead
# (raylet "GCS unavailable for more than 60 seconds", missed heartbeats) mid-run on a
# 2-core machine saturated by other jobs. One node has no one to fail over to, so
# waiting longer only avoids false alarms.
LOCAL_SYSTEM_CONFIG = {
    "health_check_period_ms": 10_000,
    "health_check_timeout_ms": 60_000,
    "health_check_failure_threshold": 30,
    "gcs_rpc_server_reconnect_timeout_s": 900,
}


class RayError(ValueError):
    """Ray is missing, the cluster does not answer, or workers keep dying (one line)."""


class RolloutWorker:
    """One rollout worker (run as a Ray actor): its own policy, backend and
    environment factory from the recipe; samples with the weights it is sent.
    With an `env_pool` (ponder.train.ray.env_pool), its episodes' environments live in
    the pool's env workers; `index` spreads the workers' episodes over them."""

    def __init__(self, recipe: Recipe, env_pool: Any = None, index: int = 0) -> None:
        from ponder.models.prepare import prepare_policy
        from ponder.rollout.build import build_backend
        from ponder.train.ray.env_pool import EnvPoolClient
        from ponder.wiring import build_env

        self.policy = prepare_policy(recipe)
        self.policy.model.eval()
        self.envs = EnvPoolClient(env_pool, start=index) if env_pool is not None else None
        factory = self.envs.factory if self.envs is not None else build_env(recipe, self.policy.tokenizer).factory
        self.backend = build_backend(self.policy, recipe)
        self.engine = build_engine(self.backend, factory, recipe.rollout)
        self.version = -1

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """Close this worker's environment factory (RayRollouts.close calls it before the kill)."""
        close_env(self.engine.env_factory)

    def run(
        self, tasks: list[Task], weights: list[Any], version: int, seed: int
    ) -> tuple[list[Trajectory], RolloutStats, int]:
        """Roll out `tasks` with weights `version` (weights[0]: its object reference,
        in a list so Ray fetches it only when this worker does not hold it yet).
        Also returns how many env workers it had replaced meanwhile."""
        import ray

        if version != self.version:
            load_trainable_state(self.policy.model, ray.get(weights[0]))
            self.version = version
            self.backend.refresh()  # rebuild the merged sampling copy from the new weights
        elif self.backend.store is not None:
            self.backend.store.clear()  # the same start for a share whichever worker ran before
        self.backend.generator.manual_seed(seed)
        if self.envs is None:
            return (*self.engine.run(tasks), 0)
        restarts = self.envs.restarts
        try:
            trajectories, stats = self.engine.run(tasks)
        finally:
            self.envs.release_all()
        return trajectories, stats, self.envs.restarts - restarts


class RayRollouts:
    """The `Rollouts` of `RLTrainer` on Ray workers; see the module docstring.

    recipe: the run's recipe (each worker builds its parts from it); policy: the
    learner's policy, whose trainable weights are sent at each step; address: None
    starts a local cluster with one CPU per worker, else a cluster's address.
    Use as a context manager (or call close()) to stop the workers.
    """

    def __init__(self, recipe: Recipe, policy: Policy, address: str | None = None, workers: int | None = None) -> None:
        self.ray = _import_ray()
        self.recipe, self.policy = recipe, policy
        count = recipe.train.ray_workers if workers is None else workers
        if count < 1:
            raise RayError(f"train.ray_workers must be >= 1, got {count}")
        env_workers = recipe.train.ray_env_workers
        self.started_cluster = connect(address, count + env_workers)
        self.env_pool: Any = None
        if env_workers > 0:
            from ponder.train.ray.env_pool import EnvPool

            tokenizer = self.ray.put(policy.tokenizer)  # the env workers' builders cut observations with it
            self.env_pool = self.ray.remote(num_cpus=0)(EnvPool).remote(recipe, tokenizer, env_workers)
        self._actor = self.ray.remote(num_cpus=1)(RolloutWorker)
        self.workers = [self._new_worker(index) for index in range(count)]
        self.pids = self.ray.get([w.pid.remote() for w in self.workers])  # built (a bad recipe fails here)
        self.step, self.call, self.version = 0, 0, -1
        self._weights: Any = None
        self.in_flight: dict[Any, tuple[int, int]] = {}  # call reference -> (share, worker)
        self.metrics: dict[str, float] = {}

    def begin_step(self, step: int) -> None:
        """Send the learner's current weights; the step's rollouts sample with them."""
        tick = time.perf_counter()
        self.step, self.call, self.version = step, 0, self.version + 1
        self._weights = self.ray.put(trainable_state(self.policy.model))
        # per step, summed over its rollout calls (refills); overhead_s: time in Ray calls
        # beyond the slowest worker's own rollout (scheduling, transfers, loading weights)
        self.metrics = {"ray/workers": float(len(self.workers)), "ray/requeued": 0.0, "ray/worker_rollout_s": 0.0,
                        "ray/overhead_s": 0.0, "ray/weights_sync_s": time.perf_counter() - tick}  # fmt: skip
        if self.env_pool is not None:  # health check; drops environments a killed rollout worker left
            replaced = self.ray.get(self.env_pool.check.remote(clear=True))
            self.metrics.update({"ray/env_workers": float(self.recipe.train.ray_env_workers),
                                 "ray/env_restarts": float(replaced)})  # fmt: skip

    def run(self, tasks: list[Task]) -> tuple[list[Trajectory], RolloutStats]:
        """Every task group_size times across the workers; trajectories in task order."""
        return self.result(self.submit(tasks))

    def submit(self, tasks: list[Task]) -> tuple[list[list[Task]], int, float]:
        """Send the shares of `tasks` to the workers; `result` collects them."""
        if self._weights is None:
            self.begin_step(self.step)
        shares, call = split_tasks(tasks, len(self.workers)), self.call
        self.call += 1
        for index, share in enumerate(shares):
            if share:
                self._submit(index, index, share, call)
        return shares, call, time.perf_counter()

    def result(self, pending: tuple[list[list[Task]], int, float]) -> tuple[list[Trajectory], RolloutStats]:
        shares, call, start = pending
        results, requeued = self._collect(shares, call)
        parts = [results[i] for i in range(len(shares)) if shares[i]]
        wall_s = time.perf_counter() - start
        stats = RolloutStats(
            sum(p[1].episodes for p in parts), sum(p[1].generated_tokens for p in parts),
            sum(p[1].generation_s for p in parts), sum(p[1].env_s for p in parts), wall_s,
        )  # fmt: skip
        slowest = max((p[1].wall_s for p in parts), default=0.0)
        for key, value in (("requeued", requeued), ("worker_rollout_s", slowest), ("overhead_s", wall_s - slowest)):
            self.metrics[f"ray/{key}"] += value
        if self.env_pool is not None:
            self.metrics["ray/env_restarts"] += sum(p[2] for p in parts)
        return [t for part in parts for t in part[0]], stats

    def step_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    def _submit(self, share_index: int, worker_index: int, share: list[Task], call: int) -> None:
        seed = share_seed(self.recipe.train.seed, self.step, call, share_index)
        ref = self.workers[worker_index].run.remote(share, [self._weights], self.version, seed)
        self.in_flight[ref] = (share_index, worker_index)

    def _collect(self, shares: list[list[Task]], call: int) -> tuple[dict[int, Any], int]:
        """Wait for every share; a dead worker's share goes to a fresh worker."""
        results: dict[int, Any] = {}
        requeued = 0
        while self.in_flight:
            (ref,), _ = self.ray.wait(list(self.in_flight), num_returns=1)
            share_index, worker_index = self.in_flight.pop(ref)
            try:
                results[share_index] = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as err:
                requeued += 1
                if requeued > MAX_REQUEUES_PER_CALL * len(shares):
                    self._cancel()
                    raise RayError(f"ray: rollout workers keep dying ({requeued} re-queued shares); "
                                   f"last: {str(err).splitlines()[0]}") from None  # fmt: skip
                self.ray.kill(self.workers[worker_index])  # already dead; makes sure of it
                self.workers[worker_index] = self._new_worker(worker_index)
                self.pids[worker_index] = -1  # unknown until asked; the new worker is busy
                self._submit(share_index, worker_index, shares[share_index], call)
        return results, requeued

    def _cancel(self) -> None:
        for ref in self.in_flight:
            self.ray.cancel(ref, force=True)
        self.in_flight.clear()

    def _new_worker(self, index: int) -> Any:
        return self._actor.remote(self.recipe, self.env_pool, index)

    def close(self) -> None:
        """Stop the workers, and the local cluster when this object started it."""
        self._cancel()
        closing = [worker.close.remote() for worker in self.workers]  # what their factories hold
        self.ray.wait(closing, num_returns=len(closing), timeout=CONNECT_TIMEOUT_S)
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self.env_pool is not None:
            self.ray.get(self.env_pool.close.remote())
            self.ray.kill(self.env_pool)
            self.env_pool = None
        if self.started_cluster:
            self.ray.shutdown()

    def __enter__(self) -> RayRollouts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def split_tasks(tasks: list[Task], parts: int) -> list[list[Task]]:
    """`tasks` in `parts` contiguous shares whose sizes differ by at most one."""
    size, extra = divmod(len(tasks), parts)
    shares, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        shares.append(tasks[start:end])
        start = end
    return shares


def share_seed(seed: int, step: int, call: int, share: int) -> int:
    """The sampling seed of one share: independent streams for every (step, call, share)."""
    return int(np.random.SeedSequence([seed, step, call, share]).generate_state(1)[0])


def connect(address: str | None, num_cpus: int) -> bool:
    """Join Ray: start a local cluster (address None or "local") with `num_cpus` CPUs,
    or connect to `address`, which must answer within CONNECT_TIMEOUT_S. Returns
    whether it started a cluster (which close() then stops)."""
    ray = _import_ray()
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "log_to_driver": False}
    if address in (None, "", "local"):
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1",
                 _system_config=LOCAL_SYSTEM_CONFIG, **quiet)  # fmt: skip
        return True
    check_address(address)
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise RayError(f"ray: cannot join the cluster at {address}: {str(err).splitlines()[0]}") from None
    return False


def check_address(address: str) -> None:
    """Fail in seconds, with one line, when Ray is missing or nothing listens at the
    cluster's host:port (ray.init itself retries for a minute before it gives up)."""
    _import_ray()
    if address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayError(f"ray: address {address!r} is not HOST:PORT (or 'auto', or 'local')")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise RayError(f"ray: no cluster answers at {address} ({err.strerror or err})") from None


def _import_ray() -> Any:
    return require("ray", "ray", "--ray")
