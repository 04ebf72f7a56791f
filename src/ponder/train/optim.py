"""AdamW with linear warm-up then a constant, linear or cosine schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ponder.config import OptimConfig
from ponder.registry import Registry

#: optim.schedule -> the LR multiplier after warm-up, as a function of progress in [0, 1]
SCHEDULES: Registry[Callable[[float], float]] = Registry("LR schedule")


@SCHEDULES.register("constant")
def constant_schedule(progress: float) -> float:
    return 1.0


@SCHEDULES.register("linear")
def linear_schedule(progress: float) -> float:
    return 1.0 - progress


@SCHEDULES.register("cosine")
def cosine_schedule(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return SCHEDULES.get(schedule)(progress)


def build_optimizer(
    params: list[torch.nn.Parameter], config: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    SCHEDULES.check(config.schedule)
    if not params:
        raise ValueError("nothing to train: no parameter requires grad")
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.warmup_steps, total_steps, config.schedule)
    )
    return optimizer, scheduler


class NonFiniteError(RuntimeError):
    """A loss or gradient is NaN or infinite; nothing was applied to the weights."""


def optimizer_step(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
) -> tuple[float, float]:  # fmt: skip
    """The one optimizer step SFT, DPO and RL share: clip the accumulated gradients
    (max_grad_norm None or 0 = no clipping), refuse a NaN / infinite gradient (the
    gradients are dropped and NonFiniteError raised, the weights untouched), step the
    optimizer and the LR schedule. Returns (gradient norm before clipping, the LR used)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError("gradient norm is NaN or infinite")
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm), lr
