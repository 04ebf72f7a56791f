"""The RL trainer: rollout → reward → advantage → loss → step → log → checkpoint.

Algorithm variants (GRPO, RLOO, REINFORCE, PPO, turn-level) are configuration: the
loop looks estimators, losses and aggregations up by name in `ponder.algos`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from ponder.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    STD_SCOPES,
    AdaptiveKLController,
    AdvantageConfig,
    AdvantageInput,
    FixedKLController,
    LossConfig,
    compute_advantages,
    kl_estimate,
    kl_penalty_rewards,
)
from ponder.algos.curriculum import CURRICULA
from ponder.algos.distill import DISTILL_LOSSES, DistillConfig, opd_advantage
from ponder.algos.filters import GROUP_FILTERS
from ponder.algos.kl import KL_REFERENCES
from ponder.config import Recipe, to_dict
from ponder.envs.base import close_env
from ponder.models import Policy, adapters_disabled, trainable_snapshot, weights_swapped
from ponder.models.adapters import load_adapter_weights
from ponder.models.cpu_matmul import check_matmul_dtype
from ponder.models.memory import peak_gpu_gb, peak_rss_gb, release_memory
from ponder.models.value_head import ValueHead
from ponder.rewards import score_trajectories
from ponder.rewards.hacking import HackingMonitor
from ponder.rollout import RolloutEngine, RolloutStats, build_engine
from ponder.rollout.constrain import constraint_masks
from ponder.runlog.metrics_log import MetricsLog
from ponder.runlog.tracking import check_trackers
from ponder.train.batch import TokenBatch, collate
from ponder.train.segment_batch import SegmentBatch, collate_segments
from ponder.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from ponder.train.optim import NonFiniteError, build_optimizer
from ponder.train.rl_metrics import episode_metrics, episode_table, hacking_step_metrics
from ponder.train.sampler import build_sampler, cycled_order
from ponder.train.sft import BEHAVIOURS
from ponder.train.teacher import Teacher
from ponder.train.update import (
    DistillTerm,
    TrainingError,
    UpdateInputs,
    forward_pass_no_grad,
    optimise,
    recompute_old_logprobs,
    take_old_logprobs_from_forward,
)
from ponder.train.validation import BEST_DIR, BestSoFar, validate
from ponder.types import Task, Trajectory


class Rollouts(Protocol):
    """Where a step's episodes come from: `LocalRollouts` (this process's RolloutEngine,
    the default) or `ponder.train.ray.rollouts.RayRollouts` (rollout workers on Ray)."""

    def begin_step(self, step: int) -> None:
        """A step starts: the policy's weights may have changed since the last one."""

    def run(self, tasks: list[Task]) -> tuple[list[Trajectory], RolloutStats]:
        """Every task rollout.group_size times; trajectories in task order."""
        ...

    def submit(self, tasks: list[Task]) -> Any:
        """Start `run(tasks)` in the background, sampling from the policy's weights as
        they are now (train.async_rollouts); `result` waits for it."""
        ...

    def result(self, pending: Any) -> tuple[list[Trajectory], RolloutStats]:
        ...

    def step_metrics(self) -> dict[str, float]:
        """Metrics of the last run (logged with the step's)."""
        ...


