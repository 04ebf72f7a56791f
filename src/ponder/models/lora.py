"""LoRA adapters through PEFT (their linears fused: see models/lora_fused.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ponder.config import LoraConfig
from ponder.models.loading import Policy


def apply_lora(policy: Policy, config: LoraConfig | None = None) -> Policy:
    """Wrap the policy's model with fresh LoRA adapters; only adapter weights train.

    The base weights stay frozen, so the reference policy is the same module with
    adapters disabled (see models.logprobs.reference_logprobs). With
    `last_n_layers`, only the top layers get adapters, so backward stops early.
    """
    from peft import get_peft_model

    from ponder.models.cpu_matmul import matmul_dtype
    from ponder.models.lora_fused import fuse_lora_linears

    config = config or LoraConfig()
    peft_config = peft_lora_config(policy, config)
    base_dtype = matmul_dtype(config.base_matmul_dtype, "lora.base_matmul_dtype", policy.dtype, policy.device)
    model: Any = get_peft_model(policy.model, peft_config)
    fuse_lora_linears(model, base_dtype)
    return replace(policy, model=model)


def peft_lora_config(policy: Policy, config: LoraConfig) -> Any:
    """PEFT's LoraConfig for ponder's `lora` section on `policy`'s model."""
    from peft import LoraConfig as PeftLoraConfig

    layers = None
    if config.last_n_layers > 0:
        total = policy.model.config.num_hidden_layers
        layers = list(range(max(0, total - config.last_n_layers), total))
    target = config.target_modules
    if layers is not None and target == "all-linear":
        # PEFT's layer selection needs explicit module names; these are every linear
        # layer of a Llama-style block (the lm_head is never adapted).
        target = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return PeftLoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=target,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def trainable_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total

