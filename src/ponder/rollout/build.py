"""The generation backend a recipe asks for (rollout.backend), for a loaded policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ponder.config import Recipe, SamplingConfig
from ponder.models import Policy
from ponder.registry import Registry
from ponder.rollout.hf import HFBackend

#: rollout.backend -> builder(policy, recipe, sampling, seed) -> backend
BACKENDS: Registry[Callable[[Policy, Recipe, SamplingConfig, int], Any]] = Registry("generation backend")


def build_backend(policy: Policy, recipe: Recipe, sampling: SamplingConfig | None = None, seed: int | None = None) -> Any:
    """The generation backend for `policy`, by rollout.backend: `hf` (ponder's CPU
    decoder or transformers) or `vllm` (a vLLM server; rollout/vllm.py)."""
    sampling = sampling or recipe.rollout.sampling
    seed = recipe.train.seed if seed is None else seed
    return BACKENDS.get(recipe.rollout.backend, "rollout.backend")(policy, recipe, sampling, seed)


@BACKENDS.register("hf")
def _hf(policy: Policy, recipe: Recipe, sampling: SamplingConfig, seed: int) -> Any:
    return HFBackend(policy, sampling, seed=seed)


@BACKENDS.register("vllm")
def _vllm(policy: Policy, recipe: Recipe, sampling: SamplingConfig, seed: int) -> Any:
    from ponder.rollout.vllm import VLLMBackend

    return VLLMBackend(policy, recipe.rollout, sampling, seed=seed)
