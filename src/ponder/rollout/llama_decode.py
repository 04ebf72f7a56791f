"""A lean forward pass for Llama-family decoders (Llama, Qwen2), for sampling on the CPU.

Why: on the 2-core CPU a decode step of SmolLM2-135M at batch 8 took ~60 ms through
transformers' forward, against the ~18 ms it takes to read the fp32 weights once at
the measured bandwidth. Two thirds of it were matrix products with 1–32 rows, which
MKL's sgemm streams at ~40 % of the bandwidth for the MLP's wide matrices and the
49k-row vocabulary head. This module:

- holds each layer's weights fused (q|k|v in one matrix, gate|up in one) with LoRA
  merged, so one product replaces three and one replaces two;
- stores a matrix in oneDNN's blocked layout (`torch.ops.mkldnn`, the format
  torch.compile's CPU backend packs linear weights into) where that measures faster
  than `cpu_matmul.linear` on this CPU: on an Intel Xeon 1.8× on gate|up and 2.3× on
  the vocabulary head at batch 8, and slower on the square ones; on an AMD EPYC
  2.7-5.5× on every matrix (`bench/decode_kernels.py`, docs/results/benchmarks.md);
- runs one plain loop over the layers (RMSNorm, rotary, SDPA with grouped KV heads)
  on the backend's `SlabCache`, with none of the generic model's mask building.

It reads and writes the same cache layout as transformers (keys after rotary, half
split), so cached rows are interchangeable, and `tests/rollout/test_llama_decode.py`
checks its logits against the transformers model's. Models it does not cover
(another architecture, rope scaling, sliding windows, a device other than the CPU or
a CUDA GPU) get None from `lean_decoder` and the backend samples through
transformers. On a GPU the same layers run on plain `F.linear` (nothing is packed)
and `rollout.graph_decode` replays its decode steps from a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ponder.models import cpu_matmul
from ponder.models.adapters import effective_weight

_ARCHITECTURES = {"llama", "qwen2"}


@dataclass
class DecoderOutput:
    logits: torch.Tensor


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: _Linear
    o: _Linear
    post_norm: torch.Tensor
    gate_up: _Linear
    down: _Linear


def lean_decoder(model: Any, matmul_dtype: torch.dtype | None = None, pack: bool = True) -> LlamaDecoder | None:
    """A LlamaDecoder holding the model's current weights (LoRA merged), its matrix
    products in `matmul_dtype` (default: the model's dtype), or None when the model is
    not one it covers. `pack=False` keeps every matrix plain (what
    `rollout.graph_decode`'s steps take). Call again after the weights change."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if not _covered(config) or base.device.type not in ("cpu", "cuda"):
        return None
    with torch.no_grad():
        return LlamaDecoder(base, config, matmul_dtype, pack)


def _covered(config: Any) -> bool:
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    return (
        config.model_type in _ARCHITECTURES
        and getattr(config, "hidden_act", "silu") == "silu"
        and rope.get("rope_type", "default") == "default"
        and not getattr(config, "mlp_bias", False)
        and not (getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None))
    )


class LlamaDecoder:
    """Callable like a transformers causal LM on the arguments the `hf` backend
    passes: input_ids [B, T], attention_mask [B, S] over the cache's S slots after
    this call, position_ids [B, T], past_key_values (a SlabCache), logits_to_keep.

    `matmul_dtype` bfloat16 on a float32 model (a CPU with bf16 instructions: AVX-512
    BF16, AMX) stores the matrices in bf16 and rounds each product's input and output
    to it; norms, rotary, attention and the cache stay float32 (the CPU's bf16
    attention kernel measured 2.5x slower than its fp32 one at decode shapes). The
    matrix products run 1.5-2x faster, a decode step ~1.4x (bench/vllm_vs_ponder.py
    --ponder-dtypes, docs/results/benchmarks.md); the sampler's log-probs then differ from the
    trainer's by ~0.03 (`rollout.sampling.dtype`)."""

    def __init__(self, model: Any, config: Any, matmul_dtype: torch.dtype | None = None, pack: bool = True) -> None:
        self.config = config
        self.matmul_dtype = matmul_dtype
        self.pack = pack
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", getattr(config, "rope_theta", 10000.0))
        self.embed = model.model.embed_tokens.weight.detach()
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=self.embed.device) / self.head_dim
        self.inv_freq = 1.0 / theta**exponents
        self.final_norm = model.model.norm.weight.detach()
        self.head = self._linear(effective_weight(model.lm_head), None)
        self.layers = [self._layer(block) for block in model.model.layers]

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> _Linear:
        if self.matmul_dtype is None or self.matmul_dtype == weight.dtype:
            return _Linear(weight, bias, self.pack)
        return _Linear(weight.to(self.matmul_dtype), None if bias is None else bias.to(self.matmul_dtype), self.pack)

    def _layer(self, block: Any) -> _Layer:
        attn, mlp = block.self_attn, block.mlp
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        has_bias = any(_bias(p) is not None for p in projections)
        qkv_bias = torch.cat([_bias_or_zeros(p) for p in projections]) if has_bias else None
        return _Layer(
            input_norm=block.input_layernorm.weight.detach(),
            qkv=self._linear(torch.cat([effective_weight(p) for p in projections]), qkv_bias),
            o=self._linear(effective_weight(attn.o_proj), _bias(attn.o_proj)),
            post_norm=block.post_attention_layernorm.weight.detach(),
            gate_up=self._linear(torch.cat([effective_weight(p) for p in (mlp.gate_proj, mlp.up_proj)]), None),
            down=self._linear(effective_weight(mlp.down_proj), None),
        )

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool = True,
        logits_to_keep: int = 0,
    ) -> DecoderOutput:
        hidden = self.embed[input_ids]
        cos, sin = self.rotary(position_ids)
        mask = attention_slots(attention_mask, input_ids.shape[1])
        for layer, cache in zip(self.layers, past_key_values.layers, strict=True):

            def attend(q, k, v, cache=cache):
                keys, values = cache.update(k, v)
                return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

            hidden = self.block(layer, hidden, cos, sin, attend)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return DecoderOutput(self.logits(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(F.rms_norm(hidden, hidden.shape[-1:], self.final_norm, self.eps))

    def block(self, layer: _Layer, hidden: torch.Tensor, cos, sin, attend: Any) -> torch.Tensor:
        """One decoder layer on hidden [B, T, H]; `attend(q, k, v)` stores the new keys
        and values (after rotary) and returns the attention output [B, heads, T, head_dim]."""
        rows, length, _ = hidden.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = layer.qkv(F.rms_norm(hidden, hidden.shape[-1:], layer.input_norm, self.eps))
        heads = qkv.view(rows, length, h + 2 * kv, d).transpose(1, 2)
        q, k = rotate(heads[:, : h + kv], cos, sin).split([h, kv], dim=1)  # q and k rotated in one pass
        attended = attend(q, k, heads[:, h + kv :])
        hidden = hidden + layer.o(attended.transpose(1, 2).reshape(rows, length, h * d))
        gate, up = layer.gate_up(F.rms_norm(hidden, hidden.shape[-1:], layer.post_norm, self.eps)).chunk(2, dim=-1)
        return hidden + layer.down(F.silu(gate) * up)

    def rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary(position_ids, self.inv_freq, self.embed.dtype)


def rotary(position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [B, 1, T, head_dim] of each token's rotary angles (the sin of
    the first half negated, see `rotate`), computed in float32 and stored in `dtype`,
    the weights' (as transformers does)."""
    angles = position_ids.unsqueeze(-1).float() * inv_freq
    signed = torch.cat([-angles.sin(), angles.sin()], dim=-1).unsqueeze(1)
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), signed.to(dtype)


def attention_slots(attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Which cache slots each new token attends to, [B, 1, T, S] bool, from the slot
    mask [B, S] (1 = a real token) when the T new tokens fill the last T slots:
    real slots up to and including its own. Every token also sees its own slot, so a
    padding token's attention is never empty (an empty softmax row is NaN, and its
    NaN keys would poison every row's product with the values)."""
    slots = attention_mask.shape[1]
    own = torch.arange(slots - new_tokens, slots, device=attention_mask.device).unsqueeze(-1)
    index = torch.arange(slots, device=attention_mask.device)
    visible = (attention_mask.bool().unsqueeze(1) & (index <= own)) | (index == own)
    return visible.unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' half-split layout, x * cos + rotate_half(x) * sin:
    rotate_half(x) = [-x2, x1] is x rolled by half a head times the signs that
    `signed_sin` carries (three kernels on a GPU instead of five)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def _bias(module: Any) -> torch.Tensor | None:
    bias = getattr(getattr(module, "base_layer", module), "bias", None)
    return None if bias is None else bias.detach()


def _bias_or_zeros(module: Any) -> torch.Tensor:
    base = getattr(module, "base_layer", module)
    return base.bias.detach() if base.bias is not None else base.weight.new_zeros(base.weight.shape[0])


class _Linear:
    """x -> x @ weightᵀ + bias; the weight in oneDNN's blocked layout where that measured
    faster on this CPU for its shape (cpu_matmul.packing_wins): on the Intel Xeons
    measured earlier only the wide ones (gate|up, the vocabulary head), on an AMD EPYC
    every matrix (docs/results/benchmarks.md)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool = True) -> None:
        self.bias = bias
        self.dtype = weight.dtype  # the input is rounded to it, the output returned in the input's
        if not pack:
            self.packed, self.weight = False, weight
            return
        if cpu_matmul.bf16_packable(weight):  # bf16 on the CPU: oneDNN's bf16 kernels, always packed
            self.packed, self.weight = True, cpu_matmul.pack(weight)
            return
        can_pack = cpu_matmul.onednn_usable(weight) and cpu_matmul.kernel_choice() != "blas"
        packed = cpu_matmul.pack(weight) if can_pack else None
        self.packed = packed is not None and cpu_matmul.packing_wins(weight, packed)
        self.weight = packed if self.packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            return self(x.to(self.dtype)).to(x.dtype)
        if self.packed:
            return cpu_matmul.onednn_linear(x, self.weight, self.bias)
        return cpu_matmul.linear(x, self.weight, self.bias)
