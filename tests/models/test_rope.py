"""RoPE scaling: each method's inverse frequencies, worked out here from the published
formulas, against what the tiny model gets once model.rope_scaling is applied."""

from __future__ import annotations

import math

import pytest
import torch

from ponder.config import ConfigError, RopeScalingConfig, load_recipe
from ponder.models.loading import load_policy
from ponder.rollout.llama_decode import lean_decoder

BASE, DIM, TRAINED = 10000.0, 16, 4096  # the tiny model: rope_theta, head_dim, max_position_embeddings


def reference() -> torch.Tensor:
    """θᵢ = base^(−2i/d), i = 0 … d/2 − 1 (Su et al., RoFormer)."""
    return torch.tensor([BASE ** (-2 * i / DIM) for i in range(DIM // 2)])


def rotary(policy):
    return policy.model.model.rotary_emb


def scaled(kind: str, factor: float, **extra):
    return load_policy("tiny", rope_scaling=RopeScalingConfig(type=kind, factor=factor, **extra))


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn"])
def test_scale_one_reproduces_the_reference_frequencies(kind):
    assert torch.allclose(rotary(load_policy("tiny")).inv_freq, reference())
    policy = scaled(kind, 1.0)
    assert torch.allclose(rotary(policy).inv_freq, reference(), rtol=1e-6)
    assert rotary(policy).attention_scaling == pytest.approx(1.0)


def test_linear_interpolation_divides_the_positions_by_the_factor():
    # Position interpolation: m·θ becomes (m/s)·θ, i.e. θ/s.
    assert torch.allclose(rotary(scaled("linear", 4.0)).inv_freq, reference() / 4.0, rtol=1e-6)


def test_dynamic_ntk_raises_the_base_only_beyond_the_trained_length():
    policy = scaled("dynamic", 2.0, original_max_position_embeddings=64)
    assert torch.allclose(rotary(policy).inv_freq, reference(), rtol=1e-6)  # L ≤ L₀: unchanged
    length = 256
    policy.model(torch.randint(3, 100, (1, length)))  # transformers updates the frequencies on the fly
    # NTK-aware base' = base·α^(d/(d−2)) with α = s·L/L₀ − (s − 1) = 2·4 − 1 = 7.
    alpha = 2.0 * length / 64 - 1.0
    base = BASE * alpha ** (DIM / (DIM - 2))
    expected = torch.tensor([base ** (-2 * i / DIM) for i in range(DIM // 2)])
    assert torch.allclose(rotary(policy).inv_freq, expected, rtol=1e-5)


def test_yarn_ramps_between_extrapolation_and_interpolation_with_its_temperature():
    factor = 8.0
    policy = scaled("yarn", factor)
    # YaRN (Peng et al. 2023): dimension i rotates L₀·θᵢ/2π times over the trained length;
    # dimensions with more than beta_fast = 32 rotations keep θᵢ (extrapolation), those with
    # fewer than beta_slow = 1 get θᵢ/s (interpolation), a linear ramp over the dimension
    # index in between; the bounds are d·ln(L₀/(2π·β))/(2·ln base), floored / ceiled.
    def bound(rotations: float) -> float:
        return DIM * math.log(TRAINED / (rotations * 2 * math.pi)) / (2 * math.log(BASE))

    low, high = max(math.floor(bound(32)), 0), min(math.ceil(bound(1)), DIM - 1)
    assert (low, high) == (2, 6)
    theta = reference()
    ramp = torch.tensor([min(max((i - low) / (high - low), 0.0), 1.0) for i in range(DIM // 2)])
    expected = theta * (1 - ramp) + theta / factor * ramp
    got = rotary(policy).inv_freq
    assert torch.allclose(got, expected, rtol=1e-6)
    assert torch.allclose(got[:3], theta[:3]) and torch.allclose(got[6:], theta[6:] / factor)
    assert rotary(policy).attention_scaling == pytest.approx(0.1 * math.log(factor) + 1.0)


def test_a_scaled_model_decodes_with_transformers_not_the_lean_decoder():
    plain, policy = load_policy("tiny"), scaled("linear", 2.0)
    assert lean_decoder(plain.model) is not None and lean_decoder(policy.model) is None
    ids = torch.randint(3, 100, (1, 12))
    a, b = plain.model(ids).logits, policy.model(ids).logits
    assert b.isfinite().all() and torch.allclose(a[:, 0], b[:, 0], atol=1e-5)  # position 0 does not rotate
    assert not torch.allclose(a[:, -1], b[:, -1], atol=1e-4)


def test_the_recipe_types_rope_scaling():
    recipe = load_recipe(None, ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=4"])
    assert recipe.model.rope_scaling == RopeScalingConfig(type="yarn", factor=4.0)
    with pytest.raises(ConfigError, match="rope_scaling.type must be none, linear, dynamic or yarn"):
        load_recipe(None, ["model.rope_scaling.type=ntk"])
    with pytest.raises(ConfigError, match="factor must be >= 1"):
        load_recipe(None, ["model.rope_scaling.type=linear", "model.rope_scaling.factor=0.5"])
