"""A fingerprint of a model's base weights, so an adapter is never loaded onto a base
other than the one it was trained on (personal/store.py refuses it by this hash).

The hash covers every base parameter's name, shape, dtype and bytes. LoRA weights
are left out and PEFT's wrapping is undone in the names (`base_model.model.` and
`.base_layer`), so the same base hashes alike bare, wrapped in PEFT, or carrying any
number of adapters. Adapters merged into the weights change them, and so the hash:
a merged model is another base.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

# Parameter-name pieces of PEFT's adapter weights (LoRA, DoRA's magnitude, embeddings).
_ADAPTER_MARKERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
_CHUNK_BYTES = 1 << 24  # hash big tensors a slice at a time: no second full copy in memory


def base_parameter_name(name: str) -> str:
    """`name` as the bare model calls it (PEFT's wrapper prefix and `.base_layer` removed)."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def is_adapter_parameter(name: str) -> bool:
    return any(f".{marker}." in f".{name}." for marker in _ADAPTER_MARKERS)


def base_model_hash(model: Any) -> str:
    """sha256 (hex) over the base parameters of `model` (see module docstring). Tied
    weights count once (named_parameters drops the duplicate)."""
    digest = hashlib.sha256()
    named = {
        base_parameter_name(name): param
        for name, param in model.named_parameters()
        if not is_adapter_parameter(name)
    }
    for name in sorted(named):
        tensor = named[name].detach()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
        flat = tensor.reshape(-1)
        step = max(1, _CHUNK_BYTES // max(1, tensor.element_size()))
        for start in range(0, flat.numel(), step):
            # viewed as bytes, so bfloat16 (which numpy lacks) hashes like any dtype
            piece = flat[start : start + step].cpu().contiguous().view(torch.uint8)
            digest.update(piece.numpy())
    return digest.hexdigest()

