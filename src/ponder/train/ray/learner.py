"""The learner as a Ray actor: `ponder train --ray` with `train.ray_learner: true`.

The whole `RLTrainer` (scoring, advantages, the update, evaluation, checkpoints and
metrics) runs in one `Learner` actor, which starts the rollout workers (and the env
worker pool) itself, as `RayRollouts` does for a driver-side learner. The driver only
orchestrates: it builds the actor, starts `train`, relays each finished step to the
progress display, and turns a SIGINT/SIGTERM into a stop request (the learner stops
after the current step, with a checkpoint, as a one-process run does).

Placement: the actor asks Ray for one CPU, and for one GPU when the recipe's
`model.device` is cuda, or auto on a cluster that has GPUs; Ray then runs it on a
node with a free GPU, whichever node the driver is on. The one CPU is what Ray
schedules by; the update computes on every core the node lets the actor use, with
fewer threads while other processes keep cores busy (models/cpu_threads.py).

Files: the learner writes checkpoints and metrics.jsonl into the run directory by
its path, on its own node's filesystem. On one machine that is where a one-process
run writes them; on a cluster, give `--out` a directory on a filesystem every node
mounts (the driver writes recipe.yaml and the SFT warm-up there too), or the run's
files stay on the learner's node. The driver hands the learner its starting weights
(after an SFT warm-up) through the object store, never through a file.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any, Callable

from ponder.config import Recipe
from ponder.models.adapters import load_trainable_state

# How often the driver asks the learner for finished steps (and notices its end).
POLL_S = 0.5


def learner_threads() -> int:
    """The learner's torch threads: every core this process may run on."""
    from ponder.models.cpu_threads import usable_cores

    return len(usable_cores())


class Learner:
    """The learner (a Ray actor): an RLTrainer built from the recipe by `build`
    (ponder.jobs.parts.rl_trainer, pickled by reference), with its rollouts
    on Ray workers. `train` runs the loop; `progress` and `request_stop` answer in
    their own concurrency group while it does."""

    def __init__(self, recipe: Recipe, run_dir: str, build: Callable[..., Any], start_state: Any = None,
                 resume: bool = False, reward: Callable[..., Any] | None = None) -> None:  # fmt: skip
        import torch

        from ponder.train.ray.rollouts import RayRollouts

        # Ray starts an actor with OMP_NUM_THREADS = its num_cpus (1), which held the
        # update to one thread while the rollout workers sat idle (a 2-core local
        # cluster: 31-42 s an update against ~22 s in one process). Like a one-process
        # run, the learner takes the cores it may run on; cpu_block() drops to those
        # the workers leave free when they run beside it (models/cpu_threads.py).
        torch.set_num_threads(learner_threads())
        self.trainer = build(recipe, run_dir, reward=reward)
        if start_state is not None:  # the driver's weights after an SFT warm-up
            load_trainable_state(self.trainer.policy.model, start_state)
            self.trainer.backend.refresh()
        self.start = self.trainer.resume() if resume else 0
        self.rollouts = RayRollouts(recipe, self.trainer.policy)  # joins the cluster this actor runs on
        self.trainer.use_rollouts(self.rollouts)
        self.finished: list[tuple[int, dict[str, float]]] = []
        self.lock = threading.Lock()

    def start_step(self) -> int:
        return self.start

    def train(self) -> int:
        """The training loop, to train.steps or a stop request; returns the last step."""
        try:
            self.trainer.train(self._on_step)
        finally:
            self.rollouts.close()
        return self.trainer.step

    def _on_step(self, step: int, metrics: dict[str, float]) -> None:
        with self.lock:
            self.finished.append((step, dict(metrics)))

    def progress(self) -> list[tuple[int, dict[str, float]]]:
        """The steps finished since the last call, with their metrics."""
        with self.lock:
            done, self.finished = self.finished, []
        return done

    def request_stop(self) -> None:
        self.trainer.stop_requested = True


class RayLearner:
    """The driver's side: starts the learner actor on the cluster at `address` (None: a
    local one) and runs it. Use as a context manager (or call close())."""

    def __init__(self, recipe: Recipe, run_dir: str | Path, build: Callable[..., Any], address: str | None = None,
                 start_state: Any = None, resume: bool = False,
                 reward: Callable[..., Any] | None = None) -> None:  # fmt: skip
        from ponder.train.ray.rollouts import _import_ray, connect

        self.ray, self.actor = _import_ray(), None
        cfg = recipe.train
        self.started_cluster = connect(address, cfg.ray_workers + cfg.ray_env_workers + 1)
        try:
            self.gpus = learner_gpus(self.ray, recipe)
            actor = self.ray.remote(num_cpus=1, num_gpus=self.gpus, concurrency_groups={"control": 1})(Learner)
            state = self.ray.put(start_state) if start_state is not None else None
            self.actor = actor.remote(recipe, str(Path(run_dir).resolve()), build, state, resume, reward)
            self.start = self._get(self.actor.start_step.remote())  # built (a bad recipe fails here)
        except BaseException:
            self.close()
            raise

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> int:
        """Run the learner's loop; on_step(step, metrics) here as each step ends. The
        first SIGINT/SIGTERM asks the learner to stop after its step; a second stops now."""
        stops = []

        def stop(signum: int, frame: Any) -> None:
            if stops:
                raise KeyboardInterrupt
            stops.append(signum)
            self.actor.request_stop.options(concurrency_group="control").remote()

        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            running = self.actor.train.remote()
            while True:
                ready, _ = self.ray.wait([running], timeout=POLL_S)
                for step, metrics in self._get(self.actor.progress.options(concurrency_group="control").remote()):
                    if on_step is not None:
                        on_step(step, metrics)
                if ready:
                    return self._get(running)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _get(self, ref: Any) -> Any:
        """ray.get, with the learner's own error (a TrainingError, a bad recipe) raised
        as itself rather than wrapped in Ray's."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, Exception):
                raise err.cause from None
            raise

    def close(self) -> None:
        """Stop the learner (and with it its workers), and the local cluster when this
        object started it."""
        if self.actor is not None:
            self.ray.kill(self.actor)  # its rollout and env workers are its own: they go with it
            self.actor = None
        if self.started_cluster:
            self.ray.shutdown()

    def __enter__(self) -> RayLearner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def learner_gpus(ray: Any, recipe: Recipe) -> int:
    """1 when the learner should hold a GPU: model.device cuda, or auto on a cluster with one."""
    device = recipe.model.device
    if device.startswith("cuda"):
        return 1
    return int(device == "auto" and ray.cluster_resources().get("GPU", 0) >= 1)
