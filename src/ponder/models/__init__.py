"""Policies: loading, the tiny test model, LoRA, logprob helpers."""

from ponder.models.loading import EMBEDDED_NAME, ModelLoadError, Policy, cache_dir, load_policy
from ponder.models.logprobs import (
    adapters_disabled,
    entropy_from_logits,
    logprobs_and_entropy,
    logprobs_from_logits,
    reference_logprobs,
    token_logprobs,
    trainable_snapshot,
    weights_swapped,
)
from ponder.models.lora import apply_lora, trainable_parameters
from ponder.models.tiny import tiny_policy, tiny_tokenizer

__all__ = [
    "EMBEDDED_NAME",
    "ModelLoadError",
    "Policy",
    "adapters_disabled",
    "apply_lora",
    "cache_dir",
    "entropy_from_logits",
    "load_policy",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "reference_logprobs",
    "tiny_policy",
    "tiny_tokenizer",
    "token_logprobs",
    "trainable_parameters",
    "trainable_snapshot",
    "weights_swapped",
]
