"""RL math as pure functions over tensors with masks, registered by name.

Imports only torch, ponder.types and the leaf ponder.registry. Trainers look estimators, losses and
aggregations up by the names in their config and never branch on them.
"""

from ponder.algos.advantages import (
    ADVANTAGES,
    STD_SCOPES,
    AdvantageConfig,
    AdvantageInput,
    compute_advantages,
    discounted_turn_returns,
    generalized_advantage_estimate,
    group_index,
    group_normalize,
    last_token_rewards,
)
from ponder.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    kl_penalty_rewards,
)
from ponder.algos.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    Aggregation,
    LossConfig,
    aggregate,
    aggregation_denominator,
    demonstration_nll,
    entropy_bonus,
    policy_loss,
    sampler_mismatch,
    tis_weights,
    value_loss,
    weighted_nll,
)
from ponder.algos.utils import masked_mean, masked_sum, masked_var, masked_whiten
from ponder.registry import Registry

__all__ = [
    "STD_SCOPES",
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageInput",
    "Aggregation",
    "FixedKLController",
    "LossConfig",
    "Registry",
    "aggregate",
    "aggregation_denominator",
    "demonstration_nll",
    "compute_advantages",
    "discounted_turn_returns",
    "entropy_bonus",
    "generalized_advantage_estimate",
    "group_index",
    "group_normalize",
    "kl_estimate",
    "kl_penalty_rewards",
    "last_token_rewards",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "sampler_mismatch",
    "tis_weights",
    "value_loss",
    "weighted_nll",
]
