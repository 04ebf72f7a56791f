"""Policy preparation: load the recipe's policy and make its trainable part (fresh
LoRA adapters or every weight) with the model section's memory settings. Every
trainer and flow that starts from a recipe calls `prepare_policy`."""

from __future__ import annotations

from typing import Any

import torch

from ponder.config import ModelConfig, Recipe
from ponder.models import Policy, apply_lora, load_policy
from ponder.models.loading import enable_activation_offload, enable_gradient_checkpointing


def prepare_policy(recipe: Recipe, policy: Policy | None = None) -> Policy:
    """Load the policy and make its trainable part: LoRA adapters (initialised from
    train.seed, so two runs of a recipe start from the same weights), or every weight."""
    policy = policy or load_policy(
        recipe.model.name, recipe.model.dtype, recipe.model.device, recipe.model.rope_scaling
    )
    if hasattr(policy.model, "peft_config"):  # already adapted (e.g. by the SFT warm-up)
        return with_memory_settings(policy, recipe.model)
    if not recipe.lora.enabled and recipe.algo.kl_coef > 0:
        raise ValueError("full fine-tuning keeps no reference copy: set algo.kl_coef=0 or lora.enabled=true")
    torch.manual_seed(recipe.train.seed)
    return fresh_trainable(policy, recipe)


def fresh_trainable(policy: Policy, recipe: Any) -> Policy:
    """Fresh LoRA adapters on `policy`, or every weight trainable when LoRA is off,
    with the recipe's memory settings (`with_memory_settings`)."""
    if recipe.lora.enabled:
        policy = apply_lora(policy, recipe.lora)
    else:
        for parameter in policy.model.parameters():
            parameter.requires_grad_(True)
    return with_memory_settings(policy, recipe.model)


def with_memory_settings(policy: Policy, model: ModelConfig) -> Policy:
    """Gradient checkpointing and activation offload, when the model section asks."""
    if model.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    if model.activation_offload:
        enable_activation_offload(policy)
    return policy