class LocalRollouts:
    """Rollouts in this process: the engine samples from the trainer's own policy."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self._thread: ThreadPoolExecutor | None = None

    def begin_step(self, step: int) -> None:
        # the backend samples from the policy itself (refreshed after each update); an
        # engine that labels its samples with the weights version (the gateway) is told
        if hasattr(self.engine, "begin_step"):
            self.engine.begin_step(step)

    def run(self, tasks: list[Task]) -> tuple[list[Trajectory], RolloutStats]:
        return self.engine.run(tasks)

    def submit(self, tasks: list[Task]) -> Any:
        backend = self.engine.backend
        if not hasattr(backend, "snapshot"):
            raise ValueError(f"train.async_rollouts: the {type(backend).__name__} backend samples from the "
                             "live weights, which the update changes under it; "
                             "use the hf or vllm backend or --ray")
        backend.snapshot()  # the weights are taken now, before the update moves them
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="ponder-rollout")
        return self._thread.submit(self.engine.run, tasks)

    def result(self, pending: Any) -> tuple[list[Trajectory], RolloutStats]:
        return pending.result()

    def step_metrics(self) -> dict[str, float]:
        return self.engine.step_metrics() if hasattr(self.engine, "step_metrics") else {}

    def close(self) -> None:
        close_env(self.engine)


class RLTrainer:
    """Holds everything one run needs; `train()` is the loop.

    It takes its parts: the policy (trainable), a factory of fresh environments,
    the training tasks, the reward (any callable (trajectory, task) -> (total |
    None, breakdown dict), like CompositeReward), the generation backend, and the
    recipe's settings. `ponder.jobs.parts.rl_trainer` builds them all from a recipe.
    val_tasks: a validation split (never trained on) that chooses the kept weights
    every train.eval_every steps (ponder.train.validation). With algo.sft_coef > 0
    the recipe's SFT demonstrations are built too, and every update imitates
    algo.sft_rows of them (`demonstration_batch`).
    `rollouts` (default: this process's engine) is where episodes come from;
    `use_rollouts` replaces it (e.g. with Ray workers).
    """

    def __init__(
        self, policy: Policy, env_factory: Callable[[], Any], tasks: list[Task], reward: Callable[..., Any],
        backend: Any, recipe: Recipe, run_dir: str | Path, val_tasks: list[Task] | None = None,
    ) -> None:  # fmt: skip
        self.recipe, self.run_dir = recipe, Path(run_dir)
        check_recipe(recipe)
        cfg = recipe.train
        self.sampler = build_sampler(tasks, cfg)
        self.policy, self.backend, self.reward = policy, backend, reward
        self.env_factory, self.val_tasks = env_factory, list(val_tasks or [])
        self.best = BestSoFar(cfg.patience)
        self.demonstrations: list[Trajectory] = []  # algo.sft_coef's anchor (use_demonstrations)
        self.teacher: Teacher | None = None  # algo.distill_coef's (train/teacher.py load_teacher)
        self._kind_of: dict[str, str] = {}  # task id -> kind, of the step's tasks (the teacher's per-kind choice)
        self.engine = build_engine(backend, env_factory, recipe.rollout)
        # rollout.constrain: the masks actions were sampled under, applied again by every pass
        self.masks_for = constraint_masks(policy, getattr(backend, "eos_ids", None))
        self.rollouts: Rollouts = LocalRollouts(self.engine)
        hidden = self.policy.model.config.hidden_size
        needs_values = ADVANTAGES.trait(recipe.algo.advantage, "needs_values")
        self.value_head = ValueHead(hidden).to(self.policy.device) if needs_values else None
        self.optimizer, self.scheduler = build_optimizer(self._trainable(), recipe.optim, self._total_updates())
        algo = recipe.algo
        self.kl = (
            AdaptiveKLController(algo.kl_coef, algo.kl_target, algo.kl_horizon)
            if algo.kl_target is not None
            else FixedKLController(algo.kl_coef)
        )
        # the weights as this run began (taken before resume() loads a checkpoint, so a
        # resumed run keeps its original reference); None: the base model is the reference
        starting = algo.kl_coef > 0 and KL_REFERENCES.trait(algo.kl_reference, "snapshot")
        self.reference_weights = _starting_weights(self.policy.model) if starting else None
        self.advantage_state: dict[str, Any] = {}
        self.hacking = HackingMonitor(recipe.reward.shaping.window)  # trend detectors over steps
        self.step = 0
        self.stop_requested = False
        self._last_step: tuple[np.ndarray, list[Task], list[Trajectory]] | None = None
        self._watchdog: threading.Timer | None = None
        # train.async_rollouts: the next step's tasks and rollouts in flight, and the
        # sampler and sampling RNG from before they were drawn (what a checkpoint keeps)
        self._pending: tuple[list[Task], Any] | None = None
        self._pending_state: dict[str, Any] = {}

    def use_rollouts(self, rollouts: Rollouts) -> None:
        """Sample episodes from `rollouts` (e.g. RayRollouts) instead of this process."""
        self.rollouts = rollouts

    def use_demonstrations(self, demonstrations: list[Trajectory]) -> None:
        """The episodes every update imitates under algo.sft_coef (algo.sft_rows a step)."""
        self.demonstrations = list(demonstrations)

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> Path:
        """Run until train.steps; returns the run directory. SIGINT/SIGTERM stop cleanly
        after the current step, with a checkpoint. on_step(step, metrics) after each step."""
        cfg = self.recipe.train
        # Only the main thread may set handlers; elsewhere (a Ray learner actor's thread)
        # whoever runs this loop asks for a stop by setting stop_requested.
        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._request_stop) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            # from step 0 too: lines a run killed before its first checkpoint logged go
            with self._metrics_log() as log:
                if self._selecting() and self.step == 0:
                    log.log(0, self.select())  # the starting weights are a candidate too
                while self.step < cfg.steps and not self.stop_requested:
                    metrics = self.train_step()
                    release_memory()  # each step's activations and KV caches, before the next rollout
                    self.step += 1
                    if cfg.eval_every and self.step % cfg.eval_every == 0:
                        metrics.update(self.select() if self._selecting() else self.evaluate_held_out())
                        self.stop_requested |= self.best.exhausted
                    log.log(self.step, metrics)
                    self._log_extras(log)
                    if on_step is not None:
                        on_step(self.step, metrics)
                    if self.step % cfg.save_every == 0 or self.step == cfg.steps or self.stop_requested:
                        self.save()
        finally:
            self.drain()
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._watchdog is not None:  # the run stopped in time: no exit from under the caller
                self._watchdog.cancel()
                self._watchdog = None
        if self._selecting() and cfg.keep_best and self.best.step not in (-1, self.step):
            load_adapter_weights(self.policy.model, self.run_dir / BEST_DIR)
            self.backend.refresh()
        return self.run_dir

    def _selecting(self) -> bool:
        return bool(self.val_tasks) and self.recipe.train.eval_every > 0

    def select(self) -> dict[str, float]:
        """Evaluate the current weights on the validation split; keep them in
        RUN_DIR/best when they are the best so far."""
        from ponder.models.adapters import save_trained

        tick = time.perf_counter()
        self.policy.model.eval()
        metrics = validate(self.policy, self.env_factory, self.val_tasks, self.reward, self.recipe)
        if self.best.observe(self.step, metrics["val/reward"]) and self.recipe.train.keep_best:
            save_trained(self.policy, self.run_dir / BEST_DIR)
        metrics.update({"val/best_reward": self.best.best, "val/best_step": float(self.best.step),
                        "time/val_s": time.perf_counter() - tick})  # fmt: skip
        return metrics

    def train_step(self) -> dict[str, float]:
        """One RL step: rollout → reward → advantage → update. Returns its metrics."""
        self.policy.model.eval()
        if self._pending is None:  # else the step's rollouts are in flight, with the last step's weights
            self.rollouts.begin_step(self.step)
        tasks, trajectories, stats, sampled = self._sample_groups()
        sampled.update(self.rollouts.step_metrics())  # before a prefetch starts the next step's
        sampled["memory/rollout_peak_gb"] = peak_rss_gb()  # the process's peak so far, as the rollouts end
        if self._prefetching():
            self._prefetch()  # the next step's rollouts run during this update
        else:
            # The update below changes the weights: drop the sampling copy now rather than
            # after it, so the update's activations do not sit on top of it (peak RSS).
            self.backend.refresh()
        episodes = collate(trajectories, self.policy.tokenizer.pad_token_id)
        # rollout.context: a compacted episode is one row per segment, each scored under its own context
        segments = (collate_segments(trajectories, self.policy.tokenizer.pad_token_id, episodes)
                    if any(t.segments for t in trajectories) else None)  # fmt: skip
        batch = segments.rows if segments is not None else episodes
        tick = time.perf_counter()
        sampled.update(self._no_grad_passes(batch))
        logprob_s = time.perf_counter() - tick
        sampled.update(self._teacher_pass(batch, tasks))
        advantages, returns = self._advantages(episodes, segments)
        # For the trackers (histogram, sampled episodes): the advantages of trained tokens.
        self._last_step = (advantages[batch.loss_mask > 0].detach().cpu().numpy(), tasks, trajectories)
        lr = self.scheduler.get_last_lr()[0]  # the LR this step trains with
        tick = time.perf_counter()
        try:
            update = optimise(self.update_inputs(), batch, advantages, returns)
        except NonFiniteError as err:
            raise TrainingError(f"step {self.step + 1}: {err}; stopped, last good checkpoint kept in {self.run_dir}") from None
        update_s = time.perf_counter() - tick
        if "policy/kl" in update:
            self.kl.update(update["policy/kl"], len(trajectories))
        metrics = episode_metrics(trajectories, {t.id: t.kind for t in tasks})
        metrics.update(hacking_step_metrics(trajectories, tasks, self.recipe.reward.shaping, self.hacking))
        metrics.update(update)
        metrics.update(sampled)
        metrics.update(
            {
                "time/generation_s": stats.generation_s,
                "time/env_s": stats.env_s,
                "time/logprob_s": logprob_s,
                "time/update_s": update_s,
                "throughput/tokens_per_s": stats.tokens_per_s,
                "memory/peak_gb": peak_rss_gb(),
                "optim/lr": lr,
                "policy/kl_coef": self.kl.coef,
            }
        )
        if peak_gpu_gb():  # on a GPU: torch's peak allocation so far (ponder estimate --versus)
            metrics["memory/gpu_peak_gb"] = peak_gpu_gb()
        return metrics

    def _no_grad_passes(self, batch: TokenBatch) -> dict[str, float]:
        """The trainer's old log-probs where the sampler's kernels are not its own (vLLM,
        bf16), the reference's (kl_coef > 0) and the value head's estimates, into
        `batch`; returns the sampler mismatch metrics."""
        algo, temperature = self.recipe.algo, self.recipe.rollout.sampling.temperature
        micro = algo.logprob_micro_batch_size or algo.micro_batch_size
        metrics: dict[str, float] = {}
        if not getattr(self.backend, "logprobs_match_trainer", True):
            if self._old_from_forward(len(batch)):
                take_old_logprobs_from_forward(batch)
            else:
                metrics = recompute_old_logprobs(self.policy, batch, micro, temperature, self.masks_for)
        if algo.kl_coef > 0:
            with self._reference_policy():
                batch.ref_logprobs = forward_pass_no_grad(self.policy, batch, micro, temperature,
                                                          masks_for=self.masks_for)  # fmt: skip
        if self.value_head is not None:
            batch.old_values = forward_pass_no_grad(self.policy, batch, micro, temperature, self.value_head)
        return metrics

    def _teacher_pass(self, batch: TokenBatch, tasks: list[Task]) -> dict[str, float]:
        """The teacher's log-probabilities of the sampled tokens into `batch` (with
        algo.distill_coef); returns the student's reverse KL estimate and its time."""
        if self.teacher is None or self.recipe.algo.distill_coef == 0:
            return {}
        tick = time.perf_counter()
        self._kind_of = {task.id: task.kind for task in tasks}  # the update's teacher_logits reads it
        kinds = [self._kind_of.get(g, "") for g in batch.group_ids]
        algo, teacher = self.recipe.algo, self.recipe.teacher
        micro, temperature = algo.logprob_micro_batch_size or algo.micro_batch_size, self.recipe.rollout.sampling.temperature
        batch.teacher_logprobs = self.teacher.token_logprobs(batch, kinds, micro, temperature)
        if teacher.loss != "opd" and DISTILL_LOSSES.trait(teacher.loss, "teacher") == "topk":
            batch.teacher_topk_ids, batch.teacher_topk_logprobs = self.teacher.topk(batch, kinds, micro, temperature,
                                                                                    teacher.top_k)  # fmt: skip
        gap = (batch.old_logprobs - batch.teacher_logprobs)[batch.loss_mask.bool()]
        return {"distill/reverse_kl": gap.mean().item() if gap.numel() else 0.0,
                "time/teacher_s": time.perf_counter() - tick}  # fmt: skip

    def _advantages(self, batch: TokenBatch, segments: SegmentBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's advantages and returns by algo.advantage (a KL penalty in the
        reward first, with algo.kl_in_reward), on the episode rows `batch`; with
        `segments` (compacted episodes) moved onto the segment rows the model passes ran on."""
        algo = self.recipe.algo
        token_rewards = None
        if algo.kl_in_reward and batch.ref_logprobs is not None:
            token_kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, algo.kl_estimator)
            token_rewards = kl_penalty_rewards(token_kl, batch.loss_mask, self.kl.coef)
        advantage_input = AdvantageInput(
            batch.rewards, batch.loss_mask, batch.group_ids, batch.turn_ids, batch.turn_rewards,
            batch.turn_mask, batch.old_values, token_rewards,
        )  # fmt: skip
        advantage_config = AdvantageConfig(
            algo.norm_by_std, algo.std_scope, algo.std_eps, algo.gamma, algo.lam, algo.baseline_momentum,
            algo.whiten_gae,
        )  # fmt: skip
        advantages, returns = compute_advantages(algo.advantage, advantage_input, advantage_config, self.advantage_state)
        if segments is not None:
            advantages, returns, batch = segments.spread(advantages), segments.spread(returns), segments.rows
        if batch.teacher_logprobs is not None and self.recipe.teacher.loss == "opd":  # beside the reward's advantages
            advantages = advantages + algo.distill_coef * opd_advantage(batch.old_logprobs, batch.teacher_logprobs,
                                                                        batch.loss_mask)  # fmt: skip
        return advantages, returns

    def _old_from_forward(self, rows: int) -> bool:
        """The update is one pass over these rows at the current weights and nothing reads
        the old log-probs before it, so its forward, detached, is what a separate pass
        would compute (train/update.py take_old_logprobs_from_forward); with async
        rollouts the sampler's weights were one update older, which the TIS weight carries."""
        algo = self.recipe.algo
        one_pass = algo.epochs == 1 and (algo.mini_batch_size == 0 or algo.mini_batch_size >= rows)
        return one_pass and not algo.kl_in_reward

    def _prefetching(self) -> bool:
        cfg = self.recipe.train
        return cfg.async_rollouts and self.step + 1 < cfg.steps and not self.stop_requested

    def _prefetch(self) -> None:
        """Draw the next step's tasks and start their rollouts, sampled with the weights
        as they are before this step's update (one step behind when they are trained)."""
        self._pending_state = {"sampler": self.sampler.state_dict(), "sampling_rng": self.backend.generator.get_state()}
        tasks = self.sampler.next_batch(self.recipe.train.tasks_per_step)
        self.rollouts.begin_step(self.step + 1)
        self._pending = (tasks, self.rollouts.submit(tasks))

    def drain(self) -> None:
        """The run stops with rollouts in flight: wait for them and drop them (a
        checkpoint holds the sampler from before they were drawn)."""
        if self._pending is not None:
            pending, self._pending = self._pending[1], None
            try:
                self.rollouts.result(pending)
            except Exception:  # noqa: BLE001 - nothing of it is kept; the run's own error matters
                pass

    def close(self) -> None:
        """Close the environment factory (what its episodes share: a sandbox pool, a
        checker process); `train()` does when it ends, however it ends. ponder's
        factories start again on their next use (a later `train()` or `evaluate_held_out`).
        Rollouts with a `close` (the gateway's server) are closed too."""
        close_env(self.env_factory)
        close_env(self.rollouts)

    def _metrics_log(self) -> MetricsLog:
        tracking = self.recipe.tracking
        return MetricsLog(self.run_dir, resume_step=self.step, trackers=list(tracking.trackers),
                          project=tracking.project, config=to_dict(self.recipe))  # fmt: skip

    def _log_extras(self, log: MetricsLog) -> None:
        """What metrics.jsonl does not hold: the step's advantages as a histogram and,
        every tracking.samples_every steps, a table of sampled episodes."""
        if self._last_step is None:
            return
        advantages, tasks, trajectories = self._last_step
        log.histogram(self.step, "advantages", advantages)
        every = self.recipe.tracking.samples_every
        if every and self.step % every == 0:
            columns, rows = episode_table(trajectories, tasks, self.recipe.tracking.samples)
            log.table(self.step, "samples", columns, rows)
        self._last_step = None

    def update_inputs(self) -> UpdateInputs:
        """What the update reads besides the batch (ponder.train.update.optimise)."""
        recipe = self.recipe
        return UpdateInputs(
            self.policy, self.value_head, recipe.algo, self.loss_config(), recipe.rollout.sampling.temperature,
            self.kl.coef, self._trainable(), self.optimizer, self.scheduler, recipe.optim.max_grad_norm,
            self.demonstration_batch(), self.masks_for, self._distill_term(),
        )  # fmt: skip

    def _distill_term(self) -> DistillTerm | None:
        """teacher.loss gkd / topk as a loss term of the update (opd is an advantage)."""
        teacher = self.recipe.teacher
        if self.teacher is None or teacher.loss == "opd" or self.recipe.algo.distill_coef == 0:
            return None
        temperature = self.recipe.rollout.sampling.temperature

        def teacher_logits(part: TokenBatch, keep: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
            return self.teacher.logits(part, [self._kind_of.get(g, "") for g in part.group_ids], keep, temperature)

        return DistillTerm(teacher.loss, self.recipe.algo.distill_coef, DistillConfig(teacher.beta, temperature),
                           teacher_logits)  # fmt: skip

    def demonstration_batch(self) -> TokenBatch | None:
        """This step's algo.sft_rows demonstrations (None without algo.sft_coef): the
        step-th slice of seeded shuffled epochs over them, so a resumed run takes the
        same ones."""
        if not self.demonstrations:
            return None
        rows, seed = self.recipe.algo.sft_rows, self.recipe.train.seed
        order = cycled_order(len(self.demonstrations), (self.step + 1) * rows, seed)[self.step * rows :]
        return collate([self.demonstrations[i] for i in order], self.policy.tokenizer.pad_token_id)

    def loss_config(self) -> LossConfig:
        algo = self.recipe.algo
        return LossConfig(algo.clip_low, algo.clip_high, algo.clip_c, algo.aggregation, algo.norm_constant, algo.value_clip)

    def evaluate_held_out(self) -> dict[str, float]:
        from ponder.eval import evaluate, held_out_recipe

        tick = time.perf_counter()
        recipe = held_out_recipe(self.recipe, self.recipe.train.eval_episodes)
        self.policy.model.eval()
        result = evaluate(recipe, policy=self.policy)
        metrics = {f"eval/{k}": float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
        metrics["time/eval_s"] = time.perf_counter() - tick
        return metrics

    def save(self) -> Path:
        objects = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {
                "step": self.step,
                "sampler": self._pending_state.get("sampler") if self._pending else self.sampler.state_dict(),
                "advantage_state": dict(self.advantage_state),
                "kl": self.kl.state_dict(),
                "best": self.best.state_dict(),
                "hacking": self.hacking.state_dict(),
                "rng": rng_state(),
                "sampling_rng": self._pending_state["sampling_rng"] if self._pending else self.backend.generator.get_state(),
            },
        }
        if self.value_head is not None:
            objects["value_head"] = self.value_head.state_dict()
        return save_checkpoint(self.run_dir, self.step, self.policy, objects)

    def resume(self) -> int:
        """Restore the latest checkpoint of run_dir; returns its step (0 when none)."""
        path = latest_checkpoint(self.run_dir)
        if path is None:
            if any((Path(self.run_dir) / "checkpoints").glob("step-*")):
                # Starting over silently would mix a new run into the old one's metrics.
                raise ValueError(f"{self.run_dir}: no intact checkpoint to resume from; "
                                 "start again with --overwrite")  # fmt: skip
            return 0
        state = load_checkpoint(path)
        load_adapter_weights(self.policy.model, path)
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        trainer = state["trainer"]
        self.step = trainer["step"]
        self.sampler.load_state_dict(trainer["sampler"])
        self.advantage_state = dict(trainer["advantage_state"])
        self.kl.load_state_dict(trainer["kl"])
        self.best.load_state_dict(trainer.get("best", {}))
        self.hacking.load_state_dict(trainer.get("hacking", {}))
        set_rng_state(trainer["rng"])
        self.backend.generator.set_state(trainer["sampling_rng"])
        self.backend.refresh()
        return self.step

    def _reference_policy(self) -> contextlib.AbstractContextManager[None]:
        """The model computes the KL reference's log-probs inside this context."""
        if self.reference_weights is not None:
            return weights_swapped(self.policy.model, self.reference_weights)
        return adapters_disabled(self.policy.model)

    def _trainable(self) -> list[torch.nn.Parameter]:
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        return params + (list(self.value_head.parameters()) if self.value_head is not None else [])

    def _total_updates(self) -> int:
        algo, cfg = self.recipe.algo, self.recipe.train
        episodes = cfg.tasks_per_step * self.recipe.rollout.group_size
        per_step = math.ceil(episodes / (algo.mini_batch_size or episodes)) * algo.epochs
        return max(1, per_step * cfg.steps)

    def _sample_groups(self) -> tuple[list[Task], list[Trajectory], RolloutStats, dict[str, float]]:
        """Roll out and score train.tasks_per_step tasks. With algo.group_filter, the
        groups it drops (e.g. all rewards equal: no signal) are replaced by fresh tasks'
        groups, up to algo.max_refills more rollouts (DAPO's dynamic sampling)."""
        algo, want = self.recipe.algo, self.recipe.train.tasks_per_step  # want: tasks still to roll out
        keep = GROUP_FILTERS.get(algo.group_filter)
        tasks: list[Task] = []
        kept: list[Trajectory] = []
        stats = RolloutStats()
        staleness = 0.0
        for rollout in range(algo.max_refills + 1):
            if rollout == 0 and self._pending is not None:  # drawn and sampled during the last update
                (fresh, pending), self._pending, staleness = self._pending, None, 1.0
                trajectories, part = self.rollouts.result(pending)
            else:
                fresh = self.sampler.next_batch(want)
                trajectories, part = self.rollouts.run(fresh)
                if hasattr(self.rollouts, "tasks_served"):  # an online gateway serves its drivers' tasks
                    fresh = self.rollouts.tasks_served(fresh)
            score_trajectories(trajectories, {t.id: t for t in fresh}, self.reward)
            _check_rewards(trajectories, self.step + 1)
            curriculum = self.sampler.observe(fresh, trajectories)
            for trajectory in trajectories:  # a task drawn again in a refill is a group of its own
                trajectory.group_id = f"{trajectory.group_id}#{rollout}" if rollout else trajectory.group_id
            tasks += fresh
            stats = _add_stats(stats, part)
            rewards = torch.tensor([t.reward if t.reward is not None else math.nan for t in trajectories])
            mask = keep(rewards, [t.group_id for t in trajectories]).tolist()
            kept += [t for t, k in zip(trajectories, mask) if k]
            want = len({t.group_id for t, k in zip(trajectories, mask) if not k})  # groups to replace
            if want == 0:
                break
        sampled = {"sampling/kept_groups": float(len({t.group_id for t in kept})), "sampling/rollouts": rollout + 1.0,
                   "policy/staleness": staleness, **curriculum}  # fmt: skip
        return tasks, kept or trajectories, stats, sampled  # nothing kept: the last rollout (no signal)

    def _request_stop(self, signum: int, frame: Any) -> None:
        """The first SIGINT/SIGTERM stops after the current step, with a checkpoint; a
        second one, or the watchdog after train.stop_grace_s, stops now (the last
        checkpoint is intact: resume from it), even when a step is stuck in native code."""
        if self.stop_requested:  # a second signal means now
            raise KeyboardInterrupt
        self.stop_requested = True
        grace = self.recipe.train.stop_grace_s
        if grace > 0:
            self._watchdog = threading.Timer(grace, _stop_now, (signum, grace))
            self._watchdog.daemon = True
            self._watchdog.start()


def _starting_weights(model: Any) -> dict[str, torch.Tensor] | None:
    """A snapshot of the trainable weights, or None when they are fresh LoRA adapters
    (every lora_B zero: the policy is the base model, which the reference pass gets
    cheaper with the adapters switched off)."""
    snapshot = trainable_snapshot(model)
    lora_only = all("lora_A" in name or "lora_B" in name for name in snapshot)
    fresh = lora_only and not any(bool(value.any()) for name, value in snapshot.items() if "lora_B" in name)
    return None if fresh else snapshot


def check_recipe(recipe: Recipe) -> None:
    """Raise ValueError (listing valid names) for an unknown estimator, loss, aggregation,
    KL, std scope, tracker, SFT behaviour or matmul precision, for wandb named but not installed, for an SFT
    oracle_fraction outside [0, 1], a negative algo.sft_coef or sft_rows below 1, for
    micro-batch sizes below 1 (update) or 0 (no-grad passes), and for rollout.context
    with what needs a forward over whole episodes (value-head advantages, kl_in_reward)
    or weighs rows (an aggregation other than token_mean)."""
    if recipe.sft.behaviour not in BEHAVIOURS:
        raise ValueError(f"sft.behaviour: unknown '{recipe.sft.behaviour}'; valid: {', '.join(BEHAVIOURS)}")
    if not 0.0 <= recipe.sft.oracle_fraction <= 1.0:
        raise ValueError(f"sft.oracle_fraction must be in [0, 1], got {recipe.sft.oracle_fraction}")
    ADVANTAGES.get(recipe.algo.advantage)
    POLICY_LOSSES.get(recipe.algo.loss)
    AGGREGATIONS.get(recipe.algo.aggregation)
    KL_ESTIMATORS.get(recipe.algo.kl_estimator)
    GROUP_FILTERS.get(recipe.algo.group_filter)
    CURRICULA.get(recipe.train.curriculum)
    check_trackers(recipe.tracking.trackers)
    check_matmul_dtype(recipe.rollout.sampling.dtype, "rollout.sampling.dtype")
    check_matmul_dtype(recipe.lora.base_matmul_dtype, "lora.base_matmul_dtype")
    if recipe.algo.std_scope not in STD_SCOPES:
        raise ValueError(f"algo.std_scope: unknown '{recipe.algo.std_scope}'; valid: {', '.join(STD_SCOPES)}")
    KL_REFERENCES.check(recipe.algo.kl_reference, "algo.kl_reference")
    if recipe.train.async_rollouts and recipe.algo.max_staleness < 1:
        raise ValueError("train.async_rollouts samples one step behind the update: it needs algo.max_staleness >= 1, "
                         f"got {recipe.algo.max_staleness}")  # fmt: skip
    if recipe.algo.distill_coef < 0 or bool(recipe.algo.distill_coef) != bool(recipe.teacher.model):
        raise ValueError("algo.distill_coef (>= 0) and teacher.model come together: the teacher scores what "
                         f"distill_coef weighs; got distill_coef {recipe.algo.distill_coef} and teacher.model "
                         f"{recipe.teacher.model!r}")  # fmt: skip
    if recipe.teacher.loss not in ("opd", *DISTILL_LOSSES.names()):
        raise ValueError(f"teacher.loss: unknown '{recipe.teacher.loss}'; valid: opd, "
                         f"{', '.join(DISTILL_LOSSES.names())}")  # fmt: skip
    if recipe.teacher.top_k < 1 or not 0 <= recipe.teacher.beta <= 1:
        raise ValueError(f"teacher.top_k must be >= 1 and teacher.beta in [0, 1], got {recipe.teacher.top_k} and "
                         f"{recipe.teacher.beta}")  # fmt: skip
    if recipe.algo.sft_coef < 0 or recipe.algo.sft_rows < 1:
        raise ValueError(f"algo.sft_coef must be >= 0 and algo.sft_rows >= 1, got {recipe.algo.sft_coef} and "
                         f"{recipe.algo.sft_rows}")  # fmt: skip
    _check_compaction(recipe)
    if recipe.algo.micro_batch_size < 1 or recipe.algo.logprob_micro_batch_size < 0:
        raise ValueError(
            f"algo.micro_batch_size must be >= 1 and algo.logprob_micro_batch_size >= 0 (0: same as micro_batch_size), "
            f"got {recipe.algo.micro_batch_size} and {recipe.algo.logprob_micro_batch_size}"
        )


def _check_compaction(recipe: Recipe) -> None:
    """rollout.context trains segment rows (train/segment_batch.py); what needs the model
    run over a whole episode's stream is refused."""
    algo = recipe.algo
    if not recipe.rollout.context.max_tokens:
        return
    if ADVANTAGES.trait(algo.advantage, "needs_values") or algo.kl_in_reward:
        what = "algo.kl_in_reward" if algo.kl_in_reward else f"algo.advantage {algo.advantage} (a value head)"
        raise ValueError(f"rollout.context: {what} needs a forward over whole episodes, which compacted ones do not "
                         "have; use a critic-free estimator (grpo, rloo, reinforce …) and the KL in the loss, "
                         "or rollout.context.max_tokens=0")  # fmt: skip
    if algo.aggregation != "token_mean":  # a compacted episode is one row per segment
        raise ValueError(f"rollout.context: algo.aggregation {algo.aggregation} weighs rows, and a compacted episode "
                         "is one row per segment; use token_mean")  # fmt: skip


def _stop_now(signum: int, grace: float) -> None:
    """The watchdog: the step did not finish within the grace period after a stop signal."""
    print(f"ponder: the step did not finish within {grace:g} s of {signal.Signals(signum).name}; stopping now "
          "(resume from the last checkpoint)", file=sys.stderr, flush=True)  # fmt: skip
    os._exit(128 + signum)


def _check_rewards(trajectories: list[Trajectory], step: int) -> None:
    if any(t.reward is not None and not math.isfinite(t.reward) for t in trajectories):
        raise TrainingError(f"step {step}: a reward is NaN or infinite; last good checkpoint kept")


def _add_stats(total: RolloutStats, part: RolloutStats) -> RolloutStats:
    """Two rollouts' statistics as one (times and counts add)."""
    return RolloutStats(total.episodes + part.episodes, total.generated_tokens + part.generated_tokens,
                        total.generation_s + part.generation_s, total.env_s + part.env_s,
                        total.wall_s + part.wall_s)  # fmt: skip

