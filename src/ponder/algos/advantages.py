"""Advantage estimators: registered pure functions with one shared signature.

    estimator(inp: AdvantageInput, cfg: AdvantageConfig, state: dict) -> (advantages, returns)

both [B, T] and 0 wherever `inp.loss_mask` is 0. `state` is a dict the trainer keeps
across steps and saves in checkpoints (plain floats and ints only); only `reinforce`
uses it. Estimators run under `torch.no_grad`: advantages are targets, not graph nodes.
Group statistics are computed in float64 and cast back to the output dtype.

A reward of NaN marks an episode no reward function could score (a reward callable
returned None): it gets zero advantage and is left out of every baseline.

Add one with::

    @ADVANTAGES.register("mine")
    def mine(inp, cfg, state): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ponder.algos.utils import masked_sum, masked_whiten
from ponder.registry import Registry


@dataclass
class AdvantageInput:
    """Everything an estimator may read. B episodes, T response tokens, K turns.

    rewards: [B] scalar episode reward (the outcome); NaN = unscorable.
    loss_mask: [B, T] 1 on policy tokens (what the model generated), 0 on prompt,
        observation / tool output and padding.
    group_ids: len B; episodes of the same task share a group id (GRPO's G samples).
    turn_ids: [B, T] long, the turn each response token belongs to, -1 on padding (`turn`).
    turn_rewards: [B, K] per-turn rewards, 0 past an episode's last turn (`turn`).
    turn_mask: [B, K] 1 where the episode has turn k (`turn`).
    values: [B, T] value-head predictions (`gae`).
    token_rewards: [B, T] optional per-token rewards added to the outcome, e.g. the
        −coef·KL penalty of the "KL in reward" mode. `gae` uses them per token, `turn`
        adds them to the turn they fall in, the outcome estimators add their masked sum
        to the episode reward.
    """

    rewards: torch.Tensor
    loss_mask: torch.Tensor
    group_ids: list[str]
    turn_ids: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    turn_mask: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None


@dataclass
class AdvantageConfig:
    """Settings of the advantage estimators.

    norm_by_std: grpo and turn divide by a std; False = Dr. GRPO (centre only).
    std_scope: which std: `group` (each group's own, GRPO) or `batch` (one std of the
        group-centred rewards over the whole batch, TRL's scale_rewards="batch"). The
        batch std keeps the size of a group's reward differences: a group whose samples
        differ only by a 0.1 search cost gets a 10× smaller advantage than one where some
        samples answered right, instead of the same ±1.
    eps: added to the std before dividing.
    gamma: discount; per token for gae, per turn for turn. Outcome estimators ignore it.
    lam: GAE's λ (1 = Monte-Carlo return minus value, 0 = one-step TD error).
    baseline_momentum: reinforce's running-mean baseline, b ← m·b + (1−m)·batch mean.
    whiten_gae: gae normalises its advantages over the batch (masked mean 0, std 1), as
        verl always does; off by default so the raw GAE is what the loss sees.
    """

    norm_by_std: bool = True
    std_scope: str = "group"
    eps: float = 1e-6
    gamma: float = 1.0
    lam: float = 1.0
    baseline_momentum: float = 0.9
    whiten_gae: bool = False


Estimator = Callable[[AdvantageInput, AdvantageConfig, dict[str, Any]], tuple[torch.Tensor, torch.Tensor]]
#: trait `needs_values`: the estimator reads AdvantageInput.values (the trainer adds a value head)
ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", {"needs_values": False})


def group_index(group_ids: list[str]) -> torch.Tensor:
    """[B] long: the group id of each episode as 0..G−1, in order of first appearance."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def group_stats(values: torch.Tensor, valid: torch.Tensor, groups: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per (group, column) statistics of `values` over the rows that are valid there.

    values: [B, K]; valid: [B, K] bool (False rows are ignored, whatever they hold);
    groups: [B] long in [0, G). Returns float64 [G, K] tensors: `count`, `mean`,
    `std` (unbiased, n−1, like verl's torch.std; 0 when count < 2) and `spread`
    (max − min, exactly 0 when all valid values are equal, so ties give exactly 0
    advantage instead of rounding noise divided by eps).
    """
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    member = F.one_hot(groups, n_groups).T.double()  # [G, B]
    x = torch.where(valid, values.double(), 0.0)
    count = member @ valid.double()
    mean = (member @ x) / count.clamp(min=1)
    centered = torch.where(valid, x - mean[groups], 0.0)
    std = ((member @ centered.square()) / (count - 1).clamp(min=1)).sqrt()
    idx = groups[:, None].expand_as(x)
    hi = torch.full_like(count, -torch.inf).scatter_reduce(0, idx, torch.where(valid, x, -torch.inf), "amax")
    lo = torch.full_like(count, torch.inf).scatter_reduce(0, idx, torch.where(valid, x, torch.inf), "amin")
    spread = torch.where(count > 0, hi - lo, 0.0)
    return {"count": count, "mean": mean, "std": std, "spread": spread}


STD_SCOPES = ("group", "batch")


def group_normalize(
    values: torch.Tensor, valid: torch.Tensor, groups: torch.Tensor, norm_by_std: bool, eps: float,
    std_scope: str = "group",
) -> torch.Tensor:
    """GRPO's group-relative score, column by column.

    values, valid: [B, K] (valid bool); groups: [B] long. out[b, k] = (v − mean) / (std + eps)
    (or v − mean without norm_by_std), mean over the rows of b's group valid at k; std
    over the same rows (std_scope `group`) or, for `batch`, the unbiased std of the
    centred values of every row valid at k whose group has ≥ 2 such rows. 0 where
    invalid, where fewer than 2 rows of the group are valid at k, or where they are all
    equal. float64 [B, K].
    """
    _check_std_scope(std_scope)
    stats = {name: s[groups] for name, s in group_stats(values, valid, groups).items()}
    centered = values.double() - stats["mean"]
    keep = valid & (stats["count"] >= 2) & (stats["spread"] > 0)
    if not norm_by_std:
        return torch.where(keep, centered, 0.0)
    std = stats["std"] if std_scope == "group" else _column_std(centered, valid & (stats["count"] >= 2))
    return torch.where(keep, centered / (std + eps), 0.0)


def _check_std_scope(std_scope: str) -> None:
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; valid: {', '.join(STD_SCOPES)}")


def _column_std(centered: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[1, K]: unbiased std of the already group-centred values over `rows`, per column
    (the group means are not subtracted again: the mean of centred values is 0)."""
    n = rows.sum(0, keepdim=True).double()
    total = torch.where(rows, centered.square(), 0.0).sum(0, keepdim=True)
    return (total / (n - 1).clamp(min=1)).sqrt()


def discounted_turn_returns(
    turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_k = Σ_{j≥k, j valid} γ^{j−k} r_j per episode.

    turn_rewards, turn_mask: [B, K]; rewards where turn_mask is 0 are ignored.
    Returns float64 [B, K], 0 where turn_mask is 0.
    """
    valid = turn_mask.bool()
    rewards = torch.where(valid, turn_rewards.double(), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for k in reversed(range(rewards.shape[1])):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return torch.where(valid, returns, 0.0)


def last_token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Place each episode's reward on its last policy token.

    rewards: [B]; loss_mask: [B, T]. Returns [B, T] float64, zero elsewhere (and a zero
    row for an episode without policy tokens or with a NaN reward).
    """
    mask = loss_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values  # [B], -1 = no policy token
    out = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    has = (last >= 0) & torch.isfinite(rewards)
    out[has, last[has]] = rewards[has].double()
    return out


def generalized_advantage_estimate(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Token-level GAE over policy tokens only.

    token_rewards, values, loss_mask: [B, T]. Observation tokens (mask 0) are not actions:
    they are skipped, so the "next value" of a policy token is the value at the NEXT
    POLICY token, and its "next advantage" is that token's — the environment's text
    between two turns is part of the transition, as in verl's multi-turn GAE. Rewards
    and values at mask-0 positions are ignored; after the last policy token the next
    value is 0 (terminal). Returns float64 [B, T], 0 where mask is 0.
    """
    mask = loss_mask.bool()
    rewards = torch.where(mask, token_rewards.double(), 0.0)
    vals = torch.where(mask, values.double(), 0.0)
    adv = torch.zeros_like(vals)
    next_value = torch.zeros_like(vals[:, 0])
    next_adv = torch.zeros_like(vals[:, 0])
    for t in reversed(range(vals.shape[1])):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        here = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(mask[:, t], here, 0.0)
        next_value = torch.where(mask[:, t], vals[:, t], next_value)
        next_adv = torch.where(mask[:, t], here, next_adv)
    return adv


def _check(inp: AdvantageInput, name: str, *needs: str) -> None:
    batch = inp.rewards.shape[0]
    if inp.rewards.dim() != 1 or inp.loss_mask.dim() != 2 or inp.loss_mask.shape[0] != batch:
        raise ValueError(f"{name}: rewards must be [B] and loss_mask [B, T]; got "
                         f"{tuple(inp.rewards.shape)} and {tuple(inp.loss_mask.shape)}")
    if len(inp.group_ids) != batch:
        raise ValueError(f"{name}: {len(inp.group_ids)} group_ids for {batch} episodes")
    for field_name in needs:
        if getattr(inp, field_name) is None:
            raise ValueError(f"advantage estimator '{name}' needs AdvantageInput.{field_name}")
    for field_name in ("turn_ids", "values", "token_rewards"):
        tensor = getattr(inp, field_name)
        if tensor is not None and tensor.shape != inp.loss_mask.shape:
            raise ValueError(f"{name}: {field_name} {tuple(tensor.shape)} != loss_mask "
                             f"{tuple(inp.loss_mask.shape)}")
    if inp.turn_rewards is not None and inp.turn_mask is not None:
        if inp.turn_rewards.shape != inp.turn_mask.shape or inp.turn_rewards.shape[0] != batch:
            raise ValueError(f"{name}: turn_rewards {tuple(inp.turn_rewards.shape)} and turn_mask "
                             f"{tuple(inp.turn_mask.shape)} must both be [B={batch}, K]")


def _out_dtype(inp: AdvantageInput) -> torch.dtype:
    for tensor in (inp.values, inp.rewards):
        if tensor is not None and tensor.is_floating_point():
            return tensor.dtype
    return torch.get_default_dtype()


def _episode_rewards(inp: AdvantageInput) -> torch.Tensor:
    """[B] float64 outcome: rewards plus the masked sum of token_rewards, if any."""
    rewards = inp.rewards.double()
    if inp.token_rewards is not None:
        rewards = rewards + masked_sum(inp.token_rewards.double(), inp.loss_mask, dim=1)
    return rewards


def _broadcast(per_episode: torch.Tensor, inp: AdvantageInput) -> torch.Tensor:
    """[B] → [B, T] on policy tokens (0 elsewhere and for NaN episodes), output dtype."""
    keep = inp.loss_mask.bool() & torch.isfinite(per_episode)[:, None]
    return torch.where(keep, per_episode[:, None], 0.0).to(_out_dtype(inp))


@ADVANTAGES.register("reinforce")
@torch.no_grad()
def reinforce_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """REINFORCE with a running-mean baseline: A_i = r_i − b, broadcast to policy tokens.

    Order: A is computed with the baseline from PAST batches, then the baseline is
    updated, b ← m·b + (1−m)·mean(this batch), and stored in state["reinforce_baseline"].
    On the first step (no baseline yet) b = mean of this batch. Returns = r on policy tokens.
    """
    _check(inp, "reinforce")
    rewards = _episode_rewards(inp)
    scored = torch.isfinite(rewards)
    if not scored.any():
        return _broadcast(torch.zeros_like(rewards), inp), _broadcast(torch.zeros_like(rewards), inp)
    batch_mean = float(rewards[scored].mean())
    baseline = float(state.get("reinforce_baseline", batch_mean))
    advantages = rewards - baseline
    momentum = cfg.baseline_momentum
    state["reinforce_baseline"] = momentum * baseline + (1.0 - momentum) * batch_mean
    return _broadcast(advantages, inp), _broadcast(rewards, inp)


@ADVANTAGES.register("rloo")
@torch.no_grad()
def rloo_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """REINFORCE leave-one-out: A_i = r_i − mean of the OTHER scored rewards in i's group
    = n/(n−1)·(r_i − group mean). Group of 1 (or all equal) → 0. Broadcast to policy
    tokens; returns = r on policy tokens.
    """
    _check(inp, "rloo")
    rewards = _episode_rewards(inp)
    valid = torch.isfinite(rewards)[:, None]
    groups = group_index(inp.group_ids).to(rewards.device)
    stats = {k: s[groups, 0] for k, s in group_stats(rewards[:, None], valid, groups).items()}
    n = stats["count"]
    advantages = n / (n - 1).clamp(min=1) * (rewards - stats["mean"])
    keep = valid[:, 0] & (n >= 2) & (stats["spread"] > 0)
    return _broadcast(torch.where(keep, advantages, 0.0), inp), _broadcast(rewards, inp)


@ADVANTAGES.register("grpo")
@torch.no_grad()
def grpo_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """GRPO: A_i = (r_i − mean_g) / (std_g + eps), or r_i − mean_g when not norm_by_std
    (Dr. GRPO). std_g is the UNBIASED group std (n−1), as verl's torch.std. Group of 1
    → 0 (verl instead passes r_i through). Broadcast; returns = r on policy tokens.
    """
    _check(inp, "grpo")
    rewards = _episode_rewards(inp)
    valid = torch.isfinite(rewards)[:, None]
    groups = group_index(inp.group_ids).to(rewards.device)
    advantages = group_normalize(rewards[:, None], valid, groups, cfg.norm_by_std, cfg.eps, cfg.std_scope)[:, 0]
    return _broadcast(advantages, inp), _broadcast(rewards, inp)


@ADVANTAGES.register("none")
@torch.no_grad()
def no_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """No signal from the reward (0 everywhere): with algo.distill_coef, on-policy
    distillation alone; the reward is still computed and logged."""
    zeros = torch.zeros_like(inp.loss_mask, dtype=_out_dtype(inp))
    return zeros, zeros.clone()


@ADVANTAGES.register("gae", needs_values=True)
@torch.no_grad()
def gae_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """PPO's GAE: the episode reward sits on the last policy token (plus token_rewards,
    if any), `generalized_advantage_estimate` runs over policy tokens only (observation
    tokens skipped), returns = advantages + values (the critic's target, before any
    whitening). Optional batch whitening with cfg.whiten_gae.
    """
    _check(inp, "gae", "values")
    mask = inp.loss_mask.bool()
    token_rewards = last_token_rewards(inp.rewards, mask)
    if inp.token_rewards is not None:
        token_rewards = token_rewards + inp.token_rewards.double()
    advantages = generalized_advantage_estimate(token_rewards, inp.values, mask, cfg.gamma, cfg.lam)
    advantages = torch.where(torch.isfinite(inp.rewards)[:, None], advantages, 0.0)
    returns = torch.where(mask, advantages + inp.values.double(), 0.0)
    if cfg.whiten_gae:
        advantages = masked_whiten(advantages, mask & torch.isfinite(inp.rewards)[:, None])
    dtype = _out_dtype(inp)
    return advantages.to(dtype), returns.to(dtype)


def _turns_to_tokens(per_turn: torch.Tensor, turn_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """per_turn [B, K] → [B, T]: each policy token gets its turn's value (0 off-mask)."""
    n_turns = per_turn.shape[1]
    keep = loss_mask.bool() & (turn_ids >= 0) & (turn_ids < n_turns)
    gathered = per_turn.gather(1, turn_ids.long().clamp(0, max(n_turns - 1, 0)))
    return torch.where(keep, gathered, 0.0)


@ADVANTAGES.register("turn")
@torch.no_grad()
def turn_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """Turn-level credit: G_k = Σ_{j≥k} γ^{j−k} r_j from per-turn rewards, normalised
    group-relatively PER TURN POSITION k over the episodes of the group that have turn
    k (GRPO's rule, std if norm_by_std), then broadcast to the tokens of turn k.
    Returns = G_k on the tokens of turn k. `inp.rewards` is not read: put the outcome
    in turn_rewards at the last turn.

    Bias when the policy decides when to stop: an episode that ended at turn k has no
    turn k+1, so position k+1 is normalised over a survivor-selected subset (those that
    chose to go on), not over the group; and at one position a short episode's G_k (the
    answer turn) is compared with a long one's (a mid-search turn) though they mean
    different things. Comparing by position assumes episodes are aligned turn by turn.
    """
    _check(inp, "turn", "turn_ids", "turn_rewards", "turn_mask")
    turn_rewards = _per_turn_rewards(inp)
    valid = inp.turn_mask.bool()
    returns = discounted_turn_returns(turn_rewards, valid, cfg.gamma)
    groups = group_index(inp.group_ids).to(returns.device)
    advantages = group_normalize(returns, valid, groups, cfg.norm_by_std, cfg.eps, cfg.std_scope)
    dtype = _out_dtype(inp)
    return (_turns_to_tokens(advantages, inp.turn_ids, inp.loss_mask).to(dtype),
            _turns_to_tokens(returns, inp.turn_ids, inp.loss_mask).to(dtype))


@ADVANTAGES.register("togo")
@torch.no_grad()
def togo_advantage(inp: AdvantageInput, cfg: AdvantageConfig, state: dict[str, Any]):
    """Reward-to-go against the task's baseline: the tokens of turn k of episode i get
    (G_ik − mean_g G_0) / (std_g G_0 + eps), G_ik = Σ_{j≥k} γ^{j−k} r_ij from the
    per-turn rewards, mean_g and std_g over the episode totals G_0 of i's group (std
    per std_scope; centred only without norm_by_std). A turn is credited with what
    came at or after it (a search's cost reaches that search and the turns before it,
    not the answer after it), measured against one baseline per task, so unlike `turn`
    no turn position is compared with another episode's turn at that position. With
    every reward at the last turn and γ = 1 (one turn, say) it is `grpo`.
    Groups whose totals all tie get 0, as in `grpo`. Returns = G_ik on turn k's tokens.
    """
    _check(inp, "togo", "turn_ids", "turn_rewards", "turn_mask")
    turn_rewards = _per_turn_rewards(inp)
    valid = inp.turn_mask.bool() & torch.isfinite(turn_rewards.sum(1, keepdim=True))
    returns = discounted_turn_returns(torch.where(valid, turn_rewards, 0.0), valid, cfg.gamma)
    groups = group_index(inp.group_ids).to(returns.device)
    totals, first = returns[:, :1], valid[:, :1]
    stats = {name: s[groups] for name, s in group_stats(totals, first, groups).items()}
    keep = valid & first & (stats["count"] >= 2) & (stats["spread"] > 0)
    centered = returns - stats["mean"]
    if cfg.norm_by_std:
        _check_std_scope(cfg.std_scope)
        std = stats["std"] if cfg.std_scope == "group" else _column_std(totals - stats["mean"],
                                                                         first & (stats["count"] >= 2))
        centered = centered / (std + cfg.eps)
    dtype = _out_dtype(inp)
    return (_turns_to_tokens(torch.where(keep, centered, 0.0), inp.turn_ids, inp.loss_mask).to(dtype),
            _turns_to_tokens(returns, inp.turn_ids, inp.loss_mask).to(dtype))


def _per_turn_rewards(inp: AdvantageInput) -> torch.Tensor:
    """[B, K] float64: the per-turn rewards plus the token rewards of each turn."""
    turn_rewards = inp.turn_rewards.double()
    if inp.token_rewards is None:
        return turn_rewards
    per_turn = _tokens_to_turns(inp.token_rewards, inp.turn_ids, inp.loss_mask, turn_rewards.shape[1])
    return turn_rewards + per_turn


def _tokens_to_turns(token_values: torch.Tensor, turn_ids: torch.Tensor, loss_mask: torch.Tensor,
                     n_turns: int) -> torch.Tensor:
    """[B, T] → [B, K]: sum of the policy-token values of each turn."""
    keep = loss_mask.bool() & (turn_ids >= 0) & (turn_ids < n_turns)
    out = torch.zeros(turn_ids.shape[0], n_turns, dtype=torch.float64, device=token_values.device)
    src = torch.where(keep, token_values.double(), 0.0)
    return out.scatter_add(1, turn_ids.long().clamp(0, max(n_turns - 1, 0)), src)


def compute_advantages(
    name: str, inp: AdvantageInput, cfg: AdvantageConfig | None = None, state: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered as `name`: (advantages [B, T], returns [B, T]).

    Pass the same `state` dict every step (and save it with the checkpoint) for
    estimators that keep statistics across steps.
    """
    return ADVANTAGES.get(name)(inp, cfg or AdvantageConfig(), {} if state is None else state)
