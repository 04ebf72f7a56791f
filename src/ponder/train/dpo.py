"""Preferences and DPO: sample K responses per task through the environment, rank
them with the agent reward, keep (best, worst) when best > worst, then optimise a
registered preference loss (ponder.algos.dpo) against the reference = the base
with adapters disabled (its log-probs are computed once, before training).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ponder.algos.dpo import (
    PREFERENCE_LOSSES,
    PreferenceLossConfig,
    dpo_loss,
    sequence_logprobs,
    with_chosen_nll,
)  # fmt: skip
from ponder.config import DPOConfig, OptimConfig
from ponder.data.format import TokenizedExample
from ponder.models.cpu_threads import cpu_block
from ponder.models.forward import forward_policy
from ponder.models.logprobs import adapters_disabled
from ponder.runlog.metrics_log import MetricsLog
from ponder.train.batch import collate
from ponder.train.checkpoint import Resumable, rng_state, set_rng_state
from ponder.train.optim import build_optimizer, optimizer_step
from ponder.train.sampler import Cycle
from ponder.types import Task, Trajectory


@dataclass
class PreferenceExample:
    """Two tokenised continuations of one prompt (masks: 1 on the response tokens to score)."""

    chosen: TokenizedExample
    rejected: TokenizedExample


def trajectory_example(trajectory: Trajectory) -> TokenizedExample:
    return TokenizedExample(
        trajectory.prompt_ids + trajectory.response_ids,
        [0] * len(trajectory.prompt_ids) + list(trajectory.loss_mask),
        id=trajectory.task_id,
    )


def best_worst_pairs(
    trajectories: list[Trajectory], report: Counter | None = None
) -> list[tuple[Trajectory, Trajectory]]:
    """(best, worst) by reward within each group (group_id), only when best > worst.

    Ties go to the earliest sample. Unscorable (None) rewards are left out; groups
    where every sample scored the same are counted in report["tied groups"], and
    pairs whose responses are the same tokens in report["identical pair"].
    """
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        if trajectory.reward is not None:
            groups.setdefault(trajectory.group_id, []).append(trajectory)
    report = report if report is not None else Counter()
    pairs = []
    for group in groups.values():
        best = max(group, key=lambda t: t.reward)
        worst = min(group, key=lambda t: t.reward)
        if not best.reward > worst.reward:
            report["tied groups"] += 1
        elif best.response_ids == worst.response_ids:
            report["identical pair"] += 1
        else:
            pairs.append((best, worst))
    return pairs


def sample_preferences(
    policy: Any,
    tasks: list[Task],
    engine_for: Callable[[Any], Any],
    reward: Callable[..., Any],
    cfg: DPOConfig,
) -> tuple[list[tuple[Trajectory, Trajectory]], dict[str, Any]]:
    """Roll out K = cfg.samples_per_prompt episodes per task with `engine_for(K)`, score
    them with `reward`, and keep the best/worst pairs. Returns (pairs, report)."""
    from ponder.rewards import score_trajectories

    policy.model.eval()
    trajectories, stats = engine_for(cfg.samples_per_prompt).run(tasks)
    score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
    skipped: Counter = Counter()
    pairs = best_worst_pairs(trajectories, skipped)
    rewards = [t.reward for t in trajectories if t.reward is not None]
    report = {
        "prompts": len(tasks), "samples": len(trajectories), "pairs": len(pairs), "skipped": dict(skipped),
        "mean_sample_reward": sum(rewards) / max(1, len(rewards)), "sampling_s": stats.wall_s,
    }  # fmt: skip
    if not pairs:
        raise ValueError(
            f"no preference pair: all {len(tasks)} groups of {cfg.samples_per_prompt} samples tied"
        )
    return pairs, report


def pair_logprobs(
    policy: Any, pairs: list[PreferenceExample], average: bool, reference: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence log-probs [P] of the chosen and the rejected sides (one batch of 2P rows),
    and the chosen side's mean log-prob per token [P]."""
    rows = [p.chosen.to_trajectory() for p in pairs] + [p.rejected.to_trajectory() for p in pairs]
    batch = collate(rows, policy.tokenizer.pad_token_id)
    mask = batch.loss_mask.to(policy.device)
    ids, attention = batch.input_ids.to(policy.device), batch.attention_mask.to(policy.device)
    if reference:
        with torch.no_grad(), adapters_disabled(policy.model):
            logprobs, _, _ = forward_policy(policy.model, ids, attention, loss_mask=mask)
    else:
        logprobs, _, _ = forward_policy(policy.model, ids, attention, loss_mask=mask)
    sequence = sequence_logprobs(logprobs, mask, average)
    chosen_mean = sequence_logprobs(logprobs[: len(pairs)], mask[: len(pairs)], average=True)
    return sequence[: len(pairs)], sequence[len(pairs) :], chosen_mean


