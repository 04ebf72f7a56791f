"""The generation backend a recipe asks for (rollout.backend), for a loaded policy."""

from __future__ import annotations

from typing import Any

from ponder.config import Recipe, SamplingConfig
from ponder.models import Policy
from ponder.rollout.hf import HFBackend

BACKENDS = ("hf", "vllm")


def build_backend(policy: Policy, recipe: Recipe, sampling: SamplingConfig | None = None, seed: int | None = None) -> Any:
    """The generation backend for `policy`, by rollout.backend: `hf` (ponder's CPU
    decoder or transformers) or `vllm` (a vLLM server; rollout/vllm.py)."""
    sampling = sampling or recipe.rollout.sampling
    seed = recipe.train.seed if seed is None else seed
    kind = recipe.rollout.backend
    if kind == "vllm":
        from ponder.rollout.vllm import VLLMBackend

        return VLLMBackend(policy, recipe.rollout, sampling, seed=seed)
    if kind != "hf":
        raise ValueError(f"rollout.backend: unknown '{kind}'; valid: {', '.join(BACKENDS)}")
    return HFBackend(policy, sampling, seed=seed)
