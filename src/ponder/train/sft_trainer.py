"""SFT on tokenised conversations: loss on assistant tokens only, task-type weighted
sampling, gradient accumulation (exact token mean over the whole batch), warm-up
then cosine LR, eval loss, checkpoint/resume like the RL trainer, and optional
rehearsal (replay) and EWC for continual learning.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ponder.config import OptimConfig, SFTTrainerConfig
from ponder.data.format import TokenizedExample, pack
from ponder.models.cpu_threads import cpu_block
from ponder.models.forward import forward_policy
from ponder.runlog.metrics_log import MetricsLog
from ponder.train.batch import collate
from ponder.train.checkpoint import restore_training_state, rng_state, save_training_state, set_rng_state
from ponder.train.continual import EWCState, ReservoirBuffer, replay_count
from ponder.train.optim import build_optimizer, optimizer_step

MAX_GRAD_NORM = 1.0


class ExampleSampler:
    """Seeded draws of example indices. Equal weights: shuffled epochs; otherwise
    independent draws with probability ∝ the weight of the example's task type."""

    def __init__(self, task_types: list[str], weights: dict[str, float], seed: int) -> None:
        self.weights = [float(weights.get(t, 1.0)) for t in task_types]
        if any(w < 0 for w in self.weights) or not any(self.weights):
            raise ValueError(f"task weights must be >= 0 with one > 0, got {weights}")
        self.uniform = len(set(self.weights)) == 1
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self, count: int) -> list[int]:
        if not self.uniform:
            return self.rng.choices(range(len(self.weights)), weights=self.weights, k=count)
        picked = []
        while len(picked) < count:
            if not self.order:
                self.order = list(range(len(self.weights)))
                self.rng.shuffle(self.order)
            picked.append(self.order.pop())
        return picked

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


@dataclass
class SFTInputs:
    """What one SFT run trains on.

    train / eval: tokenised examples. task_weights: task type -> sampling weight.
    replay: rehearsal buffer whose items are mixed into each batch (replay_ratio).
    ewc: EWC state of earlier tasks (penalty added to every step's loss).
    pack_tokens: row length when cfg.packing is on.
    """

    train: list[TokenizedExample]
    eval: list[TokenizedExample] = field(default_factory=list)
    task_weights: dict[str, float] = field(default_factory=dict)
    replay: ReservoirBuffer | None = None
    replay_ratio: float = 0.0
    ewc: EWCState | None = None
    pack_tokens: int = 1024


def token_nll(
    policy: Any,
    examples: list[TokenizedExample],
    micro_batch_size: int,
    denominator: float | None = None,
    backward: bool = False,
) -> float:
    """Σ assistant-token NLL / denominator (default: their count), optionally backpropagated."""
    rows = [e.to_trajectory() for e in examples]
    total_tokens = denominator or float(sum(sum(e.loss_mask[1:]) for e in examples)) or 1.0
    total = 0.0
    for start in range(0, len(rows), micro_batch_size):
        batch = collate(rows[start : start + micro_batch_size], policy.tokenizer.pad_token_id)
        mask = batch.loss_mask.to(policy.device)
        ids, attention = batch.input_ids.to(policy.device), batch.attention_mask.to(policy.device)
        with torch.set_grad_enabled(backward), cpu_block():
            logprobs, _, _ = forward_policy(policy.model, ids, attention, loss_mask=mask)
            loss = -(logprobs * mask).sum() / total_tokens
            if backward:
                loss.backward()
        total += float(loss.detach())
    return total


class SFTTrainer:
    """The loop: sample → (replay) → accumulate → clip → step → log → eval → checkpoint."""

    def __init__(
        self, policy: Any, inputs: SFTInputs, cfg: SFTTrainerConfig, run_dir: str | Path, seed: int = 0
    ) -> None:
        if not inputs.train:
            raise ValueError("no SFT examples to train on")
        self.policy, self.cfg, self.run_dir = policy, cfg, Path(run_dir)
        self.inputs = inputs
        self.train_rows = pack(inputs.train, inputs.pack_tokens) if cfg.packing else inputs.train
        self.sampler = ExampleSampler([e.task_type for e in self.train_rows], inputs.task_weights, seed)
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule)
        self.optimizer, self.scheduler = build_optimizer(self.params, optim, max(1, cfg.steps))
        self.step = 0

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        history = []
        # from step 0 too: lines a run killed before its first checkpoint logged go
        with MetricsLog(self.run_dir, tensorboard=False, resume_step=self.step) as log:
            while self.step < self.cfg.steps:
                metrics = self.train_step()
                self.step += 1
                last = self.step == self.cfg.steps
                if self.inputs.eval and (
                    last or (self.cfg.eval_every and self.step % self.cfg.eval_every == 0)
                ):
                    metrics["sft/eval_loss"] = self.eval_loss()
                log.log(self.step, metrics)
                history.append(metrics)
                if on_step is not None:
                    on_step(self.step, metrics)
                if last or self.step % self.cfg.save_every == 0:
                    self.save()
        self.policy.model.eval()
        return history

    def train_step(self) -> dict[str, float]:
        cfg, inputs = self.cfg, self.inputs
        replayed = replay_count(cfg.batch_size, inputs.replay_ratio, len(inputs.replay or []))
        rows = [self.train_rows[i] for i in self.sampler.next(cfg.batch_size - replayed)]
        rows += inputs.replay.sample(replayed) if inputs.replay is not None else []
        self.policy.model.train()
        tokens = float(sum(sum(e.loss_mask[1:]) for e in rows)) or 1.0
        loss = token_nll(self.policy, rows, cfg.micro_batch_size, tokens, backward=True)
        penalty = 0.0
        if inputs.ewc is not None:
            term = inputs.ewc.penalty(self.policy)
            if term.requires_grad:
                term.backward()
            penalty = float(term.detach())
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.scheduler, MAX_GRAD_NORM)
        return {"sft/loss": loss, "sft/ewc_penalty": penalty, "sft/grad_norm": grad_norm, "sft/lr": lr,
                "sft/replayed": float(replayed), "sft/tokens": tokens}  # fmt: skip

    def eval_loss(self) -> float:
        self.policy.model.eval()
        return token_nll(self.policy, self.inputs.eval, self.cfg.micro_batch_size)

    def save(self) -> Path:
        trainer = {"step": self.step, "sampler": self.sampler.state_dict(), "rng": rng_state()}
        if self.inputs.replay is not None:
            trainer["replay"] = self.inputs.replay.state_dict()
        return save_training_state(self.run_dir, self.step, self.policy, self.optimizer, self.scheduler, trainer)

    def resume(self) -> int:
        """Restore the latest checkpoint of run_dir; returns its step (0 when none)."""
        trainer = restore_training_state(self.run_dir, self.policy.model, self.optimizer, self.scheduler)
        if trainer is None:
            return 0
        self.step = trainer["step"]
        self.sampler.load_state_dict(trainer["sampler"])
        if self.inputs.replay is not None and "replay" in trainer:
            self.inputs.replay.load_state_dict(trainer["replay"])
        set_rng_state(trainer["rng"])
        return self.step
