"""KL to the reference policy: per-token estimators, the in-reward penalty and the
coefficient controllers (fixed, and Ziegler et al.'s adaptive one).

The estimators see only the sampled token's log-probabilities under the policy π and
the reference π_ref, and estimate KL(π ‖ π_ref) (Schulman, "Approximating KL
divergence", 2020). Use them either in the reward (`kl_penalty_rewards`, then into
AdvantageInput.token_rewards) or as a loss term (aggregate `kl_estimate` like the
policy loss).
"""

from __future__ import annotations

from typing import Callable

import torch

from ponder.registry import Registry

KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("kl estimator")

#: what algo.kl_reference may name (entries: what the reference is); trait `snapshot`:
#: the trainer keeps a copy of the trainable weights as the run began to score it with
KL_REFERENCES: Registry[str] = Registry("kl reference", {"snapshot": False})
KL_REFERENCES.add("start", "the policy as this RL run began", snapshot=True)
KL_REFERENCES.add("base", "the base model (adapters disabled)")

#: verl's k3 clamps: the log-ratio to ±20 before exp, the estimate to ≤ 10.
K3_LOG_RATIO_CLAMP = 20.0
K3_MAX = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π − log π_ref. Unbiased, high variance, can be negative. Shapes: any, equal."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π − log π_ref)². Biased, low variance, ≥ 0. Shapes: any, equal."""
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = (ρ − 1) − log ρ with ρ = π_ref / π: unbiased, low variance and ≥ 0
    ("low_var_kl" in verl). log ρ is clamped to ±20 and the result to ≤ 10, as verl does,
    so a token the reference finds impossible cannot blow the loss up. Shapes: any, equal.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (log_ratio.exp() - 1.0 - log_ratio).clamp(min=0.0, max=K3_MAX)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref); `kind` is k1, k2 or k3. logprobs, ref_logprobs:
    [B, T] log-probabilities of the sampled tokens; returns [B, T] (unmasked: mask it
    when you reduce)."""
    return KL_ESTIMATORS.get(kind)(logprobs, ref_logprobs)


def kl_penalty_rewards(token_kl: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token reward penalty for the "KL in reward" mode: −coef · kl where mask is 1,
    0 elsewhere. token_kl, mask: [B, T]. Feed it as AdvantageInput.token_rewards."""
    penalty = -coef * token_kl
    return torch.where(mask.bool(), penalty, torch.zeros_like(penalty))


class FixedKLController:
    """A constant KL coefficient. `coef` is what the trainer multiplies the KL by."""

    def __init__(self, coef: float) -> None:
        self.coef = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op; present so trainers treat both controllers alike."""

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])


class AdaptiveKLController:
    """Ziegler et al. (2019) adaptive coefficient: steer the observed KL toward `target`.

    update(current_kl, n_steps): e = clip(current_kl / target − 1, −0.2, 0.2);
    coef ← coef · (1 + e · n_steps / horizon). n_steps is the number of samples (or
    steps) since the last update, horizon how many of them a full correction takes.
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target ({target}) and horizon ({horizon}) must be > 0")
        self.coef = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restores coef (the learned part); target and horizon come from the config."""
        self.coef = float(state["coef"])
