"""Reward functions `(trajectory, task) -> float | None` and their weighted composite."""

from ponder.rewards.composite import (
    REWARDS,
    CompositeReward,
    PartReward,
    RewardError,
    RewardFn,
    register_reward,
    score_trajectories,
)
from ponder.rewards.format import action_follows_protocol, action_kind, format_compliance
from ponder.rewards.qa import exact_match, exact_match_score, f1_score, normalize_answer, token_f1
from ponder.rewards.search import search_calls

__all__ = [
    "REWARDS",
    "CompositeReward",
    "PartReward",
    "RewardError",
    "RewardFn",
    "action_follows_protocol",
    "action_kind",
    "exact_match",
    "exact_match_score",
    "f1_score",
    "format_compliance",
    "normalize_answer",
    "register_reward",
    "score_trajectories",
    "search_calls",
    "token_f1",
]
