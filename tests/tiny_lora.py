"""A LoRA adapter on the tiny random model with random non-zero B matrices, so each
seed changes the model's output in its own way (a fresh LoRA's B is zero)."""

from __future__ import annotations

import torch

from ponder.config import LoraConfig
from ponder.models import Policy, apply_lora, tiny_policy


def random_lora(seed: int, scale: float = 0.3) -> Policy:
    torch.manual_seed(seed)  # PEFT draws the A matrices from the global generator
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    return policy
