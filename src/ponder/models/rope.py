"""RoPE scaling (longer context than the model was trained on), set in the recipe.

`model.rope_scaling: {type: linear|dynamic|yarn, factor: F}` rewrites the loaded
model's rotary embedding with transformers' own implementation of that method
(`rope_parameters` / `rope_type` in transformers 5):

- linear (position interpolation, Chen et al. 2023): positions divided by F, i.e.
  every inverse frequency divided by F;
- dynamic (dynamic NTK-aware scaling): at a sequence of length L beyond the trained
  length L₀ the base becomes base·(F·L/L₀ − (F−1))^(d/(d−2)); at L ≤ L₀ the model is
  unchanged;
- yarn (Peng et al. 2023): per frequency, a ramp between interpolation (low
  frequencies, divided by F) and extrapolation (high frequencies, unchanged) set by
  beta_fast / beta_slow, and cos/sin scaled by the attention temperature
  0.1·ln(F) + 1.

The trained length L₀ is the model config's max_position_embeddings unless
original_max_position_embeddings says otherwise. ponder's lean CPU decoder covers
only default RoPE, so a scaled model decodes with the transformers model.
"""

from __future__ import annotations

from typing import Any

ROPE_TYPES = ("none", "linear", "dynamic", "yarn")


def rope_parameters(scaling: Any, model_config: Any) -> dict[str, Any] | None:
    """The transformers `rope_parameters` dict for a recipe's RopeScalingConfig, or None
    when scaling is off (type none)."""
    if scaling is None or scaling.type == "none":
        return None
    if scaling.type not in ROPE_TYPES:
        raise ValueError(f"model.rope_scaling.type must be one of {', '.join(ROPE_TYPES)}, got {scaling.type!r}")
    if scaling.factor < 1:
        raise ValueError(f"model.rope_scaling.factor must be >= 1, got {scaling.factor}")
    current = dict(getattr(model_config, "rope_parameters", None) or {})
    theta = current.get("rope_theta", getattr(model_config, "rope_theta", 10000.0))
    params: dict[str, Any] = {"rope_type": scaling.type, "rope_theta": theta, "factor": float(scaling.factor)}
    if "partial_rotary_factor" in current:
        params["partial_rotary_factor"] = current["partial_rotary_factor"]
    if scaling.type == "yarn":
        params["original_max_position_embeddings"] = (
            scaling.original_max_position_embeddings or model_config.max_position_embeddings
        )
        params.update({k: v for k, v in (("beta_fast", scaling.beta_fast), ("beta_slow", scaling.beta_slow)) if v})
    return params


def apply_rope_scaling(model: Any, scaling: Any) -> bool:
    """Set `scaling` on a loaded model: its config's rope_parameters and every rotary
    embedding rebuilt from them (they compute their frequencies at construction).
    False (model untouched) when scaling is off."""
    config = model.config
    params = rope_parameters(scaling, config)
    if params is None:
        return False
    if scaling.type == "dynamic" and scaling.original_max_position_embeddings:
        # transformers' dynamic NTK takes the trained length from max_position_embeddings.
        config.max_position_embeddings = scaling.original_max_position_embeddings
    config.rope_parameters = params
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "inv_freq"):
                fresh = type(child)(config=child.config if hasattr(child, "config") else config)
                setattr(parent, name, fresh.to(child.inv_freq.device))
                swapped += 1
    if not swapped:
        raise ValueError(f"model.rope_scaling: {type(model).__name__} has no rotary embedding to scale")
    return True