class DPOTrainer(Resumable):
    """The loop: pairs → log-probs → preference loss vs the fixed reference → step → log → checkpoint."""

    def __init__(
        self, policy: Any, pairs: list[PreferenceExample], cfg: DPOConfig, run_dir: str | Path, seed: int = 0
    ) -> None:
        if not pairs:
            raise ValueError("no preference pairs to train on")
        PREFERENCE_LOSSES.get(cfg.loss)  # an unknown name fails before any work
        self.policy, self.pairs, self.cfg, self.run_dir = policy, pairs, cfg, Path(run_dir)
        self.loss_cfg = PreferenceLossConfig(cfg.loss, cfg.beta, cfg.label_smoothing, cfg.reference_free)
        self.average = PREFERENCE_LOSSES.trait(cfg.loss, "average_logprobs")  # IPO: token-mean log-probs
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, schedule="cosine")
        self.optimizer, self.scheduler = build_optimizer(self.params, optim, max(1, cfg.steps))
        self.order = Cycle(len(pairs), seed)  # seeded shuffled epochs of the pairs
        self.step = 0
        self.reference = self._reference_logprobs()

    def _reference_logprobs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.cfg.reference_free:
            return None
        self.policy.model.eval()
        chosen, rejected = [], []
        for start in range(0, len(self.pairs), self.cfg.micro_batch_size):
            c, r, _ = pair_logprobs(
                self.policy, self.pairs[start : start + self.cfg.micro_batch_size], self.average, True
            )
            chosen.append(c.cpu())
            rejected.append(r.cpu())
        return torch.cat(chosen), torch.cat(rejected)

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        history = []
        # from step 0 too: lines a run killed before its first checkpoint logged go
        with MetricsLog(self.run_dir, tensorboard=False, resume_step=self.step) as log:
            while self.step < self.cfg.steps:
                metrics = self.train_step()
                self.step += 1
                log.log(self.step, metrics)
                history.append(metrics)
                if on_step is not None:
                    on_step(self.step, metrics)
                if self.step == self.cfg.steps or self.step % self.cfg.save_every == 0:
                    self.save()
        self.policy.model.eval()
        return history

    def train_step(self) -> dict[str, float]:
        indices = self.order.next(self.cfg.batch_size)
        self.policy.model.train()
        sums = Counter()
        for start in range(0, len(indices), self.cfg.micro_batch_size):
            part = indices[start : start + self.cfg.micro_batch_size]
            pairs = [self.pairs[i] for i in part]
            with cpu_block():  # fewer while other processes hold the cores
                chosen, rejected, chosen_mean = pair_logprobs(self.policy, pairs, self.average)
                ref = (None, None)
                if self.reference is not None:
                    index = torch.tensor(part)
                    ref = tuple(side[index].to(chosen.device) for side in self.reference)
                losses, stats = dpo_loss(chosen, rejected, ref[0], ref[1], self.loss_cfg)
                stats["chosen_nll"] = -chosen_mean.detach()
                losses = with_chosen_nll(losses, chosen_mean, self.cfg.rpo_alpha)
                (losses.sum() / len(indices)).backward()  # exact mean over the whole batch
            sums["loss"] += float(losses.detach().sum())
            for name, values in stats.items():
                sums[name] += float(values.sum())
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.scheduler, self.cfg.max_grad_norm)
        metrics = {f"dpo/{name}": value / len(indices) for name, value in sums.items()}
        metrics["dpo/margin"] = metrics["dpo/chosen_reward"] - metrics["dpo/rejected_reward"]
        metrics.update({"dpo/grad_norm": grad_norm, "dpo/lr": lr})
        return metrics

    def trainer_state(self) -> dict[str, Any]:
        return {"step": self.step, "order": self.order.state_dict(), "global_rng": rng_state()}

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state["order"])
        set_rng_state(state["global_rng"])


def with_group_size(rollout: Any, samples: int, temperature: float) -> Any:
    """The rollout config for preference sampling: K samples per task at `temperature`."""
    return replace(rollout, group_size=samples, sampling=replace(rollout.sampling, temperature=temperature))
