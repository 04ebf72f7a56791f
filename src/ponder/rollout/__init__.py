"""Batched multi-turn rollouts and generation backends."""

from ponder.rollout.backend import Generation, GenerationBackend, GenerationRequest, sample_tokens
from ponder.rollout.engine import Env, RolloutEngine, RolloutStats, build_engine
from ponder.rollout.hf import HFBackend
from ponder.rollout.scripted import ScriptedBackend

__all__ = [
    "Env",
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "HFBackend",
    "RolloutEngine",
    "build_engine",
    "RolloutStats",
    "ScriptedBackend",
    "sample_tokens",
]
